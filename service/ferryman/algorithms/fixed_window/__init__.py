"""Fixed windows (the reference's ``rate_limit``): counters per epoch-aligned window."""
