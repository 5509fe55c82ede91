"""`reduction-server bench`: the reduction server vs ring all-reduce, side by side.

    from reducer.bench import BenchConfig, run
    rows = run(BenchConfig(workers=4, reducers=4, sizes=parse_sizes("4K:64M"), emulate_gbps=1.0))

See docs/performance.md for what it measures and how to read the tables.

The names below come from the modules that define them (.options, .procs, .runner) on first
use: a benchmark rank (``python -m reducer.bench.rank``, one per emulated host, 64 at W = R = 32
on 2 cores) imports this package but needs none of the runner, whose imports were most of a
rank's start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .options import ALL_ALGOS, EXTRA_ALGOS, BenchConfig, available_algos, parse_sizes
    from .procs import BenchError
    from .runner import run

# name -> the module defining it
_HOMES = {
    "ALL_ALGOS": ".options",
    "EXTRA_ALGOS": ".options",
    "BenchConfig": ".options",
    "available_algos": ".options",
    "parse_sizes": ".options",
    "BenchError": ".procs",
    "run": ".runner",
}
__all__ = ["ALL_ALGOS", "EXTRA_ALGOS", "BenchConfig", "BenchError", "available_algos", "parse_sizes", "run"]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
