"""Array adapters: turn what a caller passes into host memory the transport can use.

numpy arrays and other C-contiguous buffers are used in place (zero copy).
Framework tensors (torch, CuPy, DLPack) are handled in reducer.frameworks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import wire_name
from .errors import ConfigError


@dataclass(frozen=True)
class HostView:
    ptr: int          # address of the first byte
    nbytes: int
    dtype: str        # wire dtype name
    owner: Any        # keeps the memory alive while the view is in use


def host_view(array: Any) -> HostView:
    """A zero-copy view of a writable, C-contiguous host array."""
    if isinstance(array, np.ndarray):
        arr = array
    else:
        try:
            arr = np.asarray(memoryview(array))
        except TypeError:
            raise ConfigError(
                f"cannot all-reduce an object of type {type(array).__name__}: pass a numpy array, a buffer, "
                "or a framework tensor through reducer.frameworks"
            ) from None
    if not arr.flags.c_contiguous:
        raise ConfigError("array must be C-contiguous (use np.ascontiguousarray and copy the result back)")
    if not arr.flags.writeable:
        raise ConfigError("array is read-only: the all-reduce writes the result in place")
    return HostView(int(arr.ctypes.data), int(arr.nbytes), wire_name(arr.dtype), arr)
