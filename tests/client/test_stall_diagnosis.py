"""A stalled round explains itself (issue 31: the W=32 stall was TCP retransmission backoff, seen
only with `ss -ti`).

The no-progress ReductionTimeout, and the WARNING the worker logs half way to it, give each stuck
link's TCP state from TCP_INFO (unacked segments, retransmissions, backoff, RTO, round trip, cwnd,
the peer's window, time since the last send) and a reading where it is plain:

- a reducer that stopped reading (SIGSTOP): its receive window is zero once its buffer is full,
  or, with little in flight, nothing is unacked and the worker waits on it;
- a path that drops every packet (a namespace whose link is set down): retransmission backoff.

Before, the message said only "sent 4/32 chunks, got 0/32 results". Real reducers and sockets;
after the stopped reducer continues, the next round (a new session) is exact.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest
from attack_tools import ReducerProcess
from child_lines import ChildLines
from conftest import child_env_in_tree

import reducer
from reducer.bench import emulate
from reducer.bench.emulate import EmulatedHosts

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 3.0  # seconds without progress: the warning comes at half of it


def stalled_round(comm: reducer.Communicator, pid: int, n: int) -> str:
    """The ReductionTimeout text of a round of `n` float32 while the reducer `pid` is stopped."""
    a = np.ones(n, dtype=np.float32)
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(reducer.ReductionTimeout) as info:
            comm.allreduce(a)
    finally:
        os.kill(pid, signal.SIGCONT)
    return str(info.value)


def exact_round(comm: reducer.Communicator, n: int) -> None:
    a = np.arange(n, dtype=np.float32) % 1000 - 7
    want = a.copy()
    comm.allreduce(a)  # world 1: the sum is the input, bit for bit
    assert np.array_equal(a, want)


@pytest.mark.parametrize(
    "window,elements,buffers,reading",
    [
        # 4 chunks of 128 KiB in flight (pipeline_for's window for a 64 MiB shard of one worker):
        # more than the stopped reducer's and the worker's 64 KiB socket buffers hold.
        (64, 16 << 20, 64 << 10, "the peer's receive window is zero: the reducer is not reading"),
        # 2 chunks: its kernel takes them all; nothing is in flight.
        (2, 1 << 20, 0, "nothing unacked: waiting on the reducer"),
    ],
)
def test_a_stopped_reducer_is_named_with_its_tcp_state(tmp_path, caplog, window, elements, buffers, reading):
    sized = {"socket_buffer": buffers} if buffers else {}
    with ReducerProcess(str(tmp_path), threads=1, **sized) as red:
        comm = reducer.Communicator([red.address], 0, 1, group="stall", timeout=TIMEOUT, window=window, **sized)
        try:
            exact_round(comm, 4096)
            with caplog.at_level(logging.WARNING, logger="reducer.core"):
                text = stalled_round(comm, red.pid, elements)
            assert "made no progress for 3.0 s" in text, text
            assert re.search(r"tcp: unacked \d+ segs, retrans \d+ \(total \d+\), backoff \d+, rto ", text), text
            assert reading in text, text
            # Half way to the timeout the worker logged the same state at WARNING.
            warned = [r.getMessage() for r in caplog.records if "still waiting" in r.getMessage()]
            assert len(warned) == 1 and reading in warned[0], warned
            assert warned[0].startswith("rank 0, still waiting (RS_TIMEOUT 3.0 s): all-reduce round"), warned
            # The reducer reads again: the next round (a new session) is exact.
            exact_round(comm, elements)
        finally:
            comm.close()


def test_a_reducer_that_stops_reading_is_waited_for_without_spinning(tmp_path):
    """A hostile or frozen reducer stops reading while the worker has frames queued (64 chunks of
    128 KiB, 64 KiB socket buffers): the worker's writes would block. It then waits for the socket
    to become writable (the epoll set asks for it: client/waits.cc) instead of retrying at once,
    so the stalled round costs this process almost no CPU until its ReductionTimeout (a worker that
    retried the write in a loop would burn the whole 3 s). After the reducer reads again, the next
    round is exact."""
    sized = {"socket_buffer": 64 << 10}
    with ReducerProcess(str(tmp_path), threads=1, **sized) as red:
        comm = reducer.Communicator([red.address], 0, 1, group="spin", timeout=TIMEOUT, window=64, **sized)
        try:
            exact_round(comm, 4096)
            cpu = time.process_time()
            text = stalled_round(comm, red.pid, 16 << 20)
            used = time.process_time() - cpu
            assert "the peer's receive window is zero" in text, text
            assert used < 1.0, f"{used:.2f} s of CPU in a {TIMEOUT} s stall: the worker spun on a blocked socket"
            exact_round(comm, 16 << 20)
        finally:
            comm.close()


# ---- a path that drops everything (network namespaces) ----------------------------------------

_REASON = emulate.unavailable_reason()
needs_netns = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))

WORKER = textwrap.dedent("""
    import logging, sys
    import numpy as np
    import reducer
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
    comm = reducer.Communicator([sys.argv[1]], 0, 1, group="cut", timeout=float(sys.argv[2]), connect_timeout=30)
    a = np.arange(4096, dtype=np.int32)
    comm.allreduce(a)
    print("ready" if np.array_equal(a, np.arange(4096, dtype=np.int32)) else "wrong", flush=True)
    sys.stdin.readline()
    try:
        comm.allreduce(np.ones(1 << 20, dtype=np.float32))
        print("done", flush=True)
    except reducer.ReductionError as e:
        print("err", type(e).__name__, str(e).replace(chr(10), " "), flush=True)
""")


@pytest.mark.netns
@needs_netns
def test_a_path_that_drops_every_packet_shows_retransmission_backoff():
    """Reducer and worker in two namespaces; after an exact round the reducer's interface is set
    down (every packet to it is dropped, no RST) and the worker starts a 4 MiB round with a 6 s
    timeout: its message (and the warning at 3 s) show the unacked segments, backoff > 0 and
    the reading 'retransmission backoff'. TCP_USER_TIMEOUT (15 s) does not end it first."""
    octet = uuid.uuid4().int % 200 + 20  # (EmulatedHosts removes its namespaces however it ends)
    with EmulatedHosts(
        2, gbps=1.0, prefix=f"d{uuid.uuid4().hex[:6]}", latency_ms=0.5, subnet=f"10.{octet}.9.0/24"
    ) as hosts:
        env = child_env_in_tree()
        addr = f"{hosts[0].ip}:7412"
        serve = [sys.executable, "-m", "reducer.cli.main", "serve", "--host", hosts[0].ip, "--port", "7412"]
        red = hosts.popen(0, [*serve, "--threads", "1", "--control-port", "off"], env=env, stdout=subprocess.DEVNULL)
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        worker = hosts.popen(1, [sys.executable, "-c", WORKER, addr, "6"], env=env, **pipes)
        try:
            lines = ChildLines(worker.stdout, "worker")
            assert lines.wait_for("ready", 60) == "ready\n", lines.text()
            subprocess.run(["ip", "-n", hosts[0].netns, "link", "set", hosts[0].ifname, "down"], check=True)
            worker.stdin.write("go\n")
            worker.stdin.flush()
            err = lines.wait_for("err ", 60)
            assert err.startswith("err ReductionTimeout "), lines.text()
            backoff = re.search(r"unacked (\d+) segs, retrans \d+ \(total (\d+)\), backoff (\d+)", err)
            assert backoff and int(backoff[1]) > 0 and int(backoff[2]) > 0 and int(backoff[3]) > 0, err
            assert "retransmission backoff: the path dropped packets; TCP will retry in ~" in err, err
            warning = lines.wait_for("still waiting", 1)
            assert warning.startswith("WARNING rank 0, still waiting (RS_TIMEOUT 6.0 s)") and "backoff" in warning
        finally:
            for p in (worker, red):
                p.kill()
                p.wait(20)
