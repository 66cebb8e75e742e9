from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_NONE: _ClassVar[Tier]
    TIER_L1: _ClassVar[Tier]
    TIER_REDIS: _ClassVar[Tier]
TIER_NONE: Tier
TIER_L1: Tier
TIER_REDIS: Tier

class LookupRequest(_message.Message):
    __slots__ = ("keys", "pipeline", "allow_stale", "budget_ms")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STALE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_MS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    pipeline: str
    allow_stale: bool
    budget_ms: float
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., pipeline: _Optional[str] = ..., allow_stale: _Optional[bool] = ..., budget_ms: _Optional[float] = ...) -> None: ...

class LookupResult(_message.Message):
    __slots__ = ("hit", "value", "model_version", "age_s", "stale", "tier")
    HIT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    hit: bool
    value: bytes
    model_version: str
    age_s: float
    stale: bool
    tier: Tier
    def __init__(self, hit: _Optional[bool] = ..., value: _Optional[bytes] = ..., model_version: _Optional[str] = ..., age_s: _Optional[float] = ..., stale: _Optional[bool] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[LookupResult]
    def __init__(self, results: _Optional[_Iterable[_Union[LookupResult, _Mapping]]] = ...) -> None: ...

class StoreEntry(_message.Message):
    __slots__ = ("key", "value", "pipeline", "model_name", "model_version", "ttl_s", "stale_ttl_s")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    STALE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    pipeline: str
    model_name: str
    model_version: str
    ttl_s: float
    stale_ttl_s: float
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., pipeline: _Optional[str] = ..., model_name: _Optional[str] = ..., model_version: _Optional[str] = ..., ttl_s: _Optional[float] = ..., stale_ttl_s: _Optional[float] = ...) -> None: ...

class StoreRequest(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[StoreEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[StoreEntry, _Mapping]]] = ...) -> None: ...

class StoreResponse(_message.Message):
    __slots__ = ("stored", "dropped")
    STORED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    stored: int
    dropped: int
    def __init__(self, stored: _Optional[int] = ..., dropped: _Optional[int] = ...) -> None: ...

class InvalidateRequest(_message.Message):
    __slots__ = ("pipeline", "model_name", "model_version")
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    pipeline: str
    model_name: str
    model_version: str
    def __init__(self, pipeline: _Optional[str] = ..., model_name: _Optional[str] = ..., model_version: _Optional[str] = ...) -> None: ...

class InvalidateResponse(_message.Message):
    __slots__ = ("l1_removed", "redis_removed")
    L1_REMOVED_FIELD_NUMBER: _ClassVar[int]
    REDIS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    l1_removed: int
    redis_removed: int
    def __init__(self, l1_removed: _Optional[int] = ..., redis_removed: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("l1_entries", "l1_bytes", "l1_max_bytes", "l1_evictions", "l1_hits", "redis_hits", "misses", "redis_errors", "circuit_open", "stores", "stores_dropped")
    L1_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    L1_BYTES_FIELD_NUMBER: _ClassVar[int]
    L1_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    L1_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    L1_HITS_FIELD_NUMBER: _ClassVar[int]
    REDIS_HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    REDIS_ERRORS_FIELD_NUMBER: _ClassVar[int]
    CIRCUIT_OPEN_FIELD_NUMBER: _ClassVar[int]
    STORES_FIELD_NUMBER: _ClassVar[int]
    STORES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    l1_entries: int
    l1_bytes: int
    l1_max_bytes: int
    l1_evictions: int
    l1_hits: int
    redis_hits: int
    misses: int
    redis_errors: int
    circuit_open: bool
    stores: int
    stores_dropped: int
    def __init__(self, l1_entries: _Optional[int] = ..., l1_bytes: _Optional[int] = ..., l1_max_bytes: _Optional[int] = ..., l1_evictions: _Optional[int] = ..., l1_hits: _Optional[int] = ..., redis_hits: _Optional[int] = ..., misses: _Optional[int] = ..., redis_errors: _Optional[int] = ..., circuit_open: _Optional[bool] = ..., stores: _Optional[int] = ..., stores_dropped: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InvalidationEvent(_message.Message):
    __slots__ = ("reset", "pipeline", "model_name", "model_version")
    RESET_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    reset: bool
    pipeline: str
    model_name: str
    model_version: str
    def __init__(self, reset: _Optional[bool] = ..., pipeline: _Optional[str] = ..., model_name: _Optional[str] = ..., model_version: _Optional[str] = ...) -> None: ...
