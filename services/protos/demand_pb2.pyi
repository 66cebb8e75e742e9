from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DemandReport(_message.Message):
    __slots__ = ("gateway", "demand")
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    gateway: str
    demand: _containers.RepeatedCompositeFieldContainer[ModelDemand]
    def __init__(self, gateway: _Optional[str] = ..., demand: _Optional[_Iterable[_Union[ModelDemand, _Mapping]]] = ...) -> None: ...

class ModelDemand(_message.Message):
    __slots__ = ("model", "subset", "in_flight", "parked")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SUBSET_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    model: str
    subset: str
    in_flight: int
    parked: int
    def __init__(self, model: _Optional[str] = ..., subset: _Optional[str] = ..., in_flight: _Optional[int] = ..., parked: _Optional[int] = ...) -> None: ...

class ReportAck(_message.Message):
    __slots__ = ("reports",)
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    reports: int
    def __init__(self, reports: _Optional[int] = ...) -> None: ...
