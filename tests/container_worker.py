"""The job that tests/deploy/test_container_job.py runs in each worker container (the worker image's Python).

Configured only by CLUSTER_SPEC (`reducer.init()`); needs numpy and this package, nothing of the
test environment. In the folder given as the only argument (a bind mount shared with the test):

1. phase 1: all-reduces (sum) of int64, float32 and float64 arrays on both reducers; then it
   writes `ready-<rank>` and waits, at most GO_TIMEOUT seconds, for the file `go`, which the test
   writes after it SIGKILLed one reducer container;
2. phase 2: the same kinds of rounds again: the first one finds the reducer gone and fails over
   to the survivor (RS_FAILOVER is on by default).

Every result is saved as `rank<r>-phase<p>-<dtype>.npy` for the test to compare with its own
reference (`inputs` below), and the client's stats as `rank<r>-stats.json`. Exit status 0, or
1 when a round failed, 3 when `go` never came.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

N = 600_001  # elements per array: odd, so the reducers' shards are uneven
GO_TIMEOUT = 180.0
DTYPES = ("int64", "float32", "float64")


def inputs(rank: int, phase: int) -> dict[str, np.ndarray]:
    """What worker `rank` contributes in `phase` (the test builds its reference from these)."""
    rng = np.random.default_rng(1000 * phase + rank)
    return {
        "int64": rng.integers(-(1 << 40), 1 << 40, N, dtype=np.int64),
        "float32": rng.standard_normal(N).astype(np.float32),
        "float64": rng.standard_normal(N),
    }


def run_phase(comm, folder: Path, rank: int, phase: int) -> None:
    for dtype, buf in inputs(rank, phase).items():
        comm.allreduce(buf, op="sum")
        np.save(folder / f"rank{rank}-phase{phase}-{dtype}.npy", buf)
    print(f"rank {rank}: phase {phase} done", flush=True)


def wait_for(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def main(argv=None) -> int:
    import reducer
    from reducer.errors import ReductionError

    folder = Path((argv if argv is not None else sys.argv[1:])[0])
    comm = reducer.init()
    rank = comm.rank
    print(f"rank {rank} of {comm.world_size}, reducers {', '.join(comm.reducers)}", flush=True)
    with comm:
        try:
            run_phase(comm, folder, rank, 1)
            (folder / f"ready-{rank}").write_text("")
            if not wait_for(folder / "go", GO_TIMEOUT):
                print(f"rank {rank}: no 'go' within {GO_TIMEOUT:.0f} s", file=sys.stderr)
                return 3
            run_phase(comm, folder, rank, 2)
        except ReductionError as exc:
            print(f"rank {rank}: all-reduce failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        stats = comm.stats()
    (folder / f"rank{rank}-stats.json").write_text(json.dumps(stats, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
