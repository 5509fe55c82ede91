"""A forked child owns nothing of its parent's connections (issue 28 point 3).

A child of a worker (PyTorch's DataLoader forks its workers by default) has a copy of every
client, but not the parent's threads, and the connections stay the parent's. Before: a child
forked while a thread of the parent held a client's lock deadlocked in close() (1 child of 40),
and a child that exited normally said goodbye and shut down the parent's sockets, so the parent's
next all-reduce failed ("PeerLostError: every reducer is lost"). Now at-fork handlers mark every
client of the child inherited (csrc/client/idle.cc): it never sends, never shuts down, never
takes the parent's lock; a Communicator copied into a child closes nothing (reducer.communicator).

The parent runs in a subprocess (the reducers run in the test process, which must not fork): two
worker threads, one Communicator each (a group of two), all-reduce without pause and leave the
idle-progress thread a pass every millisecond between rounds, while the main thread forks
children that leave in every way: sys.exit (the interpreter's finalization frees the copies),
os._exit, close() then sys.exit, a round attempted (a ConfigError) then sys.exit. Every child must
end within its bound, and every round of the parent, during and after, must be exact.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import addresses, child_env_in_tree

pytestmark = [pytest.mark.timeout(180), pytest.mark.sanitize]

CHILDREN = 48

_PARENT = r"""
import json, os, sys, threading, time
import numpy as np
import reducer
args = json.loads(sys.argv[1])
W, N = 2, 4096
comms = [None] * W
def connect(r):
    comms[r] = reducer.Communicator(args["addresses"], r, W, group="fork", timeout=30.0, connect_timeout=30.0,
                                    failover=True)
    comms[r]._client.progress_while_idle(0.001)  # a pass every millisecond between rounds
ts = [threading.Thread(target=connect, args=(r,)) for r in range(W)]
[t.start() for t in ts]; [t.join() for t in ts]
limit = [1 << 30]  # rounds each rank runs: set once the children are done (the same for both)
rounds = [0] * W
errors = []
def work(r):
    k = 0
    try:
        while k < limit[0]:
            a = np.arange(N, dtype=np.float32) * (r + 1) + k
            comms[r].allreduce(a)
            want = np.arange(N, dtype=np.float32) * 3 + 2 * k
            if not np.array_equal(a, want):
                errors.append(f"rank {r} round {k}: wrong result")
                return
            k += 1
            rounds[r] = k
            time.sleep(0.002 * (k % 3))  # idle gaps: the idle thread takes the lock in them
    except Exception as exc:
        errors.append(f"rank {r} round {k}: {type(exc).__name__}: {exc}")
workers = [threading.Thread(target=work, args=(r,)) for r in range(W)]
[t.start() for t in workers]
MODES = ["sys.exit", "os._exit", "close", "call"]
children = []
for i in range(args["children"]):
    time.sleep(0.01 * (i % 4))
    mode = MODES[i % len(MODES)]
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if mode == "os._exit":
                os._exit(0)
            if mode == "close":
                for c in comms:
                    c.close()
            if mode == "call":
                try:
                    comms[0].allreduce(np.ones(4, dtype=np.float32))
                    code = 3
                except reducer.ConfigError as exc:
                    code = 0 if "forked" in str(exc) else 4
                if comms[1]._client.connected or comms[1]._client.in_flight:
                    code = 5
        except BaseException:
            code = 6
        sys.exit(code)
    children.append((pid, mode, time.monotonic()))
report = {"children": [], "errors": errors}
for pid, mode, started in children:
    deadline = started + 30
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        status = "hung"
    report["children"].append([mode, status if status == "hung" else os.waitstatus_to_exitcode(status)])
limit[0] = max(rounds) + 10  # (the ranks are within a round of each other: all-reduces pair them)
[t.join(60) for t in workers]
report["rounds"] = rounds
for c in comms:
    c.close()
print(json.dumps(report), flush=True)
"""


def test_forked_children_leave_the_parents_connections_alone(reducers):
    servers = reducers(2)
    env = child_env_in_tree()
    args = {"addresses": addresses(servers), "children": CHILDREN}
    proc = subprocess.run(
        [sys.executable, "-c", _PARENT, json.dumps(args)], capture_output=True, text=True, timeout=150, env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["errors"] == [], report
    bad = [c for c in report["children"] if c[1] != 0]
    assert not bad, report["children"]
    assert len(report["children"]) == CHILDREN
    assert min(report["rounds"]) >= 20, report["rounds"]
