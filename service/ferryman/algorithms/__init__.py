"""The limiting algorithms, one package each: its model (pure decisions, time injected), its
memory store, its Redis store and Lua script, side by side behind a narrow store Protocol."""
