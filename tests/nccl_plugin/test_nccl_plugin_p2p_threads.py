"""The point-to-point net's sockets and progress threads per connection (NCCL's socket net
semantics: NCCL_SOCKET_NTHREADS threads x NCCL_NSOCKS_PERTHREAD sockets; RS_NCCL_NSOCKS sets the
socket count directly). Every byte is compared; the progress threads are counted."""

from __future__ import annotations

import nccl_harness as H
import numpy as np
import pytest
from conftest import run_ranks
from paths import ROOT

MIB = 1 << 20
SIZES = [0, 1, 7, 65535, 65536, 65537, 4 * MIB, 3 * MIB + 5, 16 * MIB + 3] + [
    int(s) for s in np.random.default_rng(5).integers(0, 1 << 20, 40)
]


@pytest.mark.parametrize(
    "env, sockets, threads",
    [
        ({"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "2", "RS_NCCL_NSOCKS": None}, 8, 4),
        ({"NCCL_SOCKET_NTHREADS": "3", "RS_NCCL_NSOCKS": "4"}, 4, 3),  # uneven: thread 0 moves sockets 0 and 3
        ({"NCCL_SOCKET_NTHREADS": "4", "RS_NCCL_NSOCKS": "2"}, 2, 2),  # no more threads than sockets
        ({"NCCL_NSOCKS_PERTHREAD": "3", "RS_NCCL_NSOCKS": None}, 3, 1),  # one thread, NCCL's product 1 x 3
    ],
)
def test_p2p_sockets_and_threads_per_connection(pool, tmp_path, env, sockets, threads):
    results = run_ranks(pool, H.p2p_peer, 2, rdv=str(tmp_path), version=12, sizes=SIZES, env=env)
    for r in results:
        assert f"{sockets} socket(s) per connection" in r["log"], r["log"]
        assert r["mismatched"] == [], r["log"]
        assert r["ring_full_null"]
        # a send comm and a receive comm per rank, each with its own threads
        assert r["threads_added"] == 2 * threads, r["threads_added"]
        assert r["unloaded"], "a progress thread outlived close + dlclose"


def test_bad_thread_setting_is_an_init_error_not_a_crash(pool, tmp_path):
    with pytest.raises(RuntimeError, match="NCCL_SOCKET_NTHREADS"):
        run_ranks(
            pool,
            H.p2p_peer,
            1,
            rdv=str(tmp_path),
            version=12,
            sizes=[1],
            env={"NCCL_SOCKET_NTHREADS": "0", "RS_NCCL_NSOCKS": None},
        )


def test_benchmark_runs_both_sides_and_checks_every_message(tmp_path):
    """benchmarks/bench_nccl_p2p.py on loopback, tiny: both nets deliver every message (no timing)."""
    import json
    import subprocess
    import sys

    out = tmp_path / "rows.json"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_nccl_p2p.py"),
            "--count",
            "6",
            "--size",
            str(1 << 20),
            "--reps",
            "1",
            "--nsocks",
            "3",
            "--threads",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert row["plugin"]["bad"] == 0 and row["tcp"]["bad"] == 0
    assert row["plugin"]["data_threads"] == 2 and row["tcp"]["data_threads"] == 3
    assert "plugin/tcp throughput" in run.stdout
