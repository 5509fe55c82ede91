"""The local launcher: a whole reduction-server job on one machine.

``reduction-server launch --workers W --reducers R [--procs-per-worker L] -- COMMAND ...`` runs
R reducer processes (``reduction-server serve``) and W x L worker processes of COMMAND on this
machine, on 127.0.0.1 with free ports. Every process gets the environment it would get on
Vertex AI, so the same training script runs unchanged here and there:

- ``CLUSTER_SPEC``: ``workerpool0`` = worker node 0 (the primary), ``workerpool1`` = nodes
  1..W-1 (absent when W = 1), ``workerpool2`` = the reducers; ``task`` is the process's own
  node (``workerpool0``/0 or ``workerpool1``/node-1; ``workerpool2``/i for reducer i);
- workers also get ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` (like torchrun), and, as Vertex AI sets
  them for PyTorch, per *node*: ``RANK`` = node index, ``WORLD_SIZE`` = W (number of nodes),
  ``MASTER_ADDR`` / ``MASTER_PORT`` = node 0's address. The global rank of a process is
  ``RANK * LOCAL_WORLD_SIZE + LOCAL_RANK`` (what ``reducer.init()`` computes).

Output lines are prefixed with ``[reducer i]`` / ``[worker node.local]``. The launcher returns
0 when every worker succeeds, else the status of the first worker that failed (128 + N for a
worker killed by signal N); when any process fails, or on SIGINT/SIGTERM, it stops all the others
(SIGTERM to their process groups, SIGKILL after the grace period) and says who failed and why.
Each child runs in its own session (process group), and the whole group is killed, so nothing a
worker started is left behind. A launcher killed by SIGKILL takes its job with it too: its direct
children die with it (PR_SET_PDEATHSIG) and a guard process kills their groups (launch_guard.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import random
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from .addresses import MAX_PORT, format_address, is_ipv6, parse_address
from .errors import ConfigError
from .launch_guard import Guard

log = logging.getLogger("reducer.launch")

__all__ = ["launch", "build_cluster", "cluster_spec", "worker_env", "free_ports", "describe_status"]

# Cluster / rank variables a child must not inherit from the launcher's own environment: the
# launcher sets the ones that apply, and e.g. an inherited RS_PORT would put every reducer on
# one port.
# What a child must not inherit from the launcher's own environment: it would change what the
# child discovers (tests/conftest.py builds its children's environments from it too).
CLEARED_ENV = (
    "CLUSTER_SPEC",
    "TF_CONFIG",
    "RS_REDUCERS",
    "RS_RANK",
    "RS_WORLD_SIZE",
    "RS_PORT",
    "RS_HOST",
    "RS_ADVERTISE_ADDRESS",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "LOCAL_ADDR",
)

_POLL_INTERVAL = 0.1  # seconds between checks of the children (the loop sleeps in select())


# -- the cluster description ------------------------------------------------------------------------


# Launcher ports come from below the kernel's ephemeral range (net.ipv4.ip_local_port_range):
# an outgoing connection of any process takes its local port from that range, so a free port
# chosen there can be taken between now and the moment the child binds it (seen in CI: a
# worker's TCPStore failed with EADDRINUSE). Below 10000 are the registered services.
_LOW_PORT = 10000
_EPHEMERAL_DEFAULT = (32768, 60999)


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def _bind(host: str, port: int) -> socket.socket | None:
    s = socket.socket(socket.AF_INET6 if is_ipv6(host) else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, port))
        return s
    except OSError:
        s.close()
        return None


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that are free on `host` right now, each with the next port free too
    (a reducer's control port is its data port + 1), outside the ephemeral range when the system
    leaves room below it (else any free ports). They are held open together, then released."""
    lo, _ = _ephemeral_range()
    rng = random.SystemRandom()
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        attempts = 0
        while lo - _LOW_PORT >= 1000 and len(ports) < count and attempts < 200 * count:
            attempts += 1
            p = rng.randrange(_LOW_PORT, lo - 1)
            if p in ports or p + 1 in ports or p - 1 in ports:
                continue
            pair = [_bind(host, p), _bind(host, p + 1)]
            socks.extend(s for s in pair if s is not None)
            if None not in pair:
                ports.append(p)
        while len(ports) < count:  # no room below the ephemeral range: the kernel picks
            s = _bind(host, 0)
            if s is None:
                raise ConfigError(f"cannot find free ports on {host}")
            socks.append(s)
            ports.append(s.getsockname()[1])
        return ports
    finally:
        for s in socks:
            s.close()


def build_cluster(
    workers: int, reducers: int, host: str = "127.0.0.1", base_port: int | None = None
) -> dict[str, list[str]]:
    """The ``cluster`` part of CLUSTER_SPEC: reducers get ports base_port + i, worker nodes
    base_port + R + n (or free ports when base_port is None)."""
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, found {workers}")
    if reducers < 1:
        raise ConfigError(f"--reducers must be >= 1, found {reducers}")
    n = workers + reducers
    if base_port is None:
        ports = free_ports(n, host)
    else:
        if not 1 <= base_port or base_port + n - 1 > MAX_PORT:
            raise ConfigError(f"--base-port {base_port} does not leave room for {n} ports (1-{MAX_PORT})")
        ports = list(range(base_port, base_port + n))
    red, wrk = ports[:reducers], ports[reducers:]
    cluster = {"workerpool0": [format_address(host, wrk[0])]}
    if workers > 1:
        cluster["workerpool1"] = [format_address(host, p) for p in wrk[1:]]
    cluster["workerpool2"] = [format_address(host, p) for p in red]
    return cluster


def node_task(node: int) -> dict[str, Any]:
    """CLUSTER_SPEC task of worker node `node`: the primary is workerpool0/0, node n is workerpool1/n-1."""
    if node == 0:
        return {"type": "workerpool0", "index": 0, "trial": ""}
    return {"type": "workerpool1", "index": node - 1, "trial": ""}


def cluster_spec(cluster: Mapping[str, list[str]], task: Mapping[str, Any], command: Sequence[str] = ()) -> str:
    """A Vertex-AI-shaped CLUSTER_SPEC (JSON text)."""

    def pool(name: str, args: Sequence[str]) -> dict[str, Any]:
        if not cluster.get(name):
            return {}
        return {
            "machineSpec": {"machineType": "local"},
            "replicaCount": len(cluster[name]),
            "containerSpec": {"imageUri": "local", "args": list(args)},
        }

    job = {
        "workerPoolSpecs": [
            pool("workerpool0", command),
            pool("workerpool1", command),
            pool("workerpool2", ["reduction-server", "serve"]),
        ]
    }
    return json.dumps({"cluster": dict(cluster), "environment": "cloud", "task": dict(task), "job": job})


def worker_env(
    cluster: Mapping[str, list[str]],
    node: int,
    local_rank: int,
    procs_per_worker: int,
    command: Sequence[str] = (),
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of worker process (node, local_rank)."""
    env = _base_env(base)
    primary_host, primary_port = parse_address(cluster["workerpool0"][0])
    num_nodes = len(cluster["workerpool0"]) + len(cluster.get("workerpool1", []))
    env.update(
        {
            "CLUSTER_SPEC": cluster_spec(cluster, node_task(node), command),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(procs_per_worker),
            # As Vertex AI sets them for PyTorch: per node, not per process.
            "RANK": str(node),
            "WORLD_SIZE": str(num_nodes),
            "MASTER_ADDR": primary_host,
            "MASTER_PORT": str(primary_port),
        }
    )
    return env


def _base_env(base: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for k in CLEARED_ENV:
        env.pop(k, None)
    env.setdefault("PYTHONUNBUFFERED", "1")  # so output lines arrive when printed
    return env


def describe_status(returncode: int) -> str:
    """'exit code 3' / 'killed by signal SIGKILL (9)'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "signal"
        return f"killed by signal {name} ({-returncode})"
    return f"exit code {returncode}"


def _exit_status(returncode: int) -> int:
    """A child's returncode as a shell would report it (128 + N for signal N)."""
    return 128 - returncode if returncode < 0 else returncode


# -- processes ------------------------------------------------------------------------------------


def _pdeathsig_preexec():
    """preexec_fn: the child gets SIGKILL if the launcher dies without cleaning up (Linux)."""
    libc = None
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        except OSError:
            libc = None
    if libc is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


@dataclass
class _Proc:
    role: str  # "reducer" or "worker"
    label: str  # "reducer 0", "worker 1.0"
    popen: subprocess.Popen
    ready_file: str | None = None
    returncode: int | None = None
    stopped: bool = False  # we sent it a signal
    partial: dict[int, bytes] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.returncode is None

    @property
    def exit_code(self) -> int:
        """The returncode of a process that has exited."""
        assert self.returncode is not None, f"{self.label} is still running"
        return self.returncode


class _Output:
    """Writes child output line by line with a prefix; tolerates a closed stdout."""

    def __init__(self, out: IO[Any] | None, err: IO[Any] | None) -> None:
        self.streams = {1: out if out is not None else sys.stdout, 2: err if err is not None else sys.stderr}
        self.broken: set[int] = set()

    def write(self, which: int, data: bytes) -> None:
        if which in self.broken:
            return
        stream = self.streams[which]
        try:
            buf = getattr(stream, "buffer", None)
            if buf is not None:
                stream.flush()
                buf.write(data)
                buf.flush()
            else:
                stream.write(data.decode("utf-8", "replace"))
                stream.flush()
        except (BrokenPipeError, ValueError, OSError):
            self.broken.add(which)


def _report(procs: Sequence[_Proc], failure: str | None, status: int | None) -> None:
    """The end of a job in the log: reducers that did not stop cleanly, or why the job failed and
    how every process ended."""
    if failure is None:
        bad = [
            p
            for p in procs
            if p.role == "reducer" and p.returncode not in (0, None) and p.returncode != -signal.SIGTERM
        ]
        for p in bad:
            log.warning("%s (pid %d) did not stop cleanly: %s", p.label, p.pid, describe_status(p.exit_code))
        return
    lines = []
    for p in procs:
        how = describe_status(p.returncode if p.returncode is not None else 0)
        note = " (stopped by the launcher)" if p.stopped else ""
        lines.append(f"  {p.label:<14} pid {p.pid:<8} {how}{note}")
    log.error("job failed: %s; exit status %s\n%s", failure, status, "\n".join(lines))


class _Launcher:
    def __init__(
        self,
        command: list[str],
        workers: int,
        reducers: int,
        procs_per_worker: int,
        base_port: int | None,
        host: str,
        reducer_threads: int | None,
        grace_period: float,
        ready_timeout: float,
        log_level: str | None,
        out: IO[Any] | None,
        err: IO[Any] | None,
        env: Mapping[str, str] | None,
    ) -> None:
        self.command = command
        self.workers = workers
        self.reducers = reducers
        self.ppw = procs_per_worker
        self.base_port = base_port
        self.host = host
        self.reducer_threads = reducer_threads
        self.grace = grace_period
        self.ready_timeout = ready_timeout
        self.log_level = log_level
        self.output = _Output(out, err)
        self.env = env
        self.procs: list[_Proc] = []
        self.sel = selectors.DefaultSelector()
        self.preexec = _pdeathsig_preexec()
        self.guard = Guard()  # kills the children's groups if this process dies without doing it
        self.signal_count = 0
        self.signal_name = ""
        self.stopping = False
        self.kill_at: float | None = None
        self.killed = False
        self.status: int | None = None
        self.failure: str | None = None
        self.tmpdir = tempfile.mkdtemp(prefix="rs-launch-")

    # -- children -----------------------------------------------------------------------------
    def _spawn(
        self, role: str, label: str, argv: list[str], env: dict[str, str], ready_file: str | None = None
    ) -> _Proc:
        popen = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=self.preexec,
            close_fds=True,
        )
        self.guard.started(popen.pid)  # its process group (start_new_session)
        proc = _Proc(role, label, popen, ready_file=ready_file)
        self.procs.append(proc)
        assert popen.stdout is not None and popen.stderr is not None  # both are pipes
        for which, pipe in ((1, popen.stdout), (2, popen.stderr)):
            os.set_blocking(pipe.fileno(), False)
            self.sel.register(pipe, selectors.EVENT_READ, (proc, which))
        log.info("started %s (pid %d)", label, popen.pid)
        return proc

    def _start_reducers(self, cluster: dict[str, list[str]]) -> None:
        base = _base_env(self.env)
        drain = max(0.0, min(5.0, self.grace / 2))
        for i in range(self.reducers):
            ready = os.path.join(self.tmpdir, f"reducer-{i}.ready")
            argv = [sys.executable, "-m", "reducer.cli.main"]
            if self.log_level:
                argv += ["--log-level", self.log_level]
            # No control plane: its default port (data port + 1) may be the next process's data port.
            argv += [
                "serve",
                "--host",
                self.host,
                "--drain-timeout",
                f"{drain:g}",
                "--ready-file",
                ready,
                "--control-port",
                "off",
            ]
            if self.reducer_threads:
                argv += ["--threads", str(self.reducer_threads)]
            env = dict(base)
            env["CLUSTER_SPEC"] = cluster_spec(cluster, {"type": "workerpool2", "index": i, "trial": ""}, self.command)
            self._spawn("reducer", f"reducer {i}", argv, env, ready_file=ready)

    def _start_workers(self, cluster: dict[str, list[str]]) -> None:
        base = self.env
        nprocs = self.workers * self.ppw
        threads = str(max(1, (os.cpu_count() or 1) // nprocs))
        for node in range(self.workers):
            for local in range(self.ppw):
                env = worker_env(cluster, node, local, self.ppw, self.command, base)
                env.setdefault("OMP_NUM_THREADS", threads)  # W x L processes share this machine
                label = f"worker {node}.{local}"
                try:
                    self._spawn("worker", label, list(self.command), env)
                except OSError as exc:  # e.g. the command does not exist: like a shell, 127 / 126
                    self.failure = f"cannot start {label}: {exc.strerror or exc}: {self.command[0]!r}"
                    self.status = 127 if isinstance(exc, FileNotFoundError) else 126
                    log.error("%s; stopping the %d other process(es)", self.failure, sum(p.alive for p in self.procs))
                    self._begin_stop()
                    return

    def _signal_groups(self, sig: int, procs: Sequence[_Proc]) -> None:
        for p in procs:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _begin_stop(self, procs: Sequence[_Proc] | None = None) -> None:
        """SIGTERM the process groups of `procs` (default: every live child); SIGKILL later."""
        targets = [p for p in (self.procs if procs is None else procs) if p.alive]
        for p in targets:
            p.stopped = True
        self._signal_groups(signal.SIGTERM, targets)
        self.stopping = True
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace

    # -- I/O ----------------------------------------------------------------------------------
    def _pump(self, timeout: float) -> None:
        if not self.sel.get_map():
            time.sleep(timeout)
            return
        for key, _ in self.sel.select(timeout):
            proc, which = key.data
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self._close_stream(key.fileobj, proc, which)
                continue
            self._emit(proc, which, data)

    def _emit(self, proc: _Proc, which: int, data: bytes) -> None:
        buf = proc.partial.get(which, b"") + data
        lines = buf.split(b"\n")
        rest = lines.pop()
        if len(rest) > 65536:  # a very long line without newline: flush it anyway
            lines.append(rest)
            rest = b""
        proc.partial[which] = rest
        if lines:
            prefix = f"[{proc.label}] ".encode()
            self.output.write(which, b"".join(prefix + line + b"\n" for line in lines))

    def _close_stream(self, fileobj: Any, proc: _Proc, which: int) -> None:
        self.sel.unregister(fileobj)
        fileobj.close()
        rest = proc.partial.pop(which, b"")
        if rest:
            self.output.write(which, f"[{proc.label}] ".encode() + rest + b"\n")

    def _drain_output(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.sel.get_map() and time.monotonic() < deadline:
            self._pump(0.05)
        for key in list(self.sel.get_map().values()):  # held open by an escaped grandchild
            proc, which = key.data
            self._close_stream(key.fileobj, proc, which)

    # -- the loop -----------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.signal_count += 1
        self.signal_name = signal.Signals(signum).name
        if self.signal_count == 1 and self.status is None:  # the job was still running
            self.status = 128 + signum
        if self.signal_count > 1:  # impatient: no more grace
            self.kill_at = time.monotonic()

    def _reap(self) -> list[_Proc]:
        exited = []
        for p in self.procs:
            if p.alive:
                rc = p.popen.poll()
                if rc is not None:
                    p.returncode = rc
                    exited.append(p)
        return exited

    def _fail(self, proc: _Proc, why: str, status: int) -> None:
        if self.failure is None:
            self.failure = f"{proc.label} (pid {proc.pid}) {why}"
            self.status = status
            others = [p for p in self.procs if p.alive]
            log.error("%s; stopping the %d other process(es)", self.failure, len(others))
            self._begin_stop()

    def run(self) -> int:
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: the caller handles signals
                pass
        self.guard.start()
        try:
            return self._run()
        finally:
            try:
                if any(p.alive for p in self.procs):  # e.g. an exception in the loop
                    self._signal_groups(signal.SIGKILL, [p for p in self.procs if p.alive])
                    for p in self.procs:
                        if p.alive:
                            p.returncode = p.popen.wait()
                # Whatever is left in the children's groups (a worker's own subprocesses).
                self._signal_groups(signal.SIGKILL, self.procs)
                self.guard.done()
                self._drain_output(1.0)
            finally:
                self.sel.close()
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                shutil.rmtree(self.tmpdir, ignore_errors=True)

    def _run(self) -> int:
        cluster = build_cluster(self.workers, self.reducers, self.host, self.base_port)
        log.info(
            "local cluster: %d reducer(s) %s; %d worker node(s) x %d process(es) %s",
            self.reducers,
            ", ".join(cluster["workerpool2"]),
            self.workers,
            self.ppw,
            ", ".join(cluster["workerpool0"] + cluster.get("workerpool1", [])),
        )
        phase = "ready"
        ready_deadline = time.monotonic() + self.ready_timeout
        self._start_reducers(cluster)
        while True:
            self._pump(_POLL_INTERVAL)
            exited = self._reap()
            if self.signal_count and not self.stopping:
                log.warning(
                    "received %s: stopping all %d process(es)", self.signal_name, sum(p.alive for p in self.procs)
                )
                self.failure = f"interrupted by {self.signal_name}"
                self._begin_stop()
            if not self.stopping:
                for p in exited:
                    if p.role == "worker" and p.returncode != 0:
                        self._fail(p, f"failed: {describe_status(p.exit_code)}", _exit_status(p.exit_code))
                    elif p.role == "reducer":
                        when = "before listening" if phase == "ready" else "while the workers were running"
                        self._fail(p, f"exited {when}: {describe_status(p.exit_code)}", _exit_status(p.exit_code) or 1)
                    if self.stopping:
                        break
                    if p.role == "worker":
                        log.info("%s (pid %d) finished: %s", p.label, p.pid, describe_status(p.exit_code))
            if not self.stopping and phase == "ready":
                reducers = [p for p in self.procs if p.role == "reducer"]
                if all(p.ready_file and os.path.exists(p.ready_file) for p in reducers):
                    log.info(
                        "%d reducer(s) listening; starting %d worker process(es)",
                        len(reducers),
                        self.workers * self.ppw,
                    )
                    self._start_workers(cluster)
                    phase = "run"
                elif time.monotonic() > ready_deadline:
                    late = next(p for p in reducers if not os.path.exists(p.ready_file or ""))
                    self._fail(late, f"was not listening after {self.ready_timeout:g}s", 1)
            elif not self.stopping and phase == "run":
                workers = [p for p in self.procs if p.role == "worker"]
                if all(not p.alive for p in workers):
                    self.status = 0
                    log.info("all %d worker process(es) succeeded; stopping the reducers", len(workers))
                    self._begin_stop()
            if self.stopping:
                if not any(p.alive for p in self.procs):
                    break
                if not self.killed and self.kill_at is not None and time.monotonic() >= self.kill_at:
                    alive = [p for p in self.procs if p.alive]
                    log.warning(
                        "sending SIGKILL to %s (still running %gs after SIGTERM)",
                        ", ".join(f"{p.label} (pid {p.pid})" for p in alive),
                        self.grace,
                    )
                    self._signal_groups(signal.SIGKILL, alive)
                    self.killed = True
        _report(self.procs, self.failure, self.status)
        return int(self.status or 0)


def resolve_command(command: Sequence[str]) -> list[str]:
    """The worker command; a leading ``script.py`` runs with this Python."""
    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ConfigError("no worker command given: reduction-server launch ... -- python train.py [ARGS]")
    if cmd[0].endswith(".py") and not os.access(cmd[0], os.X_OK):
        cmd = [sys.executable] + cmd
    return cmd


def _check_command(cmd: list[str]) -> None:
    """A worker command that cannot start is a bad argument, found before any process starts:
    a program not on PATH, or `python SCRIPT` whose script does not exist."""
    program = cmd[0]
    if shutil.which(program) is None:
        raise ConfigError(f"worker command {program!r}: no such program (not on PATH, or not executable)")
    name = os.path.basename(program)
    if re.fullmatch(r"python[0-9.]*", name) or program == sys.executable:
        script = next((a for a in cmd[1:] if not a.startswith("-")), None)
        flags = cmd[1 : cmd.index(script)] if script is not None else cmd[1:]
        runs_other = any(f in ("-m", "-c") or f.startswith(("-m", "-c")) for f in flags)
        if script is not None and not runs_other and script.endswith(".py") and not os.path.isfile(script):
            raise ConfigError(f"worker command: {script!r} not found (from {os.getcwd()})")


def launch(
    command: Sequence[str],
    *,
    workers: int = 1,
    reducers: int = 1,
    procs_per_worker: int = 1,
    base_port: int | None = None,
    host: str = "127.0.0.1",
    reducer_threads: int | None = 1,
    grace_period: float = 5.0,
    ready_timeout: float = 30.0,
    log_level: str | None = None,
    out: IO[Any] | None = None,
    err: IO[Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run R reducers and W x L workers of `command` here; return the job's exit status.

    Raises ConfigError for bad arguments. SIGINT/SIGTERM/SIGHUP stop the job when called from
    the main thread (the status is then 128 + the signal number).
    """
    cmd = resolve_command(command)
    _check_command(cmd)
    if procs_per_worker < 1:
        raise ConfigError(f"--procs-per-worker must be >= 1, found {procs_per_worker}")
    if grace_period < 0 or ready_timeout <= 0:
        raise ConfigError("the grace period must be >= 0 and the ready timeout > 0")
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, found {workers}")
    if reducers < 1:
        raise ConfigError(f"--reducers must be >= 1, found {reducers}")
    launcher = _Launcher(
        cmd,
        workers,
        reducers,
        procs_per_worker,
        base_port,
        host,
        reducer_threads,
        grace_period,
        ready_timeout,
        log_level,
        out,
        err,
        env,
    )
    return launcher.run()
