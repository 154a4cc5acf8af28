from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Lease(_message.Message):
    __slots__ = ("expiry_time", "refresh_interval", "capacity")
    EXPIRY_TIME_FIELD_NUMBER: _ClassVar[int]
    REFRESH_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    expiry_time: int
    refresh_interval: int
    capacity: float
    def __init__(self, expiry_time: _Optional[int] = ..., refresh_interval: _Optional[int] = ..., capacity: _Optional[float] = ...) -> None: ...

class ResourceRequest(_message.Message):
    __slots__ = ("resource_id", "priority", "has", "wants")
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    HAS_FIELD_NUMBER: _ClassVar[int]
    WANTS_FIELD_NUMBER: _ClassVar[int]
    resource_id: str
    priority: int
    has: Lease
    wants: float
    def __init__(self, resource_id: _Optional[str] = ..., priority: _Optional[int] = ..., has: _Optional[_Union[Lease, _Mapping]] = ..., wants: _Optional[float] = ...) -> None: ...

class GetCapacityRequest(_message.Message):
    __slots__ = ("client_id", "resource")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    resource: _containers.RepeatedCompositeFieldContainer[ResourceRequest]
    def __init__(self, client_id: _Optional[str] = ..., resource: _Optional[_Iterable[_Union[ResourceRequest, _Mapping]]] = ...) -> None: ...

class ResourceResponse(_message.Message):
    __slots__ = ("resource_id", "gets", "safe_capacity")
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    GETS_FIELD_NUMBER: _ClassVar[int]
    SAFE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    resource_id: str
    gets: Lease
    safe_capacity: float
    def __init__(self, resource_id: _Optional[str] = ..., gets: _Optional[_Union[Lease, _Mapping]] = ..., safe_capacity: _Optional[float] = ...) -> None: ...

class Mastership(_message.Message):
    __slots__ = ("master_address",)
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    master_address: str
    def __init__(self, master_address: _Optional[str] = ...) -> None: ...

class GetCapacityResponse(_message.Message):
    __slots__ = ("response", "mastership")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    MASTERSHIP_FIELD_NUMBER: _ClassVar[int]
    response: _containers.RepeatedCompositeFieldContainer[ResourceResponse]
    mastership: Mastership
    def __init__(self, response: _Optional[_Iterable[_Union[ResourceResponse, _Mapping]]] = ..., mastership: _Optional[_Union[Mastership, _Mapping]] = ...) -> None: ...

class PriorityBandAggregate(_message.Message):
    __slots__ = ("priority", "num_clients", "wants")
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    NUM_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    WANTS_FIELD_NUMBER: _ClassVar[int]
    priority: int
    num_clients: int
    wants: float
    def __init__(self, priority: _Optional[int] = ..., num_clients: _Optional[int] = ..., wants: _Optional[float] = ...) -> None: ...

class ServerCapacityResourceRequest(_message.Message):
    __slots__ = ("resource_id", "has", "wants")
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_FIELD_NUMBER: _ClassVar[int]
    WANTS_FIELD_NUMBER: _ClassVar[int]
    resource_id: str
    has: Lease
    wants: _containers.RepeatedCompositeFieldContainer[PriorityBandAggregate]
    def __init__(self, resource_id: _Optional[str] = ..., has: _Optional[_Union[Lease, _Mapping]] = ..., wants: _Optional[_Iterable[_Union[PriorityBandAggregate, _Mapping]]] = ...) -> None: ...

class GetServerCapacityRequest(_message.Message):
    __slots__ = ("server_id", "resource")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    resource: _containers.RepeatedCompositeFieldContainer[ServerCapacityResourceRequest]
    def __init__(self, server_id: _Optional[str] = ..., resource: _Optional[_Iterable[_Union[ServerCapacityResourceRequest, _Mapping]]] = ...) -> None: ...

class ServerCapacityResourceResponse(_message.Message):
    __slots__ = ("resource_id", "gets", "algorithm", "safe_capacity")
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    GETS_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    SAFE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    resource_id: str
    gets: Lease
    algorithm: Algorithm
    safe_capacity: float
    def __init__(self, resource_id: _Optional[str] = ..., gets: _Optional[_Union[Lease, _Mapping]] = ..., algorithm: _Optional[_Union[Algorithm, _Mapping]] = ..., safe_capacity: _Optional[float] = ...) -> None: ...

class GetServerCapacityResponse(_message.Message):
    __slots__ = ("response", "mastership")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    MASTERSHIP_FIELD_NUMBER: _ClassVar[int]
    response: _containers.RepeatedCompositeFieldContainer[ServerCapacityResourceResponse]
    mastership: Mastership
    def __init__(self, response: _Optional[_Iterable[_Union[ServerCapacityResourceResponse, _Mapping]]] = ..., mastership: _Optional[_Union[Mastership, _Mapping]] = ...) -> None: ...

class ReleaseCapacityRequest(_message.Message):
    __slots__ = ("client_id", "resource_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    resource_id: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_id: _Optional[str] = ..., resource_id: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseCapacityResponse(_message.Message):
    __slots__ = ("mastership",)
    MASTERSHIP_FIELD_NUMBER: _ClassVar[int]
    mastership: Mastership
    def __init__(self, mastership: _Optional[_Union[Mastership, _Mapping]] = ...) -> None: ...

class NamedParameter(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Algorithm(_message.Message):
    __slots__ = ("kind", "lease_length", "refresh_interval", "parameters", "learning_mode_duration")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NO_ALGORITHM: _ClassVar[Algorithm.Kind]
        STATIC: _ClassVar[Algorithm.Kind]
        PROPORTIONAL_SHARE: _ClassVar[Algorithm.Kind]
        FAIR_SHARE: _ClassVar[Algorithm.Kind]
    NO_ALGORITHM: Algorithm.Kind
    STATIC: Algorithm.Kind
    PROPORTIONAL_SHARE: Algorithm.Kind
    FAIR_SHARE: Algorithm.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    LEASE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    REFRESH_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    LEARNING_MODE_DURATION_FIELD_NUMBER: _ClassVar[int]
    kind: Algorithm.Kind
    lease_length: int
    refresh_interval: int
    parameters: _containers.RepeatedCompositeFieldContainer[NamedParameter]
    learning_mode_duration: int
    def __init__(self, kind: _Optional[_Union[Algorithm.Kind, str]] = ..., lease_length: _Optional[int] = ..., refresh_interval: _Optional[int] = ..., parameters: _Optional[_Iterable[_Union[NamedParameter, _Mapping]]] = ..., learning_mode_duration: _Optional[int] = ...) -> None: ...

class ResourceTemplate(_message.Message):
    __slots__ = ("identifier_glob", "capacity", "algorithm", "safe_capacity", "description")
    IDENTIFIER_GLOB_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    SAFE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    identifier_glob: str
    capacity: float
    algorithm: Algorithm
    safe_capacity: float
    description: str
    def __init__(self, identifier_glob: _Optional[str] = ..., capacity: _Optional[float] = ..., algorithm: _Optional[_Union[Algorithm, _Mapping]] = ..., safe_capacity: _Optional[float] = ..., description: _Optional[str] = ...) -> None: ...

class ResourceRepository(_message.Message):
    __slots__ = ("resources",)
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedCompositeFieldContainer[ResourceTemplate]
    def __init__(self, resources: _Optional[_Iterable[_Union[ResourceTemplate, _Mapping]]] = ...) -> None: ...

class DiscoveryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DiscoveryResponse(_message.Message):
    __slots__ = ("mastership", "is_master")
    MASTERSHIP_FIELD_NUMBER: _ClassVar[int]
    IS_MASTER_FIELD_NUMBER: _ClassVar[int]
    mastership: Mastership
    is_master: bool
    def __init__(self, mastership: _Optional[_Union[Mastership, _Mapping]] = ..., is_master: _Optional[bool] = ...) -> None: ...
