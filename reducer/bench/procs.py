"""The benchmark's process plumbing: the hosts a process runs on (loopback or an emulated host's
network namespace), starting a process that speaks reducer.bench.rank's JSON-lines protocol
(`spawn`, a `_Proc` reading its messages on a thread), and waiting for a message from every
process of a set (`wait_all`), naming the process that died first when something fails.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

_PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the directory holding reducer/: the ranks import it


# ------------------------------------------------------------------------ hosts
class LoopbackHosts:
    """Every process on this machine's loopback."""

    emulated = False

    def bind_host(self, i: int) -> str:
        return "127.0.0.1"

    def set_congestion(self, name: str | None) -> None:
        pass  # only RS_TCP_CONGESTION (rs, ring): the machine's default is not ours to change

    def flow_congestion(self, i: int) -> dict[str, int] | None:
        return None  # loopback connections of the whole machine: not only ours

    def tcp_counters(self) -> dict[str, int] | None:
        return None  # the machine's counters: not only ours

    def popen(self, i: int, argv: Sequence[str], env: dict[str, str], **kw) -> subprocess.Popen:
        full = dict(os.environ)
        full.update(env)
        full["GLOO_SOCKET_IFNAME"] = "lo"
        return subprocess.Popen(list(argv), env=full, **kw)


class NamespaceHosts:
    """Process i in the network namespace of emulated host i (a started reducer.bench.emulate.EmulatedHosts)."""

    emulated = True

    def __init__(self, hosts: Any):
        self.hosts = hosts

    def bind_host(self, i: int) -> str:
        return self.hosts[i].ip

    def set_congestion(self, name: str | None) -> None:
        self.hosts.set_congestion(name)

    def flow_congestion(self, i: int) -> dict[str, int] | None:
        return self.hosts.flow_congestion(i)

    def tcp_counters(self) -> dict[str, int] | None:
        return self.hosts.tcp_counters()

    def popen(self, i: int, argv: Sequence[str], env: dict[str, str], **kw) -> subprocess.Popen:
        return self.hosts.popen(i, argv, env=env, **kw)


# ------------------------------------------------------------------------ processes
class _Proc:
    """A rank process: JSON job on stdin, MARKER lines on stdout (read by a thread)."""

    def __init__(self, name: str, popen: subprocess.Popen, events: queue.Queue, errfile: Any):
        self.name, self.p, self.errfile = name, popen, errfile
        self.log: list[str] = []
        self.finished = False  # said 'done': its exit is expected
        self.errored = False  # reported an error itself: its exit is explained
        self._t = threading.Thread(target=self._read, args=(events,), daemon=True)
        self._t.start()

    def _read(self, events: queue.Queue) -> None:
        # Imported here, not at module level: `python -m reducer.bench.rank` imports this package
        # first, and a module-level import of .rank would make runpy warn about a double import.
        from .rank import MARKER  # noqa: PLC0415 (rank.py loads the C++ core and numpy: not at the CLI's start)

        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith(MARKER):
                try:
                    msg = json.loads(line[len(MARKER) :])
                except ValueError:
                    self.log.append(line.rstrip())
                    continue
                if msg.get("event") == "done":
                    self.finished = True
                elif msg.get("event") == "error":
                    self.errored = True
                events.put((self, msg))
            else:
                self.log.append(line.rstrip())
                del self.log[:-50]
        events.put((self, {"event": "exit"}))

    def send(self, obj: dict[str, Any]) -> None:
        assert self.p.stdin is not None
        try:
            self.p.stdin.write(json.dumps(obj) + "\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def close_stdin(self) -> None:
        try:
            if self.p.stdin:
                self.p.stdin.close()
        except OSError:
            pass

    def stderr_tail(self, lines: int = 15) -> str:
        try:
            self.errfile.flush()
            self.errfile.seek(0)
            text = self.errfile.read()
        except (OSError, ValueError):
            text = ""
        tail = (text.strip().splitlines() + self.log)[-lines:]
        return "\n".join(tail)

    def kill(self, grace: float = 2.0) -> None:
        self.close_stdin()
        if self.p.poll() is None:
            try:
                self.p.terminate()
                self.p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=5)
            except OSError:
                pass
        try:
            self.errfile.close()
        except OSError:
            pass


class BenchError(RuntimeError):
    pass


def spawn(
    hosts: Any,
    host_index: int,
    name: str,
    job: dict[str, Any],
    events: queue.Queue,
    extra_env: dict[str, str] | None = None,
    module: str = "reducer.bench.rank",
    args: Sequence[str] = (),
) -> _Proc:
    """Start `python -m module *args` (a process speaking reducer.bench.rank's JSON-lines protocol)
    on host `host_index` and hand it `job`."""
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_PACKAGE_PARENT), os.environ.get("PYTHONPATH", "")])),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    env.update(extra_env or {})
    errfile = tempfile.TemporaryFile(mode="w+", prefix=f"rsb-{name}-")
    p = hosts.popen(
        host_index,
        [sys.executable, "-m", module, *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errfile,
        text=True,
        bufsize=1,
    )
    proc = _Proc(name, p, events, errfile)
    proc.send(job)
    return proc


def wait_all(
    events: queue.Queue,
    procs: list[_Proc],
    event: str,
    timeout: float,
    on_other: Callable[[_Proc, dict[str, Any]], None] | None = None,
    watch: list[_Proc] | None = None,
    idle: bool = False,
) -> dict[_Proc, dict[str, Any]]:
    """Wait until every proc in `procs` emitted `event`; raise BenchError on error/exit/timeout.
    On an error, a process of `watch` (default `procs`) that died is named as the cause.
    idle: `timeout` counts from the last message received, not from the start."""
    got: dict[_Proc, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(got) < len(procs):
        left = deadline - time.monotonic()
        if left <= 0:
            missing = ", ".join(p.name for p in procs if p not in got)
            raise BenchError(
                f"timed out after {timeout:.0f} s {'without a message ' if idle else ''}waiting for "
                f"'{event}' from {missing}"
            )
        try:
            proc, msg = events.get(timeout=min(left, 1.0))
        except queue.Empty:
            continue
        ev = msg.get("event")
        if ev == "error":
            detail = f"{proc.name}: {msg.get('error')}\n{msg.get('traceback', '')}".rstrip()
            dead = _dead_peer(watch or procs, proc)
            if dead is not None:  # the root cause (e.g. a killed rank), not its neighbour's symptom
                raise BenchError(
                    f"{dead.name} exited (code {dead.p.returncode}) before '{event}':\n"
                    f"{dead.stderr_tail()}\nthen {detail}"
                )
            raise BenchError(detail)
        if ev == "exit":
            if proc.finished:
                continue
            code = proc.p.wait()
            raise BenchError(f"{proc.name} exited (code {code}) before '{event}':\n{proc.stderr_tail()}")
        if idle:
            deadline = time.monotonic() + timeout
        if ev == event and proc in procs:
            got[proc] = msg
        elif on_other is not None:
            on_other(proc, msg)
    return got


def _dead_peer(procs: list[_Proc], reporter: _Proc, grace: float = 1.0) -> _Proc | None:
    """A process of `procs` (other than `reporter`) that exited without finishing, waiting up to
    `grace` seconds: when a rank dies, its neighbours' errors (connection lost) can reach the
    runner before the dead rank's exit does."""
    deadline = time.monotonic() + grace
    while True:
        for p in procs:
            if p is not reporter and not p.finished and not p.errored and p.p.poll() is not None:
                p._t.join(timeout=1.0)  # its last lines are read: an error it reported is seen
                if not p.finished and not p.errored:
                    return p
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
