"""Charon's held resources: a distributed counting semaphore per tenant, group and node."""
