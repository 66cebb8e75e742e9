from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Value(_message.Message):
    __slots__ = ("string_value", "int64_value", "double_value", "bool_value")
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT64_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    string_value: str
    int64_value: int
    double_value: float
    bool_value: bool
    def __init__(self, string_value: _Optional[str] = ..., int64_value: _Optional[int] = ..., double_value: _Optional[float] = ..., bool_value: _Optional[bool] = ...) -> None: ...

class Row(_message.Message):
    __slots__ = ("fields",)
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.MessageMap[str, Value]
    def __init__(self, fields: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class ComputeRequest(_message.Message):
    __slots__ = ("feature_set", "rows", "budget_ms")
    FEATURE_SET_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_MS_FIELD_NUMBER: _ClassVar[int]
    feature_set: str
    rows: _containers.RepeatedCompositeFieldContainer[Row]
    budget_ms: float
    def __init__(self, feature_set: _Optional[str] = ..., rows: _Optional[_Iterable[_Union[Row, _Mapping]]] = ..., budget_ms: _Optional[float] = ...) -> None: ...

class RowFlags(_message.Message):
    __slots__ = ("defaulted", "degraded", "reason")
    DEFAULTED_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    defaulted: bool
    degraded: bool
    reason: str
    def __init__(self, defaulted: _Optional[bool] = ..., degraded: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ComputeResponse(_message.Message):
    __slots__ = ("feature_set", "rows", "columns", "feature_names", "features", "flags")
    FEATURE_SET_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    FEATURE_NAMES_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    feature_set: str
    rows: int
    columns: int
    feature_names: _containers.RepeatedScalarFieldContainer[str]
    features: bytes
    flags: _containers.RepeatedCompositeFieldContainer[RowFlags]
    def __init__(self, feature_set: _Optional[str] = ..., rows: _Optional[int] = ..., columns: _Optional[int] = ..., feature_names: _Optional[_Iterable[str]] = ..., features: _Optional[bytes] = ..., flags: _Optional[_Iterable[_Union[RowFlags, _Mapping]]] = ...) -> None: ...

class IngestRequest(_message.Message):
    __slots__ = ("feature_set", "events")
    FEATURE_SET_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    feature_set: str
    events: _containers.RepeatedCompositeFieldContainer[Row]
    def __init__(self, feature_set: _Optional[str] = ..., events: _Optional[_Iterable[_Union[Row, _Mapping]]] = ...) -> None: ...

class IngestResponse(_message.Message):
    __slots__ = ("ingested",)
    INGESTED_FIELD_NUMBER: _ClassVar[int]
    ingested: int
    def __init__(self, ingested: _Optional[int] = ...) -> None: ...

class GetFeatureSetRequest(_message.Message):
    __slots__ = ("feature_set",)
    FEATURE_SET_FIELD_NUMBER: _ClassVar[int]
    feature_set: str
    def __init__(self, feature_set: _Optional[str] = ...) -> None: ...

class InputField(_message.Message):
    __slots__ = ("name", "type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ...) -> None: ...

class FeatureInfo(_message.Message):
    __slots__ = ("name", "dtype", "group")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    group: str
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class GetFeatureSetResponse(_message.Message):
    __slots__ = ("feature_set", "name", "version", "inputs", "features", "timestamp_field")
    FEATURE_SET_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_FIELD_NUMBER: _ClassVar[int]
    feature_set: str
    name: str
    version: int
    inputs: _containers.RepeatedCompositeFieldContainer[InputField]
    features: _containers.RepeatedCompositeFieldContainer[FeatureInfo]
    timestamp_field: str
    def __init__(self, feature_set: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[int] = ..., inputs: _Optional[_Iterable[_Union[InputField, _Mapping]]] = ..., features: _Optional[_Iterable[_Union[FeatureInfo, _Mapping]]] = ..., timestamp_field: _Optional[str] = ...) -> None: ...
