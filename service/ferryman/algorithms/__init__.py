"""Rate limit algorithms that own their state layout on every backend."""
