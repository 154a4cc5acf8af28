"""The transport every API shares: the gRPC edge (counting, deadlines, tracing and the one
table of error statuses), the guard for undecodable requests, the HTTP server, and TLS."""
