"""`reduction-server bench`: the reduction server vs ring all-reduce, side by side.

    from reducer.bench import BenchConfig, run
    rows = run(BenchConfig(workers=4, reducers=4, sizes=parse_sizes("4K:64M"), emulate_gbps=1.0))

See docs/performance.md for what it measures and how to read the tables.
"""

from .runner import ALL_ALGOS, EXTRA_ALGOS, BenchConfig, BenchError, available_algos, parse_sizes, run

__all__ = ["ALL_ALGOS", "EXTRA_ALGOS", "BenchConfig", "BenchError", "available_algos", "parse_sizes", "run"]
