from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatsRequest(_message.Message):
    __slots__ = ("nonce", "mac")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    mac: bytes
    def __init__(self, nonce: _Optional[bytes] = ..., mac: _Optional[bytes] = ...) -> None: ...

class GroupStats(_message.Message):
    __slots__ = ("job", "group", "world_size", "connected", "complete", "rounds", "bytes_received", "bytes_sent", "last_error", "age_s", "streams", "ended")
    JOB_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    job: str
    group: str
    world_size: int
    connected: int
    complete: bool
    rounds: int
    bytes_received: int
    bytes_sent: int
    last_error: str
    age_s: float
    streams: int
    ended: bool
    def __init__(self, job: _Optional[str] = ..., group: _Optional[str] = ..., world_size: _Optional[int] = ..., connected: _Optional[int] = ..., complete: _Optional[bool] = ..., rounds: _Optional[int] = ..., bytes_received: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., last_error: _Optional[str] = ..., age_s: _Optional[float] = ..., streams: _Optional[int] = ..., ended: _Optional[bool] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("state", "counters", "values", "info", "groups", "data_address", "uptime_s", "version", "auth_required", "data_address_from", "control_address")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATE_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    AUTH_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FROM_FIELD_NUMBER: _ClassVar[int]
    CONTROL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    state: str
    counters: _containers.ScalarMap[str, int]
    values: _containers.ScalarMap[str, float]
    info: _containers.ScalarMap[str, str]
    groups: _containers.RepeatedCompositeFieldContainer[GroupStats]
    data_address: str
    uptime_s: float
    version: str
    auth_required: bool
    data_address_from: str
    control_address: str
    def __init__(self, state: _Optional[str] = ..., counters: _Optional[_Mapping[str, int]] = ..., values: _Optional[_Mapping[str, float]] = ..., info: _Optional[_Mapping[str, str]] = ..., groups: _Optional[_Iterable[_Union[GroupStats, _Mapping]]] = ..., data_address: _Optional[str] = ..., uptime_s: _Optional[float] = ..., version: _Optional[str] = ..., auth_required: _Optional[bool] = ..., data_address_from: _Optional[str] = ..., control_address: _Optional[str] = ...) -> None: ...

class ChallengeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ChallengeResponse(_message.Message):
    __slots__ = ("nonce", "auth_required")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    AUTH_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    auth_required: bool
    def __init__(self, nonce: _Optional[bytes] = ..., auth_required: _Optional[bool] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("timeout_s", "wait", "nonce", "mac")
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    timeout_s: float
    wait: bool
    nonce: bytes
    mac: bytes
    def __init__(self, timeout_s: _Optional[float] = ..., wait: _Optional[bool] = ..., nonce: _Optional[bytes] = ..., mac: _Optional[bytes] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("state", "already_draining")
    STATE_FIELD_NUMBER: _ClassVar[int]
    ALREADY_DRAINING_FIELD_NUMBER: _ClassVar[int]
    state: str
    already_draining: bool
    def __init__(self, state: _Optional[str] = ..., already_draining: _Optional[bool] = ...) -> None: ...
