"""Connections to external stores, shared by every algorithm's store on them."""
