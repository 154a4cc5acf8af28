# Written by hand (grpc_tools writes no stubs): the untyped shape of the generated module.
from typing import Any

class RateLimitServiceStub:
    def __init__(self, channel): ...
    ShouldRateLimit: Any

class RateLimitServiceServicer:
    def ShouldRateLimit(self, request, context): ...

def add_RateLimitServiceServicer_to_server(servicer, server): ...
