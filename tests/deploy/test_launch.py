"""`reduction-server launch`: a local cluster of reducer and worker processes.

Real processes on loopback; every launch is bounded by a timeout and every test checks that the
processes it saw (children and grandchildren) are gone afterwards.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from child_lines import ChildLines
from conftest import child_env
from paths import ROOT

from reducer import cluster, launch
from reducer.errors import ConfigError

EXAMPLE = ROOT / "examples" / "allreduce_numpy.py"

pytestmark = pytest.mark.timeout(60)


def _env() -> dict[str, str]:
    return child_env()


def _launch_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "reducer.cli.main", "launch", "--grace-period", "3", *args]


def _run(args: Sequence[str], timeout: float = 45) -> subprocess.CompletedProcess:
    return subprocess.run(
        _launch_argv(*args), env=_env(), cwd=str(ROOT), capture_output=True, text=True, timeout=timeout
    )


def _started_pids(text: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"started (\w+ [\d.]+) \(pid (\d+)\)", text)}


def _printed_pids(text: str) -> list[int]:
    pids: list[int] = []
    for m in re.finditer(r"PIDS ([\d ]+)", text):
        pids.extend(int(p) for p in m.group(1).split())
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie waiting for a parent (e.g. a container's init) to reap it is gone too
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _assert_gone(pids: Sequence[int], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if _alive(p)]
    assert not left, f"processes left behind: {left}"


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


# -- pure functions ------------------------------------------------------------------------------


def test_build_cluster_is_vertex_shaped():
    c = launch.build_cluster(3, 2, base_port=41000)
    assert c == {
        "workerpool0": ["127.0.0.1:41002"],
        "workerpool1": ["127.0.0.1:41003", "127.0.0.1:41004"],
        "workerpool2": ["127.0.0.1:41000", "127.0.0.1:41001"],
    }
    # One worker: no workerpool1 (Vertex leaves unconfigured pools out of CLUSTER_SPEC).
    one = launch.build_cluster(1, 1)
    assert set(one) == {"workerpool0", "workerpool2"}
    ports = [int(a.rsplit(":", 1)[1]) for addrs in one.values() for a in addrs]
    assert len(set(ports)) == 2 and all(p > 0 for p in ports)
    with pytest.raises(ConfigError, match="--workers"):
        launch.build_cluster(0, 1)
    with pytest.raises(ConfigError, match="--base-port"):
        launch.build_cluster(2, 2, base_port=65534)


def test_free_ports_stay_out_of_the_ephemeral_range(monkeypatch):
    """Ports an outgoing connection could take (the kernel's ephemeral range) are never handed out:
    CI once lost a job to a worker's TCPStore port taken in between (EADDRINUSE)."""
    lo, hi = launch._ephemeral_range()
    ports = launch.free_ports(12)
    assert len(set(ports)) == 12
    for p in ports:
        assert launch._LOW_PORT <= p and p + 1 < lo, (p, lo, hi)
        for q in (p, p + 1):  # free, the control port (data + 1) too
            with socket.socket() as s:
                s.bind(("127.0.0.1", q))
    # a system that leaves no room below the range: any free ports, still distinct
    monkeypatch.setattr(launch, "_ephemeral_range", lambda: (1024, 65535))
    assert len(set(launch.free_ports(4))) == 4


def test_worker_env_matches_discovery():
    c = launch.build_cluster(2, 2, base_port=42000)
    inherited = {"RS_PORT": "9999", "TF_CONFIG": "{}", "RS_REDUCERS": "x:1", "PATH": "/bin", "RS_AUTH_TOKEN": "s"}
    seen = []
    for node in range(2):
        for local in range(3):
            env = launch.worker_env(c, node, local, 3, ["python", "train.py"], base=inherited)
            assert "TF_CONFIG" not in env and "RS_PORT" not in env and "RS_REDUCERS" not in env
            assert env["PATH"] == "/bin" and env["RS_AUTH_TOKEN"] == "s"  # the rest is inherited
            spec = json.loads(env["CLUSTER_SPEC"])
            assert spec["environment"] == "cloud"
            assert spec["task"] == launch.node_task(node)
            assert spec["task"]["type"] == ("workerpool0" if node == 0 else "workerpool1")
            assert len(spec["job"]["workerPoolSpecs"]) == 3
            # As Vertex AI sets them for PyTorch: per node.
            assert (env["RANK"], env["WORLD_SIZE"]) == (str(node), "2")
            assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "42002")
            assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(local), "3")
            info = cluster.discover_worker(env)
            assert info.reducers == ["127.0.0.1:42000", "127.0.0.1:42001"]
            assert (info.node_rank, info.num_nodes) == (node, 2)
            seen.append((info.rank, info.world_size))
    assert seen == [(r, 6) for r in range(6)]


def test_resolve_command_and_describe_status():
    assert launch.resolve_command(["--", "python", "x.py"]) == ["python", "x.py"]
    assert launch.resolve_command([str(EXAMPLE), "--iters", "1"])[0] == sys.executable
    with pytest.raises(ConfigError, match="no worker command"):
        launch.resolve_command(["--"])
    assert launch.describe_status(3) == "exit code 3"
    assert launch.describe_status(-9) == "killed by signal SIGKILL (9)"


def test_cli_without_command_is_an_error():
    proc = _run(["--workers", "1", "--reducers", "1"], timeout=20)
    assert proc.returncode == 2
    assert "no worker command" in proc.stderr


# -- real jobs -----------------------------------------------------------------------------------


def test_launch_allreduce_example():
    t0 = time.monotonic()
    proc = _run(["--workers", "2", "--reducers", "2", "--", "python", str(EXAMPLE), "--sizes", "4K,1M", "--iters", "2"])
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, out + err
    # Output prefixes: every process, on the stream it wrote to.
    assert re.search(r"^\[worker 0\.0\] +1MiB .* OK$", out, re.M), out
    assert "[worker 0.0] rank 0 of 2: all 2 sizes correct" in out
    assert "[worker 1.0] rank 1 of 2: all 2 sizes correct" in out
    for i in range(2):
        assert re.search(rf"^\[reducer {i}\] .*listening on 127\.0\.0\.1:\d+", err, re.M), err
        assert re.search(rf"^\[reducer {i}\] .*received SIGTERM", err, re.M), err
    assert "[worker 1.0] INFO reducer.communicator: rank 1 of 2 (from CLUSTER_SPEC), 2 reducers" in err
    assert "all 2 worker process(es) succeeded" in err
    pids = _started_pids(err)
    assert set(pids) == {"reducer 0", "reducer 1", "worker 0.0", "worker 1.0"}
    _assert_gone(list(pids.values()))
    assert time.monotonic() - t0 < 40


def test_failing_worker_stops_the_others(tmp_path):
    script = _script(
        tmp_path,
        "fail.py",
        """
        import os, subprocess, sys, time
        child = subprocess.Popen(["sleep", "120"])          # a grandchild must not survive either
        print("PIDS", os.getpid(), child.pid, flush=True)
        if os.environ["RANK"] == "1":
            time.sleep(0.5)
            print("worker 1 gives up", file=sys.stderr, flush=True)
            sys.exit(3)
        time.sleep(120)
    """,
    )
    t0 = time.monotonic()
    proc = _run(["--workers", "2", "--reducers", "1", "--", "python", str(script)])
    elapsed = time.monotonic() - t0
    err = proc.stderr
    assert proc.returncode == 3, proc.stdout + err
    assert elapsed < 20, "the sleeping worker was not stopped"
    assert "[worker 1.0] worker 1 gives up" in err
    pids = _started_pids(err)
    assert re.search(rf"worker 1\.0 \(pid {pids['worker 1.0']}\) failed: exit code 3; stopping the 2 other", err), err
    assert "job failed: worker 1.0" in err and "exit status 3" in err
    assert re.search(r"worker 0\.0 +pid \d+ +killed by signal SIGTERM \(15\) \(stopped by the launcher\)", err), err
    printed = _printed_pids(proc.stdout)
    assert len(printed) == 4, proc.stdout
    _assert_gone(list(pids.values()) + printed)


def test_worker_killed_by_signal_is_reported(tmp_path):
    script = _script(
        tmp_path,
        "crash.py",
        """
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
    """,
    )
    proc = _run(["--workers", "1", "--reducers", "1", "--", str(script)])
    assert proc.returncode == 128 + 9, proc.stderr
    assert "worker 0.0" in proc.stderr and "failed: killed by signal SIGKILL (9)" in proc.stderr
    _assert_gone(list(_started_pids(proc.stderr).values()))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_everything(tmp_path, sig):
    script = _script(
        tmp_path,
        "sleepy.py",
        """
        import os, subprocess, time
        child = subprocess.Popen(["sleep", "120"])
        print("PIDS", os.getpid(), child.pid, flush=True)
        time.sleep(120)
    """,
    )
    proc = subprocess.Popen(
        _launch_argv("--workers", "2", "--reducers", "1", "--", "python", str(script)),
        env=_env(),
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = ChildLines(proc.stdout, "launch stdout"), ChildLines(proc.stderr, "launch stderr")
    try:
        deadline = time.monotonic() + 30
        while len(_printed_pids(out.text())) < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert len(_printed_pids(out.text())) == 4, out.text() + err.text()
        proc.send_signal(sig)
        rc = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out.join(5)
    err.join(5)
    assert rc == 128 + sig, err.text()
    assert f"received {sig.name}: stopping all 3 process(es)" in err.text()
    assert f"interrupted by {sig.name}" in err.text()
    pids = _started_pids(err.text())
    assert len(pids) == 3
    _assert_gone(list(pids.values()) + _printed_pids(out.text()))


def test_procs_per_worker_global_ranks(tmp_path):
    script = _script(
        tmp_path,
        "ranks.py",
        """
        import json, os
        import numpy as np
        import reducer
        comm = reducer.init()
        onehot = np.zeros(comm.world_size, dtype=np.int64)
        onehot[comm.rank] = 1
        comm.allreduce(onehot)                # every rank exactly once -> all ones
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        print("RANKINFO " + json.dumps({"rank": comm.rank, "world": comm.world_size,
                                        "sum": onehot.tolist(), "env": {k: os.environ[k] for k in keys},
                                        "task": json.loads(os.environ["CLUSTER_SPEC"])["task"]}), flush=True)
        comm.close()
    """,
    )
    proc = _run(["--workers", "2", "--reducers", "1", "--procs-per-worker", "2", "--", "python", str(script)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    infos = {}
    for m in re.finditer(r"^\[worker (\d)\.(\d)\] RANKINFO (.*)$", proc.stdout, re.M):
        infos[(int(m.group(1)), int(m.group(2)))] = json.loads(m.group(3))
    assert sorted(infos) == [(0, 0), (0, 1), (1, 0), (1, 1)], proc.stdout
    ports = set()
    for (node, local), info in infos.items():
        assert info["rank"] == node * 2 + local
        assert info["world"] == 4
        assert info["sum"] == [1, 1, 1, 1]
        env = info["env"]
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(node), "2")
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(local), "2")
        assert env["MASTER_ADDR"] == "127.0.0.1"
        ports.add(env["MASTER_PORT"])
        assert info["task"] == (
            {"type": "workerpool0", "index": 0, "trial": ""}
            if node == 0
            else {"type": "workerpool1", "index": 0, "trial": ""}
        )
    assert len(ports) == 1
    _assert_gone(list(_started_pids(proc.stderr).values()))


def test_missing_command_is_reported():
    """Found before anything starts (issue 30 point 4: a reducer was started and 21 lines printed)."""
    proc = _run(["--workers", "1", "--reducers", "1", "--", "no-such-command-rs", "--flag"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "reduction-server launch: error: worker command 'no-such-command-rs': no such program "
        "(not on PATH, or not executable)"
    ), proc.stderr
    assert not _started_pids(proc.stderr) and "[reducer" not in proc.stdout + proc.stderr


def _processes_with_args(*args: str) -> dict[str, int]:
    """{arg: pid} of this user's live `sleep ARG` processes, for the given (unique) arguments."""
    found: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if len(argv) >= 2 and argv[0].endswith(b"sleep") and argv[1].decode(errors="replace") in args:
            if _alive(int(entry)):
                found[argv[1].decode()] = int(entry)
    return found


def test_sigkilled_launcher_takes_the_whole_job_with_it(tmp_path):
    """kill -9 on the launcher: its direct children die by PDEATHSIG, and what a worker started
    (here a shell's background and foreground sleeps) dies too, through the guard (issue 29,
    point 6). Unique sleep lengths find the sleeps; leftovers are killed in teardown."""
    tag = f"{os.getpid() % 1000:03d}{time.monotonic_ns() % 1000:03d}"
    first, second = f"41.{tag}", f"42.{tag}"
    log = open(tmp_path / "launch.log", "w+")
    proc = subprocess.Popen(
        _launch_argv("--workers", "1", "--reducers", "1", "--", "bash", "-c", f"sleep {first} & sleep {second}"),
        env=_env(),
        cwd=str(ROOT),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    sleeps: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 40
        while len(sleeps) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            sleeps = _processes_with_args(first, second)
        log.seek(0)
        text = log.read()
        assert len(sleeps) == 2, text
        started = _started_pids(text)
        assert sorted(started) == ["reducer 0", "worker 0.0"], text
        proc.kill()
        proc.wait(10)
        _assert_gone(list(started.values()) + list(sleeps.values()), timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in _processes_with_args(first, second).values():  # what the launcher left behind
            os.kill(pid, signal.SIGKILL)
        log.close()
