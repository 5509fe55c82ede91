"""The dtype and op table: wire names of the C++ core <-> numpy (and torch) dtypes. Defined once.

The order of SUPPORTED and OPS is the numbering of the core (``DType`` and ``Op`` in
csrc/kernels/kernels.h); ``dtype_code`` / ``op_code`` give those numbers. torch has no numpy
bfloat16, so torch and numpy meet through the bits (int16): ``tensor_as_numpy`` and
``numpy_as_tensor`` are the only places that know it. torch is imported only by the torch helpers.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .errors import ConfigError

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

# Wire name -> numpy dtype, in the core's DType order. The wire name is also torch's dtype name.
_BY_NAME: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "float16": np.dtype(np.float16),
    "bfloat16": BFLOAT16,
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
}
_BY_NUMPY: dict[np.dtype, str] = {v: k for k, v in _BY_NAME.items()}

SUPPORTED: tuple[str, ...] = tuple(_BY_NAME)
OPS: tuple[str, ...] = ("sum", "avg", "min", "max")


def wire_name(dtype: np.dtype | str) -> str:
    """Wire name of a numpy dtype ('float32', ..., 'bfloat16'); ConfigError if unsupported."""
    dt = np.dtype(dtype)
    try:
        return _BY_NUMPY[dt.newbyteorder("=") if dt.byteorder not in ("=", "|") else dt]
    except KeyError:
        raise ConfigError(f"dtype {dt} is not supported; supported: {', '.join(SUPPORTED)}") from None


def numpy_dtype(name: str) -> np.dtype:
    """numpy dtype for a wire name (also accepts numpy spellings like 'f4', and 'bf16')."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    if name == "bf16":
        return BFLOAT16
    try:
        dt = np.dtype(name)
    except TypeError:
        raise ConfigError(f"unknown dtype {name!r}; supported: {', '.join(SUPPORTED)}") from None
    wire_name(dt)
    return dt


def check_op(op: str) -> str:
    """The op in lower case; ConfigError unless it is one of OPS."""
    op = op.lower()
    if op not in OPS:
        raise ConfigError(f"unsupported op {op!r}; supported: {', '.join(OPS)}")
    return op


def dtype_code(name: str) -> int:
    """The core's number of a wire dtype (csrc/kernels/kernels.h ``DType``)."""
    return SUPPORTED.index(name)


def op_code(op: str) -> int:
    """The core's number of an op (csrc/kernels/kernels.h ``Op``)."""
    return OPS.index(op)


# ---------------------------------------------------------------------- torch
def torch_dtype(name: str) -> Any:
    """The torch dtype of a wire dtype name (torch.float32, ..., torch.bfloat16)."""
    import torch

    if name not in _BY_NAME:
        raise ConfigError(f"unknown dtype {name!r}; supported: {', '.join(SUPPORTED)}")
    return getattr(torch, name)


def torch_numpy_dtype(tdtype: Any) -> np.dtype:
    """The numpy dtype of a torch dtype the reducers know; ConfigError for any other."""
    name = str(tdtype).rpartition(".")[2]
    if name not in _BY_NAME:
        raise ConfigError(f"cannot all-reduce a torch tensor of dtype {tdtype}")
    return _BY_NAME[name]


def tensor_as_numpy(t: Any) -> np.ndarray:
    """A zero-copy numpy view of a contiguous CPU tensor (bfloat16 through its int16 bits)."""
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BFLOAT16)
    return t.numpy()


def numpy_as_tensor(a: np.ndarray) -> Any:
    """A zero-copy CPU tensor over a numpy array (bfloat16 through its int16 bits)."""
    import torch

    if a.dtype == BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
