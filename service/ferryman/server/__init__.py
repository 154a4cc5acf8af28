"""One ferryman process: the wiring of its parts (``app``), its workers and its event loop."""
