# Written by hand (grpc_tools writes no stubs): the untyped shape of the generated module.
from typing import Any

class RateLimitQuotaServiceStub:
    def __init__(self, channel): ...
    StreamRateLimitQuotas: Any

class RateLimitQuotaServiceServicer:
    def StreamRateLimitQuotas(self, request_iterator, context): ...

def add_RateLimitQuotaServiceServicer_to_server(servicer, server): ...
