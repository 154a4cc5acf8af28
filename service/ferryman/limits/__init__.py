"""Rate limit decisions."""
