"""Windows that fill long paths (issue 31 point 2): a worker keeps as many chunks in flight on a link
as the path's bandwidth-delay product needs (proto::path_window, from the socket's TCP_INFO), never
fewer than the configured window, and sums stay exact when that window is far beyond the reducer's
group slots."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
from conftest import child_env_in_tree
from exact_rounds import run_exact_rounds
from mitm_proxy import TO_REDUCER, Proxy
from paths import ROOT

import reducer
from reducer._native import core
from reducer.bench import bulk, emulate
from reducer.bench.options import BenchConfig
from reducer.errors import ConfigError

_REASON = emulate.unavailable_reason()
needs_netns = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))

KiB, MiB = 1 << 10, 1 << 20


def test_path_window_follows_the_bandwidth_delay_product():
    # 0.5 Gbit/s (62.5 MB/s) x 40 ms = 2.5 MB; four times that (kPathHeadroom) in 32 KiB chunks: 306.
    assert core.path_window(4, 32 * KiB, 40_000, 62_500_000) == 306
    # Twice the round trip, twice the window; twice the chunk, half of it.
    assert core.path_window(4, 32 * KiB, 80_000, 62_500_000) == 611
    assert core.path_window(4, 64 * KiB, 40_000, 62_500_000) == 153
    # A LAN (100 us at 1 Gbit/s: 12.5 KB) keeps the configured window; so does an unknown path.
    assert core.path_window(4, 32 * KiB, 100, 125_000_000) == 4
    assert core.path_window(2, 32 * KiB, 0, 62_500_000) == 2
    assert core.path_window(2, 32 * KiB, 40_000, 0) == 2
    # Never below the configured window, never 0.
    assert core.path_window(64, 32 * KiB, 1_000, 10_000_000) == 64
    assert core.path_window(0, 32 * KiB, 0, 0) == 1


def test_path_window_is_bounded():
    # At most 1024 chunks (RS_WINDOW's bound) and 64 MiB in flight per link.
    assert core.path_window(4, 4 * KiB, 10**6, 10**10) == 1024
    assert core.path_window(4, 1 * MiB, 10**6, 10**10) == 64
    assert core.path_window(4, 64 * MiB, 10**6, 10**10) == 4
    # Huge measurements (TCP_INFO's full ranges) do not overflow.
    assert core.path_window(4, 8, 2**32 - 1, 2**64 - 1) == 1024


@pytest.mark.timeout(180)
def test_windows_far_beyond_the_group_slots_sum_exactly(reducers):
    """W = 4 workers on R = 1 reducer with 2 group slots, each keeping up to 1024 chunks in flight
    (what path_window gives a long fat path): the reducer holds back with TCP back-pressure,
    float32 and int64 sums stay exact, rounds back to back."""
    W = 4
    addrs = [s.address for s in reducers(1, group_slots=2)]
    n = (8 * MiB) // 4
    errors = run_exact_rounds(addrs, W, n, 170, group="longpath", timeout=90, connect_timeout=60, window=1024)
    assert not errors, errors


@pytest.mark.parametrize(
    "delay, jitter, loss, flag",
    [
        (-1, 0, 0, "--emulate-delay-ms"),
        (5, 6, 0, "--emulate-jitter-ms"),
        (5, 1, 1.0, "--emulate-loss"),
        (float("nan"), 0, 0, "--emulate-delay-ms"),
    ],
)
def test_path_options_are_checked(delay, jitter, loss, flag):
    cfg = BenchConfig(emulate_gbps=0.3, emulate_delay_ms=delay, emulate_jitter_ms=jitter, emulate_loss=loss)
    with pytest.raises(ConfigError, match=flag):
        bulk.check(cfg)
    with pytest.raises(ConfigError, match="need --emulate-gbps"):
        bulk.check(BenchConfig(emulate_delay_ms=5))


_ECHO = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5555)); s.listen(1); s.settimeout(30)
c, _ = s.accept()
while True:
    b = c.recv(100)
    if not b: break
    c.sendall(b)
"""
_PING = """
import socket, sys, time
for _ in range(100):
    try: s = socket.create_connection((sys.argv[1], 5555), timeout=5); break
    except OSError: time.sleep(0.1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rt = []
for i in range(12):
    t = time.perf_counter(); s.sendall(b"x"); s.recv(1); rt.append((time.perf_counter() - t) * 1000)
print(" ".join(f"{x:.2f}" for x in rt[2:]))
"""


@pytest.mark.netns
@needs_netns
@pytest.mark.timeout(120)
def test_emulated_delay_shows_in_the_round_trip():
    """Two emulated hosts 15 +- 5 ms apart each way: a ping-like TCP round trip takes 20-40 ms
    (at least twice the delay less the jitter; the bound above is generous for a busy machine)."""
    with emulate.EmulatedHosts(2, 0.2, prefix="rsl", subnet="10.78.0.0/24", delay_ms=15, jitter_ms=5) as hs:
        echo = hs.popen(1, [sys.executable, "-c", _ECHO])
        try:
            out = hs.run(0, [sys.executable, "-c", _PING, hs[1].ip], timeout=60)
        finally:
            echo.kill()
        rtts = sorted(float(x) for x in out.stdout.split())
        assert len(rtts) == 10, out.stderr
        assert rtts[0] >= 19.0, rtts  # 2 x (15 - 5) ms, less timer slack
        assert rtts[len(rtts) // 2] < 200.0, rtts


def _slowed(seconds: float):
    """A proxy tamper that holds every frame toward the reducer for `seconds`: a slow worker."""

    def tamper(direction: str, _conn: int, _index: int, frame: bytes) -> list[bytes]:
        if direction == TO_REDUCER:
            time.sleep(seconds)
        return [frame]

    return tamper


@pytest.mark.timeout(120)
def test_the_path_window_follows_the_results_not_tcps_rate(reducers):
    """Rank 0 is on loopback (TCP measures GB/s over a 10-50 us round trip), rank 1's chunks cross
    a proxy that holds each 8 KiB frame 2 ms: rank 0's results come back at rank 1's 4 MB/s. Its
    window is sized from that rate (4 x 4 MB/s x 50 us is under one chunk: pipeline_for's window
    stands); sized from TCP's delivery rate (the rule before) it grew to tens of chunks, all of them
    waiting in the reducer for rank 1. Sums exact."""
    chunk, n, rounds = 8 * KiB, MiB // 4, 3  # 1 MiB of float32 per round, one reducer
    srv = reducers(1)[0]
    want = core.pipeline_for(n * 4, chunk, 2, 1, 4)[1]
    out: list = [None, None]
    with Proxy(srv.port, tags=False, tamper=_slowed(0.002)) as proxy:

        def rank_main(rank: int) -> None:
            try:
                addr = srv.address if rank == 0 else proxy.address
                with reducer.Communicator(
                    [addr], rank, 2, group="pathrate", timeout=60, connect_timeout=30, chunk_bytes=chunk, window=4
                ) as comm:
                    for k in range(rounds):
                        a = np.arange(n, dtype=np.int64) * (rank + 1) + k
                        comm.allreduce(a)
                        assert np.array_equal(a, np.arange(n, dtype=np.int64) * 3 + 2 * k), f"round {k}"
                    out[rank] = comm.stats()["link_window_max"]
            except BaseException as exc:  # reported below
                out[rank] = exc

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
    assert not any(isinstance(o, BaseException) for o in out), out
    assert want == 2 and out[0] == want, (out, want)


@pytest.mark.netns
@needs_netns
@pytest.mark.timeout(300)
def test_a_long_path_widens_the_window(tmp_path):
    """W = 2 workers and R = 1 reducer 10 ms apart each way on 0.3 Gbit/s links, through the bench:
    the window widens beyond pipeline_for's (2 chunks of 64 KiB carry 6.5 MB/s over 20 ms; the link
    needs about 8 for its share) and sums stay exact."""
    prefix = "p" + uuid.uuid4().hex[:6]
    out_json = tmp_path / "path.json"
    args = ["--workers", "2", "--reducers", "1", "--sizes", "4M", "--algos", "rs", "--emulate-gbps", "0.3"]
    args += ["--emulate-delay-ms", "10", "--iters", "2", "--warmup", "1", "--iters-bytes", "0", "--warmup-bytes", "0"]
    cmd = [sys.executable, "-m", "reducer.cli.main", "bench", *args, "--no-progress", "--netns-prefix", prefix]
    try:
        res = subprocess.run(
            [*cmd, "--json", str(out_json)],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=ROOT,
            env=child_env_in_tree(),
        )
    finally:
        emulate.cleanup_stale(prefix)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    (row,) = json.loads(out_json.read_text())
    base = core.pipeline_for(4 * MiB, int(row["chunk_bytes"]), 2, 1, int(row["window"]))[1]
    assert row["wrong"] == 0, row
    assert row["link_window_max"] > base, (row["link_window_max"], base)
