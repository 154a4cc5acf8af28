"""gRPC and HTTP servers."""
