import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Entry(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class RateRequest(_message.Message):
    __slots__ = ("domain", "descriptor", "copies", "min_copies")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    MIN_COPIES_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptor: _containers.RepeatedCompositeFieldContainer[Entry]
    copies: int
    min_copies: int
    def __init__(self, domain: _Optional[str] = ..., descriptor: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., copies: _Optional[int] = ..., min_copies: _Optional[int] = ...) -> None: ...

class RateResponse(_message.Message):
    __slots__ = ("granted", "hard_limit", "global_limit", "active_tier_index", "active_tier_limit", "active_tier_hits", "active_tier_window", "tenant_hits_last_second", "global_hits_last_second", "burst", "limited_by_hard_limit", "limited_by_global_limit", "retry_after")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    HARD_LIMIT_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_LIMIT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_TIER_INDEX_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_TIER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_TIER_HITS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_TIER_WINDOW_FIELD_NUMBER: _ClassVar[int]
    TENANT_HITS_LAST_SECOND_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_HITS_LAST_SECOND_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    LIMITED_BY_HARD_LIMIT_FIELD_NUMBER: _ClassVar[int]
    LIMITED_BY_GLOBAL_LIMIT_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    granted: int
    hard_limit: int
    global_limit: int
    active_tier_index: int
    active_tier_limit: int
    active_tier_hits: int
    active_tier_window: _duration_pb2.Duration
    tenant_hits_last_second: int
    global_hits_last_second: int
    burst: bool
    limited_by_hard_limit: bool
    limited_by_global_limit: bool
    retry_after: _duration_pb2.Duration
    def __init__(self, granted: _Optional[int] = ..., hard_limit: _Optional[int] = ..., global_limit: _Optional[int] = ..., active_tier_index: _Optional[int] = ..., active_tier_limit: _Optional[int] = ..., active_tier_hits: _Optional[int] = ..., active_tier_window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., tenant_hits_last_second: _Optional[int] = ..., global_hits_last_second: _Optional[int] = ..., burst: _Optional[bool] = ..., limited_by_hard_limit: _Optional[bool] = ..., limited_by_global_limit: _Optional[bool] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
