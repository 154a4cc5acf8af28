"""Decision algorithms that are not per-request counters: capacity leases (Doorman)."""
