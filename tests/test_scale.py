"""Liveness at scale: connections that lose packets for a while (incast, a switch dropping) are
tried again soon after the loss ends (a bounded retransmission backoff), and a W = 32 R = 32 job
on emulated links finishes every round (opt-in: -m scale)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

import reducer
from reducer._native import core
from reducer.bench import emulate
from reducer.bench.emulate import EmulatedHosts, cleanup_stale

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REASON = emulate.unavailable_reason()
needs_netns = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))

TCP_RTO_MAX_MS = 44  # Linux >= 6.15
TCP_USER_TIMEOUT = 18


def _kernel_caps_rto() -> bool:
    with socket.socket() as s:
        try:
            s.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS, 1000)
        except OSError:
            return False
    return True


needs_rto_cap = pytest.mark.skipif(not _kernel_caps_rto(), reason="kernel without TCP_RTO_MAX_MS (Linux < 6.15)")


def _tcp_sockets_on_port(port: int) -> list[socket.socket]:
    """This process's connected TCP sockets with `port` at either end (duplicates, to close)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            s = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family == socket.AF_INET:
                if port in (s.getsockname()[1], s.getpeername()[1]):
                    found.append(s)
                    continue
        except OSError:
            pass
        s.close()
    return found


@needs_rto_cap
def test_connections_bound_the_retransmission_backoff_once_the_group_is_complete(reducers):
    """The workers' links and the reducer's members retransmit a lost segment at least every
    5 s once their group is complete (and give the connection up no sooner than the kernel's
    default would); the handshakes keep the kernel's rules."""
    import threading

    (server,) = reducers(1)
    port = int(server.address.rsplit(":", 1)[1])
    inside = threading.Barrier(3)
    done = threading.Event()

    def work(rank: int) -> None:
        with reducer.Communicator([server.address], rank, 2, group="rto", timeout=30, connect_timeout=30) as c:
            c.allreduce(np.ones(4, np.float32))
            inside.wait(30)
            done.wait(30)

    th = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in th:
        t.start()
    try:
        inside.wait(30)
        socks = _tcp_sockets_on_port(port)
        try:
            # 2 worker ends + 2 reducer ends (the listener has no peer: skipped)
            assert len(socks) == 4, [(s.getsockname(), s.getpeername()) for s in socks]
            for s in socks:
                assert s.getsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS) == 5000
                assert s.getsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT) == 900000
        finally:
            for s in socks:
                s.close()
    finally:
        done.set()
        for t in th:
            t.join(60)


def test_round_after_tune_is_exact(reducers):
    """The options change nothing a round computes (loopback, 2 workers in threads)."""
    import threading

    addrs = [s.address for s in reducers(2)]
    out: dict[int, np.ndarray] = {}

    def work(rank: int) -> None:
        with reducer.Communicator(addrs, rank, 2, group="tune", timeout=30, connect_timeout=30) as c:
            a = np.arange(1 << 18, dtype=np.float32) * (rank + 1)
            c.allreduce(a)
            out[rank] = a

    th = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in th:
        t.start()
    for t in th:
        t.join(60)
    expect = np.arange(1 << 18, dtype=np.float32) * 3
    assert all(np.array_equal(out[r], expect) for r in range(2))


_REDUCER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[2])
    import reducer
    s = reducer.ReducerServer(host=sys.argv[1], port=0).start()
    print(s.address, flush=True)
    sys.stdin.readline()
    s.stop()
""")

_WORKER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[4])
    import numpy as np, reducer
    addr, rank, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with reducer.Communicator([addr], rank, 2, group="blackout", timeout=60, connect_timeout=30) as c:
        a = np.full(n, rank + 1, np.float32)
        c.allreduce(a)  # the connections are up and warm
        print("ready", flush=True)
        sys.stdin.readline()
        a = np.arange(n, dtype=np.float32) + rank
        t0 = time.monotonic()
        try:
            c.allreduce(a)
        except Exception as e:
            print("error", type(e).__name__, str(e)[:300], flush=True)
        else:
            ok = np.array_equal(a, 2 * np.arange(n, dtype=np.float32) + 1)
            print("done", time.monotonic() - t0, ok, flush=True)
""")


@pytest.fixture
def prefix():
    p = "s" + uuid.uuid4().hex[:6]
    yield p
    cleanup_stale(p)


@pytest.mark.netns
@pytest.mark.timeout(120)
@needs_netns
@needs_rto_cap
def test_round_resumes_soon_after_a_blackout(prefix):
    """The switch drops every packet to the reducer for BLACKOUT seconds while a round starts.
    Before, the workers' connections doubled their retransmission timeout after each loss
    (0.2, 0.4, ... 6.4, 12.8 s): after a 14 s blackout their first retry came at about 25.4 s,
    11 s after the link was back (the W = 32 stall: 60 s, every link idle). Now a lost segment is
    retried at least every 5 s: the round ends within about 3 s of the link's return."""
    blackout = 14.0
    n = 1 << 14  # 64 KiB: one chunk, the round is over as soon as it gets through
    with EmulatedHosts(3, gbps=0.1, prefix=prefix) as hosts:
        red = hosts.popen(
            2,
            [sys.executable, "-c", _REDUCER, hosts[2].ip, ROOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert red.stdin and red.stdout
        addr = red.stdout.readline().strip()
        assert addr, "the reducer did not start"
        workers = [
            hosts.popen(
                i,
                [sys.executable, "-c", _WORKER, addr, str(i), str(n), ROOT],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(2)
        ]
        pipes = [(w.stdin, w.stdout) for w in workers]
        for _, out in pipes:
            assert out and out.readline().strip() == "ready"
        port = f"{prefix}-v2"  # the switch's port toward the reducer: everything sent to it is lost
        subprocess.run(
            ["tc", "-n", hosts.switch_netns, "qdisc", "replace", "dev", port, "root", "pfifo", "limit", "0"], check=True
        )
        for inp, _ in pipes:
            assert inp
            inp.write("\n")
            inp.flush()
        time.sleep(blackout)
        subprocess.run(
            ["tc", "-n", hosts.switch_netns, "qdisc", "replace", "dev", port, "root"] + hosts.tbf_args(), check=True
        )
        lines = [out.readline().split() if out else [] for _, out in pipes]
        red.stdin.write("\n")
        red.stdin.flush()
    for words in lines:
        assert words and words[0] == "done", " ".join(words)
        assert words[2] == "True", "wrong result"
        late = float(words[1]) - blackout
        print(f"round ended {late:.2f} s after the link was back")
        assert late < 5.5, f"the round ended {late:.1f} s after the link was back"


KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize(
    "shard, workers, chunk",
    [
        (256 * KiB, 4, 16 * KiB),  # chunk_for: shard/64, at least 16 KiB (fan-in 4 x 4 x 16 KiB = 256 KiB)
        (16 * MiB, 4, 32 * KiB),  # chunk_for's 128 KiB would put 2 MiB on a reducer's link at once
        (4 * MiB, 8, 16 * KiB),
        (256 * KiB, 16, 8 * KiB),  # W = 16, 4 MiB rounds: 32 chunks per shard, 512 KiB of fan-in
        (1 * MiB, 16, 8 * KiB),
        (512 * KiB, 32, 4 * KiB),  # W = 32, 16 MiB rounds
        (512 * KiB, 1024, 4 * KiB),  # the floor
        (64 * KiB, 32, 64 * KiB),  # small shards keep chunk_for's (one chunk, latency-bound)
    ],
)
def test_pipeline_chunk_follows_the_shard_and_the_group(shard, workers, chunk):
    got, window = core.pipeline_for(shard, 1 * MiB, workers, workers, 4)
    assert (got, window) == (chunk, 4)


def test_pipeline_bounds_the_fan_in_and_keeps_the_pipeline_deep():
    """W senders x 4 chunks stay within 512 KiB whenever the floor allows, a shard of 128 KiB and
    more has at least 8 chunks to overlap upload, reduction and download, every size is a multiple
    of 4 KiB within max_chunk, and the window halves only with fewer reducers than workers."""
    for workers in (1, 2, 3, 4, 8, 16, 32, 64, 128, 1024):
        for shard in [k * 64 * KiB for k in range(2, 40)] + [16 * MiB, 64 * MiB, 256 * MiB]:
            for max_chunk in (8 * KiB, 64 * KiB, 1 * MiB):
                chunk, window = core.pipeline_for(shard, max_chunk, workers, workers, 4)
                assert chunk <= max_chunk and chunk % (4 * KiB) == 0
                assert chunk <= core.chunk_for(shard, max_chunk)
                if chunk > 4 * KiB:
                    assert workers * 4 * chunk <= 512 * KiB or chunk == core.chunk_for(shard, max_chunk)
                assert shard // chunk >= 8 or chunk == max_chunk
                assert window == 4
    assert core.pipeline_for(1 * MiB, 1 * MiB, 8, 4, 4)[1] == 2
    assert core.pipeline_for(1 * MiB, 1 * MiB, 8, 4, 1)[1] == 1
