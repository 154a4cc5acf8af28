import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionRequest(_message.Message):
    __slots__ = ("open", "ping")
    class Open(_message.Message):
        __slots__ = ("client_name",)
        CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
        client_name: str
        def __init__(self, client_name: _Optional[str] = ...) -> None: ...
    class Ping(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    OPEN_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    open: SessionRequest.Open
    ping: SessionRequest.Ping
    def __init__(self, open: _Optional[_Union[SessionRequest.Open, _Mapping]] = ..., ping: _Optional[_Union[SessionRequest.Ping, _Mapping]] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("opened", "pong", "closing")
    class Opened(_message.Message):
        __slots__ = ("session_id",)
        SESSION_ID_FIELD_NUMBER: _ClassVar[int]
        session_id: str
        def __init__(self, session_id: _Optional[str] = ...) -> None: ...
    class Pong(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Closing(_message.Message):
        __slots__ = ("reason",)
        REASON_FIELD_NUMBER: _ClassVar[int]
        reason: str
        def __init__(self, reason: _Optional[str] = ...) -> None: ...
    OPENED_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    CLOSING_FIELD_NUMBER: _ClassVar[int]
    opened: SessionEvent.Opened
    pong: SessionEvent.Pong
    closing: SessionEvent.Closing
    def __init__(self, opened: _Optional[_Union[SessionEvent.Opened, _Mapping]] = ..., pong: _Optional[_Union[SessionEvent.Pong, _Mapping]] = ..., closing: _Optional[_Union[SessionEvent.Closing, _Mapping]] = ...) -> None: ...

class Group(_message.Message):
    __slots__ = ("name", "limit", "held")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    name: str
    limit: int
    held: int
    def __init__(self, name: _Optional[str] = ..., limit: _Optional[int] = ..., held: _Optional[int] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("domain", "descriptor", "copies", "min_copies", "max_wait", "priority")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    MIN_COPIES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptor: _containers.RepeatedCompositeFieldContainer[Entry]
    copies: int
    min_copies: int
    max_wait: _duration_pb2.Duration
    priority: int
    def __init__(self, domain: _Optional[str] = ..., descriptor: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., copies: _Optional[int] = ..., min_copies: _Optional[int] = ..., max_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., priority: _Optional[int] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ("granted", "groups", "limit", "global_limit", "tenant_held", "global_held", "queued")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_LIMIT_FIELD_NUMBER: _ClassVar[int]
    TENANT_HELD_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_HELD_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    granted: int
    groups: _containers.RepeatedCompositeFieldContainer[Group]
    limit: int
    global_limit: int
    tenant_held: int
    global_held: int
    queued: bool
    def __init__(self, granted: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[Group, _Mapping]]] = ..., limit: _Optional[int] = ..., global_limit: _Optional[int] = ..., tenant_held: _Optional[int] = ..., global_held: _Optional[int] = ..., queued: _Optional[bool] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("domain", "descriptor", "copies", "groups")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptor: _containers.RepeatedCompositeFieldContainer[Entry]
    copies: int
    groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, domain: _Optional[str] = ..., descriptor: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., copies: _Optional[int] = ..., groups: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TransferRequest(_message.Message):
    __slots__ = ("domain", "descriptor", "copies", "groups", "ttl")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptor: _containers.RepeatedCompositeFieldContainer[Entry]
    copies: int
    groups: _containers.RepeatedScalarFieldContainer[str]
    ttl: _duration_pb2.Duration
    def __init__(self, domain: _Optional[str] = ..., descriptor: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., copies: _Optional[int] = ..., groups: _Optional[_Iterable[str]] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class TransferResponse(_message.Message):
    __slots__ = ("transfer_id",)
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    def __init__(self, transfer_id: _Optional[str] = ...) -> None: ...

class SeizeRequest(_message.Message):
    __slots__ = ("transfer_id",)
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    def __init__(self, transfer_id: _Optional[str] = ...) -> None: ...

class SeizeResponse(_message.Message):
    __slots__ = ("domain", "descriptor", "groups", "copies")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptor: _containers.RepeatedCompositeFieldContainer[Entry]
    groups: _containers.RepeatedScalarFieldContainer[str]
    copies: int
    def __init__(self, domain: _Optional[str] = ..., descriptor: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., groups: _Optional[_Iterable[str]] = ..., copies: _Optional[int] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class RateRequest(_message.Message):
    __slots__ = ("domain", "descriptor", "copies", "min_copies", "max_wait", "priority")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    MIN_COPIES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptor: _containers.RepeatedCompositeFieldContainer[Entry]
    copies: int
    min_copies: int
    max_wait: _duration_pb2.Duration
    priority: int
    def __init__(self, domain: _Optional[str] = ..., descriptor: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., copies: _Optional[int] = ..., min_copies: _Optional[int] = ..., max_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., priority: _Optional[int] = ...) -> None: ...

class RateResponse(_message.Message):
    __slots__ = ("granted", "hard_limit", "global_limit", "active_tier_index", "active_tier_limit", "active_tier_hits", "active_tier_window", "tenant_hits_last_second", "global_hits_last_second", "burst", "limited_by_hard_limit", "limited_by_global_limit", "retry_after", "wait", "tokens_remaining")
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
    WAIT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_REMAINING_FIELD_NUMBER: _ClassVar[int]
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
    wait: _duration_pb2.Duration
    tokens_remaining: int
    def __init__(self, granted: _Optional[int] = ..., hard_limit: _Optional[int] = ..., global_limit: _Optional[int] = ..., active_tier_index: _Optional[int] = ..., active_tier_limit: _Optional[int] = ..., active_tier_hits: _Optional[int] = ..., active_tier_window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., tenant_hits_last_second: _Optional[int] = ..., global_hits_last_second: _Optional[int] = ..., burst: _Optional[bool] = ..., limited_by_hard_limit: _Optional[bool] = ..., limited_by_global_limit: _Optional[bool] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., tokens_remaining: _Optional[int] = ...) -> None: ...

class WatchQuotaEventsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class QuotaEvent(_message.Message):
    __slots__ = ("kind", "namespace", "bucket", "dynamic", "tokens", "wait_millis", "dropped")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[QuotaEvent.Kind]
        TOKENS_SERVED: _ClassVar[QuotaEvent.Kind]
        TOKENS_SERVED_WITH_WAIT: _ClassVar[QuotaEvent.Kind]
        TIMEOUT: _ClassVar[QuotaEvent.Kind]
        TOO_MANY_TOKENS_REQUESTED: _ClassVar[QuotaEvent.Kind]
        BUCKET_MISS: _ClassVar[QuotaEvent.Kind]
        TOO_MANY_BUCKETS: _ClassVar[QuotaEvent.Kind]
        BUCKET_CREATED: _ClassVar[QuotaEvent.Kind]
        BUCKET_REMOVED: _ClassVar[QuotaEvent.Kind]
    KIND_UNSPECIFIED: QuotaEvent.Kind
    TOKENS_SERVED: QuotaEvent.Kind
    TOKENS_SERVED_WITH_WAIT: QuotaEvent.Kind
    TIMEOUT: QuotaEvent.Kind
    TOO_MANY_TOKENS_REQUESTED: QuotaEvent.Kind
    BUCKET_MISS: QuotaEvent.Kind
    TOO_MANY_BUCKETS: QuotaEvent.Kind
    BUCKET_CREATED: QuotaEvent.Kind
    BUCKET_REMOVED: QuotaEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MILLIS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    kind: QuotaEvent.Kind
    namespace: str
    bucket: str
    dynamic: bool
    tokens: int
    wait_millis: int
    dropped: int
    def __init__(self, kind: _Optional[_Union[QuotaEvent.Kind, str]] = ..., namespace: _Optional[str] = ..., bucket: _Optional[str] = ..., dynamic: _Optional[bool] = ..., tokens: _Optional[int] = ..., wait_millis: _Optional[int] = ..., dropped: _Optional[int] = ...) -> None: ...
