"""Charon's burst tiers: stacked sliding windows with active and cooldown periods."""
