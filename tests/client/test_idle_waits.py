"""An idle worker's failover never makes close(), a call or the process exit wait (issue 28 point 2).

The idle-progress thread (Client.progress_while_idle, csrc/client/idle.cc) joins a failover with
no call inside the client: a reducer's ERROR Failover makes it connect a new session and wait for
the new session's hello replies. A reducer (or an impostor, where no secret is set) that says
"failover" and never answers that hello kept the client's lock for the whole connect timeout:
close() took 18.8 s with connect_timeout=20, an all-reduce with timeout=5 returned after 18.8 s,
and a worker that just exits took 301 s with the default connect timeout. The waits under the
lock now end when close() runs, or when a call has waited its own timeout for them.

Each case runs a real worker (reducer.Communicator, failover on, idle progress on) in a subprocess
against tests/lying_reducer.py's `LyingReducer`, which answers the first session honestly, sends
the idle worker ERROR Failover (naming no reducer: the same one again) and never answers the next
hello. Bounds are generous (a loaded machine), far below the connect timeouts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest
from conftest import child_env_in_tree
from lying_reducer import ERR_FAILOVER, LyingReducer, error_frame

pytestmark = [pytest.mark.timeout(120), pytest.mark.sanitize]

# The reducer package under test (a run with PYTHONPATH naming another tree tests that tree).

_WORKER = r"""
import json, sys, time
import numpy as np
import reducer
args = json.loads(sys.argv[1])
comm = reducer.Communicator([args["address"]], 0, 1, group="idle-waits", timeout=args["timeout"],
                            connect_timeout=args["connect_timeout"], failover=True)
a = np.arange(1024, dtype=np.float32)
comm.allreduce(a)
assert a[5] == 5.0
print("READY", flush=True)
sys.stdin.readline()  # the lie has come and the idle thread waits for the hello's reply
out = {"error": None}
t = time.monotonic()
if args["mode"] == "close":
    comm.close()
elif args["mode"] == "allreduce":
    try:
        comm.allreduce(np.ones(1024, dtype=np.float32))
    except reducer.ReductionError as exc:
        out["error"], out["message"] = type(exc).__name__, str(exc)
    comm.close()
out["seconds"] = time.monotonic() - t
out["exit_at"] = time.time()
print(json.dumps(out), flush=True)
"""


def run(mode: str, timeout: float = 30.0, connect_timeout: float = 20.0) -> dict[str, Any]:
    """The worker's report, plus `exit_seconds`: from its last line to the end of the process."""
    env = child_env_in_tree()
    lie = error_frame(ERR_FAILOVER, b"another worker lost a reducer", tag=0)
    with LyingReducer(idle_lie=(0.2, lie), answer_hellos=1, timeout=60.0) as fake:
        args = {"address": fake.address, "mode": mode, "timeout": timeout, "connect_timeout": connect_timeout}
        proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, json.dumps(args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline().strip() == "READY", proc.stderr.read() if proc.stderr else ""
            # The idle thread read the lie and sent the new session's hello, which stays unanswered.
            assert fake.unanswered.wait(30), "the idle worker never tried the failover session"
            time.sleep(0.5)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            out, err = proc.communicate(timeout=60)
            ended = time.time()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert not fake.errors
    assert proc.returncode == 0, err[-4000:]
    report = json.loads(out.strip().splitlines()[-1])
    report["exit_seconds"] = ended - report["exit_at"]
    return report


def test_close_does_not_wait_for_an_idle_failover_that_is_never_answered():
    report = run("close", connect_timeout=20.0)
    assert report["seconds"] < 2.0, report  # was 18.8 s
    assert report["exit_seconds"] < 10.0, report


def test_a_call_honours_its_timeout_while_the_idle_thread_waits():
    """allreduce(timeout=5) raises after about 5 s (its own timeout), not after the connect timeout:
    the idle pass gives the lock up, its failover is over, and the call reports why."""
    report = run("allreduce", timeout=5.0, connect_timeout=40.0)
    assert report["error"] == "ReductionTimeout", report
    assert "failover" in report["message"] and "waited 5" in report["message"], report
    assert 4.5 <= report["seconds"] < 12.0, report  # was the connect timeout's remainder (~38 s)


def test_a_worker_that_just_exits_is_not_held_by_the_default_connect_timeout():
    """No close() at all: reducer.lifetime closes the communicator at exit (was 301 s)."""
    report = run("exit", connect_timeout=300.0)
    assert report["exit_seconds"] < 10.0, report
