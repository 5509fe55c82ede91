"""reduction-server: a faster all-reduce for data-parallel training.

Workers send each gradient buffer once, split across CPU-only reducer nodes that
sum the shards of all workers and send the sums back.

    import reducer
    comm = reducer.init()                 # or reducer.Communicator(reducers=[...], rank=r, world_size=W)
    comm.allreduce(grad)                  # in place, sum over all workers

The C++ core (reducer._core) is loaded on first use: `import reducer` alone does not load it.
reducer.config, and everything that reads a setting, needs it: the settings the core reads are
defined there (csrc/common/settings.h).
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import (
    AuthError,
    ConfigError,
    ConnectError,
    MismatchError,
    PeerLostError,
    ProtocolError,
    ReductionError,
    ReductionTimeout,
)

__version__ = "0.1.0"

_LAZY = {
    "ReducerServer": ("reducer.server", "ReducerServer"),
    "Communicator": ("reducer.communicator", "Communicator"),
    "init": ("reducer.communicator", "init"),
    "Handle": ("reducer.fusion", "Handle"),
    "set_tcp_congestion": ("reducer._native", "set_tcp_congestion"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'reducer' has no attribute {name!r}")


__all__ = [
    "ReducerServer",
    "Communicator",
    "init",
    "set_tcp_congestion",
    "ReductionError",
    "ConfigError",
    "ConnectError",
    "AuthError",
    "ProtocolError",
    "PeerLostError",
    "MismatchError",
    "ReductionTimeout",
]
