"""A worker SIGKILLed mid-round of a 2-worker group: the survivor raises, it never waits forever.

Also the soak (benchmarks/soak.py), whose two kinds of "hang" after a worker kill were its own:
its shared multiprocessing.Queue hung the survivor's reports when the killed worker held the
queue's write lock (now a pipe per worker: a report cut mid-message costs only that pipe), and
its hang threshold could be below the workers' connect_timeout, which bounds a survivor's wait
for a dead peer at a failover session's rendezvous (now refused).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import struct
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import reducer
from benchmarks import soak

pytestmark = pytest.mark.timeout(180)

CLIENT_TIMEOUT = 60.0  # far above how long a peer's death takes to reach the survivor


def _received_everywhere(servers: Sequence[Any], group: str) -> bool:
    """Every reducer has taken bytes of a round of `group` (refreshed every 250 ms)."""
    return all(any(r["group"] == group and r["bytes_received"] > 0 for r in srv.group_stats()) for srv in servers)


def _wait_for(cond: Any, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def join_then_round(
    addrs: Sequence[str], rank: int, group: str, n: int, go_file: str, connect_timeout: float = 60.0
) -> dict[str, Any]:
    """Joins the 2-worker group, enters one all-reduce of n float32 once `go_file` exists (at once
    if empty), and reports how it ended."""
    comm = reducer.Communicator(addrs, rank, 2, group=group, timeout=CLIENT_TIMEOUT, connect_timeout=connect_timeout)
    while go_file and not os.path.exists(go_file):
        time.sleep(0.02)
    try:
        comm.allreduce(np.ones(n, np.float32))
        out = {"error": None}
    except reducer.ReductionError as exc:
        out = {"error": exc}
    comm.close()
    return out


def join_and_stay(addrs: Sequence[str], rank: int, group: str) -> None:
    """Joins the 2-worker group and sends nothing (the process the test kills)."""
    comm = reducer.Communicator(addrs, rank, 2, group=group, timeout=CLIENT_TIMEOUT, connect_timeout=60)
    time.sleep(600)
    comm.close()


@pytest.mark.parametrize("victim_state", ["silent", "sending"])
def test_survivor_raises_when_its_peer_is_killed_mid_round(pool, reducers, tmp_path, victim_state):
    """silent: the survivor is in the round (its data reached every reducer), the victim has
    sent nothing. sending: the victim is in the round (its data reached every reducer), the
    survivor enters after the kill. Either way the survivor gets PeerLostError naming rank 1,
    from the death (not from its own timeout)."""
    servers = reducers(2)
    addrs = [s.address for s in servers]
    group = f"peerdeath-{victim_state}"
    go = str(tmp_path / "go") if victim_state == "sending" else ""
    ctx = mp.get_context("spawn")
    victim_args: tuple = (addrs, 1, group, 4 << 20, "") if victim_state == "sending" else (addrs, 1, group)
    victim = ctx.Process(
        target=join_then_round if victim_state == "sending" else join_and_stay, args=victim_args, daemon=True
    )
    victim.start()
    try:
        fut = pool.submit(join_then_round, addrs, 0, group, 1 << 20, go)
        _wait_for(lambda: _received_everywhere(servers, group), "no round of the group reached every reducer")
        victim.kill()
        victim.join(10)
        if go:
            open(go, "w").close()
        out = fut.result(timeout=2 * CLIENT_TIMEOUT)  # a survivor that waits forever fails here
    finally:
        if victim.is_alive():
            victim.kill()
    err = out["error"]
    assert isinstance(err, reducer.PeerLostError), repr(err)
    assert "rank 1" in str(err), str(err)


def test_soak_drain_drops_a_pipe_cut_mid_message_and_keeps_the_others():
    """A worker killed while writing a report leaves a torn frame then EOF on its own pipe; the
    driver takes what came before, drops that pipe, and still gets every other worker's reports."""
    ctx = mp.get_context("spawn")
    (r0, w0), (r1, w1) = ctx.Pipe(duplex=False), ctx.Pipe(duplex=False)
    w0.send(("done", 0, 7, None))
    os.write(w0.fileno(), struct.pack("!i", 100) + b"\x80\x04" * 5)  # a frame of 100 bytes, cut at 10
    w0.close()
    for i in range(3):
        w1.send(("done", 1, i, None))
    got: list[tuple] = []
    conns = {r0: 0, r1: 1}
    for _ in range(50):  # a bound, not a timing: each call handles what is ready
        if len(got) == 4 and r0 not in conns:
            break
        soak.drain(conns, lambda *msg: got.append(msg), timeout=1.0)
    assert sorted(got) == [("done", 0, 7, None), ("done", 1, 0, None), ("done", 1, 1, None), ("done", 1, 2, None)]
    assert conns == {r1: 1}  # worker 1 has not ended: its pipe stays
    w1.send(("stats", 1, 0, {"reducer_failovers": 0}))
    w1.close()
    for _ in range(50):
        if not conns:
            break
        soak.drain(conns, lambda *msg: got.append(msg), timeout=1.0)
    assert got[-1] == ("stats", 1, 0, {"reducer_failovers": 0})
    assert conns == {}


def test_survivor_raises_when_its_peer_died_before_a_failover_session(pool, reducers):
    """A reducer dies mid-round; the survivor moves to a failover session on the other reducer,
    and its peer dies before it noticed the loss, so it never comes there. That rendezvous waits up to
    connect_timeout (docs/protocol.md), then raises; it does not wait forever (the soak's
    second kind of "hang": its hang threshold was below the workers' connect_timeout).
    The peer is frozen (SIGSTOP) before the reducer stops: a live idle peer would read the loss on
    its idle-progress thread and join the failover session (tests/client/test_cross_group_failover.py)."""
    servers = reducers(2)
    addrs = [s.address for s in servers]
    group = "peerdeath-failover"
    victim = mp.get_context("spawn").Process(target=join_and_stay, args=(addrs, 1, group), daemon=True)
    victim.start()
    try:
        fut = pool.submit(join_then_round, addrs, 0, group, 1 << 20, "", 8.0)
        _wait_for(lambda: _received_everywhere(servers, group), "no round of the group reached every reducer")
        os.kill(victim.pid, signal.SIGSTOP)  # it can notice nothing from now on
        servers[1].stop()
        # The survivor is in the failover session's rendezvous on servers[0] (a new session of the
        # group, rank 0 connected) when its peer dies, which has not noticed the loss (frozen).
        _wait_for(
            lambda: any(
                r["group"] != group and r["group"].startswith(group) and r["connected"] == 1
                for r in servers[0].group_stats()
            ),
            "the survivor started no failover session",
        )
        victim.kill()
        victim.join(10)
        out = fut.result(timeout=2 * CLIENT_TIMEOUT)  # a survivor that waits forever fails here
    finally:
        if victim.is_alive():
            victim.kill()
    err = out["error"]
    assert isinstance(err, reducer.ReductionTimeout), repr(err)  # connect_timeout 8 s < timeout 60 s
    assert "waiting for all workers of the group" in str(err), str(err)


def test_soak_refuses_a_hang_threshold_below_the_workers_bounded_waits(capsys):
    with pytest.raises(SystemExit):
        soak.parse_args(["--hang-seconds", "60"])  # connect_timeout 120 + timeout 20
    assert "--connect-timeout + --timeout = 140 s" in capsys.readouterr().err
    args = soak.parse_args(["--hang-seconds", "60", "--connect-timeout", "30"])
    assert (args.hang_seconds, args.connect_timeout, args.timeout) == (60.0, 30.0, 20.0)
