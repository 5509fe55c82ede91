"""The dtype table: numpy dtypes <-> wire dtype names of the C++ core. Defined once."""
from __future__ import annotations

from typing import Dict

import numpy as np

try:
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    BFLOAT16 = None

from .errors import ConfigError

_BY_NUMPY: Dict[np.dtype, str] = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float64): "float64",
    np.dtype(np.float16): "float16",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
}
if BFLOAT16 is not None:
    _BY_NUMPY[BFLOAT16] = "bfloat16"

_BY_NAME: Dict[str, np.dtype] = {v: k for k, v in _BY_NUMPY.items()}

OPS = ("sum", "avg", "min", "max")
SUPPORTED = tuple(_BY_NAME)


def wire_name(dtype: "np.dtype | str") -> str:
    """Wire name of a numpy dtype ('float32', ..., 'bfloat16'); ConfigError if unsupported."""
    dt = np.dtype(dtype)
    try:
        return _BY_NUMPY[dt.newbyteorder("=") if dt.byteorder not in ("=", "|") else dt]
    except KeyError:
        raise ConfigError(
            f"dtype {dt} is not supported; supported: {', '.join(SUPPORTED)}"
        ) from None


def numpy_dtype(name: str) -> np.dtype:
    """numpy dtype for a wire name (also accepts numpy spellings like 'f4')."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    if name in ("bf16",) and BFLOAT16 is not None:
        return BFLOAT16
    try:
        dt = np.dtype(name)
    except TypeError:
        raise ConfigError(f"unknown dtype {name!r}; supported: {', '.join(SUPPORTED)}") from None
    wire_name(dt)
    return dt


def check_op(op: str) -> str:
    op = op.lower()
    if op not in OPS:
        raise ConfigError(f"unsupported op {op!r}; supported: {', '.join(OPS)}")
    return op
