"""Array adapters: turn what a caller passes into host memory the transport can use.

numpy arrays, torch CPU tensors, CPU DLPack objects and other C-contiguous buffers are used in
place (zero copy); reducer.frameworks does the per-framework work. Device arrays (torch CUDA,
CuPy) need staging through host memory: use Communicator.allreduce_async, which stages them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .dtypes import wire_name
from .errors import ConfigError
from .frameworks import check_host, host_array


@dataclass(frozen=True)
class HostView:
    ptr: int  # address of the first byte
    nbytes: int
    dtype: str  # wire dtype name
    owner: Any  # keeps the memory alive while the view is in use


def host_view(array: Any) -> HostView:
    """A zero-copy view of a writable, C-contiguous host array."""
    arr = host_array(array)
    if arr is None:
        raise ConfigError(
            f"{type(array).__name__} lives in device memory: use comm.allreduce_async(x).wait(), which stages "
            "it through pinned host memory"
        )
    check_host(arr)
    return HostView(int(arr.ctypes.data), int(arr.nbytes), wire_name(arr.dtype), arr)
