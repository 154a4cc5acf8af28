from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AllowRequest(_message.Message):
    __slots__ = ("namespace", "bucket_name", "tokens_requested", "max_wait_millis_override", "max_wait_time_override")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BUCKET_NAME_FIELD_NUMBER: _ClassVar[int]
    TOKENS_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MILLIS_OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_TIME_OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    bucket_name: str
    tokens_requested: int
    max_wait_millis_override: int
    max_wait_time_override: bool
    def __init__(self, namespace: _Optional[str] = ..., bucket_name: _Optional[str] = ..., tokens_requested: _Optional[int] = ..., max_wait_millis_override: _Optional[int] = ..., max_wait_time_override: _Optional[bool] = ...) -> None: ...

class AllowResponse(_message.Message):
    __slots__ = ("status", "tokens_granted", "wait_millis")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OK: _ClassVar[AllowResponse.Status]
        REJECTED_TIMEOUT: _ClassVar[AllowResponse.Status]
        REJECTED_NO_BUCKET: _ClassVar[AllowResponse.Status]
        REJECTED_TOO_MANY_BUCKETS: _ClassVar[AllowResponse.Status]
        REJECTED_TOO_MANY_TOKENS_REQUESTED: _ClassVar[AllowResponse.Status]
        REJECTED_INVALID_REQUEST: _ClassVar[AllowResponse.Status]
        REJECTED_SERVER_ERROR: _ClassVar[AllowResponse.Status]
    OK: AllowResponse.Status
    REJECTED_TIMEOUT: AllowResponse.Status
    REJECTED_NO_BUCKET: AllowResponse.Status
    REJECTED_TOO_MANY_BUCKETS: AllowResponse.Status
    REJECTED_TOO_MANY_TOKENS_REQUESTED: AllowResponse.Status
    REJECTED_INVALID_REQUEST: AllowResponse.Status
    REJECTED_SERVER_ERROR: AllowResponse.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GRANTED_FIELD_NUMBER: _ClassVar[int]
    WAIT_MILLIS_FIELD_NUMBER: _ClassVar[int]
    status: AllowResponse.Status
    tokens_granted: int
    wait_millis: int
    def __init__(self, status: _Optional[_Union[AllowResponse.Status, str]] = ..., tokens_granted: _Optional[int] = ..., wait_millis: _Optional[int] = ...) -> None: ...
