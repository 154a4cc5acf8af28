from ferryman._proto.envoy.service.discovery.v3 import discovery_pb2 as _discovery_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
