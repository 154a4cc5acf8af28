"""The protocols ferryman answers and the services that hold their state: holds, capacity
leases, token buckets, the config API, the console and the debug pages."""
