from envoy.service.discovery.v3 import discovery_pb2 as _discovery_pb2
from udpa.annotations import status_pb2 as _status_pb2
from udpa.annotations import versioning_pb2 as _versioning_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class AdsDummy(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
