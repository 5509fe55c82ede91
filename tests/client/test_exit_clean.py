"""Processes that use the library exit with status 0: every thread it starts ends before the
interpreter finalizes (issue 24: PyTorch workers aborted at exit with status 134, "terminate
called without an active exception", in about 1 run of 4).

The default tests take well under a minute on 2 cores: the torch job under the launcher in both
modes (backend collectives in several process groups; DDP with the hook), with one rank cleaning up
(destroy_process_group, HookState.close) and the other not; the DDP example once; processes that
exit with communicators left open, with a round in flight, and with a running reducer dropped.
The 30-run soak the issue asks for is opt-in: `pytest -m soak tests/client/test_exit_clean.py`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from conftest import child_env_in_tree
from paths import ROOT, TESTS

pytestmark = pytest.mark.timeout(300)  # the soak sets its own

WORKER = str(TESTS / "exit_clean_worker.py")
EXAMPLE = os.path.join(ROOT, "examples", "pytorch", "train_ddp.py")
SOAK_RUNS = 30


def _needs(module: str, install: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"needs {module} ({install})")


needs_torch = _needs("torch", "pip install .[torch]")
needs_sklearn = _needs("sklearn", "pip install scikit-learn")


def _env() -> dict:
    return child_env_in_tree(RS_TIMEOUT="60", RS_CONNECT_TIMEOUT="60")


def _launch(command: list[str], reducers: int = 1, timeout: float = 150.0) -> subprocess.CompletedProcess:
    """`reduction-server launch --workers 2 -- command`; relaunched (twice at most) when a free
    port the launcher picked was taken by another process before a reducer or torch bound it
    (not an exit fault)."""
    cmd = [
        sys.executable,
        "-m",
        "reducer.cli.main",
        "launch",
        "--workers",
        "2",
        "--reducers",
        str(reducers),
        "--",
        *command,
    ]
    for _ in range(3):
        proc = subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out = (proc.stdout + proc.stderr).lower()
        if proc.returncode == 0 or not ("eaddrinuse" in out or "address already in use" in out):
            break
    return proc


def _exit_statuses(out: str) -> str:
    lines = [
        ln
        for ln in out.splitlines()
        if "terminate called" in ln
        or "still alive" in ln
        or "exit code" in ln
        or "killed by signal" in ln
        or "Error" in ln
    ]
    return "\n".join(lines[-20:])


def _run_worker_job(args: list[str]) -> None:
    proc = _launch([sys.executable, WORKER, *args])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit status {proc.returncode}:\n{_exit_statuses(out)}\n{out[-3000:]}"
    assert out.count("results exact") == 2, out[-3000:]
    assert "library threads still alive" not in out, out[-3000:]


# -- torch: the backend and the hook, with and without clean-up by the user ------------------------------


@needs_torch
@pytest.mark.parametrize("mode", ["backend", "hook"])
def test_torch_job_exits_clean(mode):
    """Rank 0 cleans up (HookState.close, destroy_process_group), rank 1 just returns: both end
    every library thread before the interpreter finalizes (their last atexit handler checks)
    and exit 0. Fails on the code before the fix: the threads of a communicator never closed
    (and the completion thread) were still running there."""
    _run_worker_job(["--mode", mode, "--clean-up", "even"])


@needs_torch
@needs_sklearn
def test_ddp_example_exits_clean():
    """The command of issue 24: plain DDP over the reduction_server backend, under the launcher."""
    proc = _launch([sys.executable, EXAMPLE, "--no-hook", "--steps", "20"], reducers=2)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit status {proc.returncode}:\n{_exit_statuses(out)}"
    assert "final test_loss" in out


@pytest.mark.soak
@pytest.mark.timeout(3600)
@needs_torch
@needs_sklearn
def test_soak_example_and_torch_jobs_exit_clean():
    """The issue's check, opt-in (about 10 minutes on 2 cores; conftest skips `soak` tests unless
    selected): the example and the torch job 30 times each (the job's mode and clean-up varied),
    exit 0 every time."""
    for run in range(SOAK_RUNS):
        try:
            test_ddp_example_exits_clean()
            _run_worker_job(["--mode", ["backend", "hook"][run % 2], "--clean-up", ["all", "none", "even"][run % 3]])
        except AssertionError as exc:
            raise AssertionError(f"run {run + 1} of {SOAK_RUNS}: {exc}") from None


# -- the worker library without torch -----------------------------------------------------------------

# Run in a fresh interpreter: its first atexit handler (so the last to run) fails the process
# with status 3 if a library thread is still alive just before the interpreter finalizes.
_PRELUDE = textwrap.dedent("""
    import atexit, os, sys, threading
    def _check():
        left = [t.name for t in threading.enumerate() if t.is_alive() and t.name.startswith("reducer")]
        if left:
            sys.stderr.write("library threads still alive at exit: " + ", ".join(left) + "\\n")
            sys.stderr.flush()
            os._exit(3)
    atexit.register(_check)
    import logging, numpy as np, reducer
    logging.basicConfig(level=logging.WARNING)
""")


def _python(body: str, timeout: float = 60.0, **env: str) -> subprocess.CompletedProcess:
    e = _env()
    e.update(env)
    return subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(body)],
        env=e,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_communicator_left_open_ends_its_threads_at_exit():
    """allreduce_async started the fusion threads; the script never closes the communicator."""
    proc = _python("""
        srv = reducer.ReducerServer(host="127.0.0.1", port=0, threads=1).start()
        comm = reducer.Communicator([f"127.0.0.1:{srv.port}"], 0, 1)
        x = np.arange(1000, dtype=np.float64)
        comm.allreduce_async(x).wait()
        assert np.array_equal(x, np.arange(1000, dtype=np.float64))
        print("reduced", flush=True)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reduced" in proc.stdout


def test_exit_with_a_round_in_flight_is_bounded():
    """Rank 0 of 2 starts a round rank 1 never joins, then the process exits: the round fails at
    exit (after a short grace) instead of holding the process for RS_TIMEOUT (here 300 s, far
    beyond the subprocess's limit), and no thread is left in the core when the interpreter finalizes."""
    proc = _python(
        """
        srv = reducer.ReducerServer(host="127.0.0.1", port=0, threads=1).start()
        addr = [f"127.0.0.1:{srv.port}"]
        comms = [None, None]
        def connect(rank):
            comms[rank] = reducer.Communicator(addr, rank, 2, fusion_threshold=0)
        threads = [threading.Thread(target=connect, args=(r,)) for r in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        handle = comms[0].allreduce_async(np.ones(1 << 16, np.float32))
        assert not handle.done()
        print("round in flight", flush=True)
    """,
        timeout=90.0,
        RS_TIMEOUT="300",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "round in flight" in proc.stdout


def test_running_reducer_dropped_without_stop_does_not_deadlock():
    """The reducer's destructor joins its event loops, which log through Python: it runs without
    the GIL now (before, this hung forever on the first try)."""
    proc = _python(
        """
        logging.getLogger("reducer").setLevel(logging.INFO)
        srv = reducer.ReducerServer(host="127.0.0.1", port=0, threads=1).start()
        comm = reducer.Communicator([f"127.0.0.1:{srv.port}"], 0, 1)
        comm.allreduce(np.ones(4, np.float32))
        del srv
        print("dropped", flush=True)
        comm.close()
    """,
        timeout=60.0,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dropped" in proc.stdout


def test_join_threads_warns_and_returns_for_a_stuck_thread(caplog):
    from reducer.lifetime import join_threads

    release = threading.Event()
    stuck = threading.Thread(target=release.wait, name="reducer-test-stuck", daemon=True)
    stuck.start()
    try:
        with caplog.at_level(logging.WARNING, logger="reducer.lifetime"):
            assert join_threads([stuck, threading.current_thread()], 0.05, "the test") is False
        assert any("reducer-test-stuck" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    finally:
        release.set()
        stuck.join(10)
    assert join_threads([stuck], 1.0, "the test") is True


def test_forked_child_leaves_its_parents_communicator_alone():
    """The atexit handlers of a child forked after the communicator was made (run here without
    the child's finalization, whose destructors are another matter) do not close the parent's
    connections: the parent's group still reduces afterwards, without reconnecting."""
    proc = _python("""
        srv = reducer.ReducerServer(host="127.0.0.1", port=0, threads=1).start()
        comm = reducer.Communicator([f"127.0.0.1:{srv.port}"], 0, 1)
        pid = os.fork()
        if pid == 0:
            atexit._run_exitfuncs()
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        x = np.arange(8, dtype=np.float32)
        comm.allreduce(x)
        assert np.array_equal(x, np.arange(8, dtype=np.float32))
        assert comm.stats()["reconnects"] == 0
        print("parent still reduces", flush=True)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "parent still reduces" in proc.stdout
