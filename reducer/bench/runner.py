"""Runs the benchmark: starts the rank processes of each algorithm (on loopback or in
emulated hosts), collects their samples, prints the tables and writes JSON / plot.

Every measured rank is its own process (reducer.bench.rank), started once per algorithm;
it loops over all sizes itself. Reducers (rs only) are processes too. With
``emulate_gbps`` every worker and every reducer gets its own network namespace
(reducer.bench.emulate) with a B Gbit/s full-duplex link.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import logging
import os
import platform
import queue
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import config as rs_config
from ..addresses import format_address
from ..dtypes import check_op, numpy_dtype
from ..errors import ConfigError
from . import control_ab, cpu_monitor, report, steps
from .poller import DEFAULT_INTERVAL_S, merge_counts
from .report import uses_reducers

log = logging.getLogger("reducer.bench")

ALL_ALGOS = ("rs", "ring", "gloo")
# Also available: gloo all-reducing a bfloat16 copy (as torch's bf16 hook); run by default with --compression.
EXTRA_ALGOS = ("gloo-bf16",)
_PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the directory holding reducer/: the ranks import it

# ------------------------------------------------------------------------ configuration
@dataclass
class BenchConfig:
    workers: int = 4
    reducers: int = 4
    sizes: List[int] = field(default_factory=lambda: parse_sizes("4K:256M"))
    dtype: str = "float32"
    op: str = "sum"
    iters: int = 10
    iters_bytes: int = 4 << 20               # and at least this many bytes of timed rounds per size
    warmup: int = 3
    warmup_bytes: int = 32 << 20             # and at least this many bytes of untimed rounds per size
    algos: Optional[List[str]] = None        # None: every available one
    emulate_gbps: Optional[float] = None
    json_path: Optional[str] = None
    plot_path: Optional[str] = None
    timeout: float = 60.0                    # per all-reduce, seconds without progress
    connect_timeout: float = 120.0
    chunk_bytes: Optional[int] = None        # ring pipeline chunk (default: RS_CHUNK_BYTES, rs's largest chunk)
    compression: Optional[str] = None        # rs only: 'bf16' / 'fp16' sends the float32 buffer as 16-bit
    netns_prefix: str = "rsb"
    # TCP congestion control(s) to run under, each a full pass over the algorithms: an algorithm name
    # ('cubic', 'bbr', ...) or 'default' (the kernel's). Emulated hosts: every connection of every
    # host (the namespaces' routes); always: rs's and the ring's sockets (RS_TCP_CONGESTION).
    congestion: Optional[List[str]] = None
    progress: bool = True
    cpu_warn_percent: float = 70.0
    # training steps (reducer.bench.steps): set `model` to measure steps instead of sizes
    model: Optional[str] = None
    bucket_cap_mb: List[float] = field(default_factory=lambda: [25.0])
    first_bucket_mb: float = 1.0             # DDP's first_bucket_bytes_cap (torch's default: 1 MiB)
    compute_ms: str = "0"                    # backward time(s), ms, comma list; 'gloo' = gloo's comm time
    scale: float = 1.0                       # shrink every tensor and bucket limit (tests)
    # the reducers' control plane (reducer.bench.control_ab): off, on (polled), or ab (rs both ways)
    control_plane: str = "off"
    poll_interval: float = DEFAULT_INTERVAL_S  # seconds between the poller's GetStats + /metrics rounds
    ab_passes: int = 2                       # with ab: passes of each variant (A B B A for 2)


def parse_sizes(text: str) -> List[int]:
    """'4K:256M' (doubling from 4 KiB to 256 MiB), '4K:1M:4' (x4 steps), or a list '4K,64K,1M'."""
    text = text.strip()
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ConfigError(f"bad size range {text!r}: expected MIN:MAX or MIN:MAX:FACTOR")
        lo, hi = rs_config.parse_size(parts[0]), rs_config.parse_size(parts[1])
        factor = int(parts[2]) if len(parts) == 3 else 2
        if lo < 1 or hi < lo or factor < 2:
            raise ConfigError(f"bad size range {text!r}: need 1 <= MIN <= MAX and FACTOR >= 2")
        sizes, s = [], lo
        while s <= hi:
            sizes.append(s)
            s *= factor
        return sizes
    sizes = [rs_config.parse_size(p) for p in text.split(",") if p.strip()]
    if not sizes:
        raise ConfigError("no sizes given")
    return sizes


def available_algos(steps: bool = False) -> Dict[str, Optional[str]]:
    """algo -> None if it can run here, else the reason it cannot. steps: the training-step
    algorithms, whose rs variants go through reducer.torch's DDP hooks."""
    out: Dict[str, Optional[str]] = {"rs": None, "ring": None, "gloo": None, "gloo-bf16": None}
    if steps:
        out = {"rs": None, "rs+bf16": None, "ring": None, "gloo": None}
    if importlib.util.find_spec("torch") is None:
        missing = "torch is not installed (pip install 'reduction-server[torch]')"
        for a in out:
            if a != "ring" and (a.startswith("gloo") or steps):
                out[a] = missing
    return out


def wire_dtype(algo: str, cfg: BenchConfig) -> Optional[str]:
    """The 16-bit type `algo` puts the float32 buffer on the wire as (None: the buffer's own)."""
    if algo == "gloo-bf16":
        return "bfloat16"
    if control_ab.base_algo(algo) == "rs" and cfg.compression:
        return {"bf16": "bfloat16", "fp16": "float16"}[cfg.compression]
    return None


def _check_compression(cfg: BenchConfig) -> BenchConfig:
    """cfg with compression normalised to None, 'bf16' or 'fp16'; ConfigError if it cannot apply."""
    from ..fusion import compression_dtype

    wire = compression_dtype(cfg.compression)
    comp = None if wire is None else ("bf16" if wire == numpy_dtype("bfloat16") else "fp16")
    if comp and cfg.dtype != "float32":
        raise ConfigError(f"--compression {comp} compresses float32 buffers: use --dtype float32 (not {cfg.dtype})")
    if cfg.dtype != "float32" and cfg.algos and "gloo-bf16" in cfg.algos:
        raise ConfigError("gloo-bf16 all-reduces a bfloat16 copy of a float32 buffer: use --dtype float32")
    return dataclasses.replace(cfg, compression=comp)


DEFAULT_CONGESTION = "default"


def parse_congestion(text: str) -> List[str]:
    """'cubic,bbr' -> ['cubic', 'bbr'] (in order, without repeats); 'default' = the kernel's."""
    names = list(dict.fromkeys(p.strip().lower() for p in text.split(",") if p.strip()))
    if not names:
        raise ConfigError("--congestion: no algorithm given")
    return names


def kernel_congestion() -> str:
    """The machine's default TCP congestion control (what new namespaces inherit), or '?'."""
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"


def _check_congestion(names: Optional[List[str]]) -> None:
    if not names:
        return
    from .emulate import available_congestion

    avail = available_congestion()
    bad = [n for n in names if n != DEFAULT_CONGESTION and avail and n not in avail]
    if bad:
        raise ConfigError(f"--congestion {','.join(bad)}: not available in this kernel (available: {' '.join(avail)}; "
                          f"a module may need loading, e.g. `modprobe tcp_{bad[0]}`)")


def machine_description() -> str:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({model}), Linux {platform.release()}, Python {platform.python_version()}"


# ------------------------------------------------------------------------ hosts
class _LoopbackHosts:
    emulated = False

    def bind_host(self, i: int) -> str:
        return "127.0.0.1"

    def set_congestion(self, name: Optional[str]) -> None:
        pass  # only RS_TCP_CONGESTION (rs, ring): the machine's default is not ours to change

    def flow_congestion(self, i: int) -> Optional[Dict[str, int]]:
        return None  # loopback connections of the whole machine: not only ours

    def popen(self, i: int, argv: Sequence[str], env: Dict[str, str], **kw) -> subprocess.Popen:
        full = dict(os.environ)
        full.update(env)
        full["GLOO_SOCKET_IFNAME"] = "lo"
        return subprocess.Popen(list(argv), env=full, **kw)


class _EmulatedHosts:
    emulated = True

    def __init__(self, hosts: Any):
        self.hosts = hosts

    def bind_host(self, i: int) -> str:
        return self.hosts[i].ip

    def set_congestion(self, name: Optional[str]) -> None:
        self.hosts.set_congestion(name)

    def flow_congestion(self, i: int) -> Optional[Dict[str, int]]:
        return self.hosts.flow_congestion(i)

    def popen(self, i: int, argv: Sequence[str], env: Dict[str, str], **kw) -> subprocess.Popen:
        return self.hosts.popen(i, argv, env=env, **kw)


# ------------------------------------------------------------------------ processes
class _Proc:
    """A rank process: JSON job on stdin, MARKER lines on stdout (read by a thread)."""

    def __init__(self, name: str, popen: subprocess.Popen, events: "queue.Queue", errfile: Any):
        self.name, self.p, self.errfile = name, popen, errfile
        self.log: List[str] = []
        self.finished = False  # said 'done': its exit is expected
        self.errored = False   # reported an error itself: its exit is explained
        self._t = threading.Thread(target=self._read, args=(events,), daemon=True)
        self._t.start()

    def _read(self, events: "queue.Queue") -> None:
        # Imported here, not at module level: `python -m reducer.bench.rank` imports this package
        # first, and a module-level import of .rank would make runpy warn about a double import.
        from .rank import MARKER

        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith(MARKER):
                try:
                    msg = json.loads(line[len(MARKER):])
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

    def send(self, obj: Dict[str, Any]) -> None:
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


def _spawn(hosts: Any, host_index: int, name: str, job: Dict[str, Any], events: "queue.Queue",
           extra_env: Optional[Dict[str, str]] = None, module: str = "reducer.bench.rank",
           args: Sequence[str] = ()) -> _Proc:
    """Start `python -m module *args` (a process speaking reducer.bench.rank's JSON-lines protocol)
    on host `host_index` and hand it `job`."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(_PACKAGE_PARENT), os.environ.get("PYTHONPATH", "")])),
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.update(extra_env or {})
    errfile = tempfile.TemporaryFile(mode="w+", prefix=f"rsb-{name}-")
    p = hosts.popen(host_index, [sys.executable, "-m", module, *args], env=env, stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=errfile, text=True, bufsize=1)
    proc = _Proc(name, p, events, errfile)
    proc.send(job)
    return proc


def _wait_all(events: "queue.Queue", procs: List[_Proc], event: str, timeout: float,
              on_other: Optional[Callable[[_Proc, Dict[str, Any]], None]] = None,
              watch: Optional[List[_Proc]] = None, idle: bool = False) -> Dict[_Proc, Dict[str, Any]]:
    """Wait until every proc in `procs` emitted `event`; raise BenchError on error/exit/timeout.
    On an error, a process of `watch` (default `procs`) that died is named as the cause.
    idle: `timeout` counts from the last message received, not from the start."""
    got: Dict[_Proc, Dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(got) < len(procs):
        left = deadline - time.monotonic()
        if left <= 0:
            missing = ", ".join(p.name for p in procs if p not in got)
            raise BenchError(f"timed out after {timeout:.0f} s {'without a message ' if idle else ''}waiting for "
                             f"'{event}' from {missing}")
        try:
            proc, msg = events.get(timeout=min(left, 1.0))
        except queue.Empty:
            continue
        ev = msg.get("event")
        if ev == "error":
            detail = f"{proc.name}: {msg.get('error')}\n{msg.get('traceback', '')}".rstrip()
            dead = _dead_peer(watch or procs, proc)
            if dead is not None:  # the root cause (e.g. a killed rank), not its neighbour's symptom
                raise BenchError(f"{dead.name} exited (code {dead.p.returncode}) before '{event}':\n"
                                 f"{dead.stderr_tail()}\nthen {detail}")
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


def _dead_peer(procs: List[_Proc], reporter: _Proc, grace: float = 1.0) -> Optional[_Proc]:
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


# ------------------------------------------------------------------------ one algorithm
RowMaker = Callable[[str, Any, List[Dict[str, Any]], float], Dict[str, Any]]


def _run_algo(algo: str, cfg: BenchConfig, hosts: Any, work: Dict[str, Any], make_row: RowMaker,
              run_id: str, extra_env: Optional[Dict[str, str]] = None,
              polls: Optional[List[Dict[str, Any]]] = None) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """Start the ranks (and reducers) of one algorithm, hand them `work` (the job's "sizes", or
    "steps" and "elements"), and turn each result key's W messages into a row with
    make_row(algo, key, messages in rank order, wall seconds). extra_env: added to every
    process's environment. Each row gets "flows": the congestion control of worker 0's (and
    reducer 0's) established connections once the group is connected (emulated hosts only).
    When its reducers run the control plane, a poller polls them meanwhile and its counts are
    appended to `polls`."""
    W, R = cfg.workers, cfg.reducers
    control = control_ab.with_control_plane(algo, cfg.control_plane)
    is_rs = control_ab.base_algo(algo) == "rs"
    events: "queue.Queue" = queue.Queue()
    procs: List[_Proc] = []
    rows: List[Dict[str, Any]] = []
    chunk = cfg.chunk_bytes or int(rs_config.get("chunk_bytes"))
    try:
        reducer_addrs: List[str] = []
        rprocs: List[_Proc] = []
        rready: Dict[_Proc, Dict[str, Any]] = {}
        if uses_reducers(algo):
            for k in range(R):
                h = W + k if hosts.emulated else 0
                rprocs.append(_spawn(hosts, h, f"reducer {k}",
                                     {"role": "reducer", "bind_host": hosts.bind_host(h),
                                      "threads": rs_config.get("threads"), "control_plane": control}, events,
                                     extra_env))
            procs += rprocs
            rready = _wait_all(events, rprocs, "ready", cfg.connect_timeout, watch=procs)
            for k, p in enumerate(rprocs):
                host = hosts.bind_host(W + k if hosts.emulated else 0)
                reducer_addrs.append(format_address(host, rready[p]["port"]))
        t_rready = t_pready = time.monotonic()  # the reducers are up (if any)
        poller: Optional[_Proc] = None
        pready: Dict[_Proc, Dict[str, Any]] = {}
        if control and rprocs:
            # on a host of its own when emulated (W + R): its requests cross the reducers' shaped links
            job = {"role": "poller", "interval": cfg.poll_interval,
                   "control": [rready[p]["control_address"] for p in rprocs],
                   "metrics": [rready[p]["metrics_url"] for p in rprocs]}
            poller = _spawn(hosts, W + R if hosts.emulated else 0, "control-plane poller", job, events, extra_env)
            procs.append(poller)
            pready = _wait_all(events, [poller], "ready", cfg.connect_timeout, watch=procs)
            t_pready = time.monotonic()
        wprocs = []
        for i in range(W):
            job = {"role": "worker", "algo": algo, "rank": i, "world": W, "dtype": cfg.dtype,
                   "op": cfg.op, "iters": cfg.iters, "iters_bytes": cfg.iters_bytes, "warmup": cfg.warmup,
                   "warmup_bytes": cfg.warmup_bytes,
                   "timeout": cfg.timeout,
                   "connect_timeout": cfg.connect_timeout, "bind_host": hosts.bind_host(i if hosts.emulated else 0),
                   "reducers": reducer_addrs, "group": f"bench-{run_id}", "chunk_bytes": chunk,
                   "session": int(run_id, 16) & 0xFFFFFFFF, "compression": cfg.compression if is_rs else None,
                   "wire_dtype": wire_dtype(algo, cfg), **work}
            wprocs.append(_spawn(hosts, i if hosts.emulated else 0, f"{algo} rank {i}", job, events, extra_env))
        procs += wprocs
        listen = _wait_all(events, wprocs, "listen", cfg.connect_timeout, watch=procs)
        addrs = []
        for i, p in enumerate(wprocs):
            host = hosts.bind_host(i if hosts.emulated else 0)
            port = listen[p].get("port") or 0
            addrs.append(format_address(host, port))
        for p in wprocs:
            p.send({"addresses": addrs})
        ready = _wait_all(events, wprocs, "ready", cfg.connect_timeout, watch=procs)
        t_ready = time.monotonic()
        flows: Optional[Dict[str, int]] = None
        for h in ([0] + ([W] if rprocs and hosts.emulated else [])):
            got = hosts.flow_congestion(h)
            if got is not None:
                flows = flows or {}
                for name, n in got.items():
                    flows[name] = flows.get(name, 0) + n
        for p in wprocs:  # connected and looked at: go
            p.send({"start": True})

        pending: Dict[Any, Dict[_Proc, Dict[str, Any]]] = {}
        t_wall = time.monotonic()
        stall_timeout = max(600.0, 4 * cfg.timeout)

        def on_result(proc: _Proc, msg: Dict[str, Any]) -> None:
            nonlocal t_wall
            if msg.get("event") != "result":
                return
            per = pending.setdefault(msg["key"], {})
            per[proc] = msg
            if len(per) < W:
                return
            rows.append(make_row(algo, msg["key"], [per[p] for p in wprocs], time.monotonic() - t_wall))
            t_wall = time.monotonic()

        # Results stream in; 'done' comes after the last one.
        done = _wait_all(events, wprocs, "done", stall_timeout, on_other=on_result, watch=procs, idle=True)
        wall = time.monotonic() - t_ready
        # The bench's own processes' share of the machine: each process's CPU seconds over the time
        # it was measured (workers: 'ready' to 'done', with input restores and result checks; reducers
        # and the poller: their own 'ready' to the end), in cores; the rest of the load is someone else's.
        cores = sum(done[p]["cpu_s"] - ready[p]["cpu_s"] for p in wprocs) / wall if wall > 0 else 0.0
        if poller is not None:
            poller.close_stdin()
            pdone = _wait_all(events, [poller], "done", 60.0)[poller]
            cores += (pdone["cpu_s"] - pready[poller]["cpu_s"]) / max(1e-3, time.monotonic() - t_pready)
            if polls is not None:
                polls.append(pdone["polls"])
        if rprocs:
            for p in rprocs:
                p.close_stdin()
            rdone = _wait_all(events, rprocs, "done", 30.0)
            reducer_cpu_s = sum(rdone[p]["cpu_s"] - rready[p]["cpu_s"] for p in rprocs)
            cores += reducer_cpu_s / max(1e-3, time.monotonic() - t_rready)
            for r in rows:
                r["reducer_cpu_s"] = reducer_cpu_s  # all reducers, this pass: 'ready' to the end
        share = 100.0 * cores / (os.cpu_count() or 1) if wall > 0 else None
        for r in rows:
            r["bench_cpu_percent"] = share
            if flows is not None:
                r["flows"] = flows
        return rows, None
    except BenchError as exc:
        return rows, str(exc)
    finally:
        for p in procs:
            p.close_stdin()
        for p in procs:
            p.kill()


# ------------------------------------------------------------------------ the run
def _choose_algos(cfg: BenchConfig, candidates: Sequence[str], avail: Dict[str, Optional[str]],
                  out: Callable[[str], None], default: Optional[Sequence[str]] = None) -> List[str]:
    """The algorithms asked for (--algos) or `default` (all candidates), minus those unavailable here."""
    if cfg.algos:
        unknown = [a for a in cfg.algos if a not in candidates]
        if unknown:
            raise ConfigError(f"unknown algorithm(s) {', '.join(unknown)}: choose from {', '.join(candidates)}")
        wanted = list(dict.fromkeys(cfg.algos))
    else:
        wanted = list(candidates if default is None else default)
    algos = []
    for a in wanted:
        if avail.get(a):
            out(f"# note: skipping {a}: {avail[a]}")
        else:
            algos.append(a)
    return algos


def _size_row_maker(cfg: BenchConfig, esize: int, chunk: int) -> RowMaker:
    def make(algo: str, size: Any, msgs: List[Dict[str, Any]], wall_s: float) -> Dict[str, Any]:
        is_rs = control_ab.base_algo(algo) == "rs"
        cpu = next((m.get("cpu_percent") for m in msgs if m.get("cpu_percent") is not None), None)
        return report.make_row(algo, size, size // esize, cfg.dtype, cfg.op, cfg.workers, cfg.reducers,
                               [m["samples_us"] for m in msgs], sum(int(m["wrong"]) for m in msgs),
                               cpu_percent=cpu, wall_s=wall_s, emulate_gbps=cfg.emulate_gbps, iters=cfg.iters,
                               warmup=cfg.warmup,
                               chunk_bytes=chunk if algo == "ring" else int(rs_config.get("chunk_bytes")),
                               streams=int(rs_config.get("streams")) if is_rs else 1,
                               wire_dtype=wire_dtype(algo, cfg) or cfg.dtype,
                               **({"window": int(rs_config.get("window")), "compression": cfg.compression}
                                  if is_rs else {}))

    return make


def run_sizes(algo: str, cfg: BenchConfig, hosts: Any, run_id: str) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """One algorithm over cfg.sizes on `hosts` (emulated or not): its rows and error, without the
    report (for benchmarks that compare something else against these baselines)."""
    make_row = _size_row_maker(cfg, numpy_dtype(cfg.dtype).itemsize, cfg.chunk_bytes or int(rs_config.get("chunk_bytes")))
    return _run_algo(algo, cfg, hosts, {"sizes": list(cfg.sizes)}, make_row, run_id)


def run(cfg: BenchConfig, out: Callable[[str], None] = print) -> List[Dict[str, Any]]:
    """Run the benchmark, print its tables with `out`, write JSON / plot; returns the rows.

    cfg.model set: training steps of that model (reducer.bench.steps); otherwise buffer sizes."""
    if cfg.workers < 1 or cfg.reducers < 1:
        raise ConfigError("--workers and --reducers must be at least 1")
    numpy_dtype(cfg.dtype)
    cfg = _check_compression(dataclasses.replace(cfg, op=check_op(cfg.op)))
    if cfg.iters < 1 or cfg.iters_bytes < 0 or cfg.warmup < 0 or cfg.warmup_bytes < 0:
        raise ConfigError("--iters must be >= 1, --iters-bytes, --warmup and --warmup-bytes >= 0")
    _check_congestion(cfg.congestion)
    ccs: List[Optional[str]] = list(cfg.congestion or [None])  # None: leave congestion control alone
    if cfg.model and len(ccs) > 1:
        raise ConfigError("--model runs one congestion control at a time: give --congestion one name")
    plan = None
    sizes: List[int] = []
    if cfg.model:
        if cfg.dtype != "float32":
            raise ConfigError("--model replays float32 gradients: --dtype must be float32")
        cfg = dataclasses.replace(cfg, op="avg")  # DDP averages
        plan = steps.StepPlan(cfg.model, cfg.bucket_cap_mb, cfg.first_bucket_mb, cfg.compute_ms, cfg.scale)
        algos = _choose_algos(cfg, steps.ALGOS, available_algos(steps=True), out)
        if plan.needs_gloo and "gloo" not in algos:
            raise ConfigError("--compute-ms gloo needs the gloo algorithm (and torch)")
    else:
        esize = numpy_dtype(cfg.dtype).itemsize
        sizes = sorted({s - s % esize for s in cfg.sizes if s >= esize})
        if not sizes:
            raise ConfigError(f"no size holds a whole {cfg.dtype} element")
        algos = _choose_algos(cfg, ALL_ALGOS + EXTRA_ALGOS, available_algos(), out,
                              default=ALL_ALGOS + (EXTRA_ALGOS if cfg.compression else ()))
    control_ab.check(cfg.control_plane, algos, cfg.model, cfg.ab_passes, cfg.poll_interval)
    run_order = control_ab.pass_order(algos, cfg.control_plane, cfg.ab_passes)
    algos = list(dict.fromkeys(run_order))  # what the tables show: with ab, rs+cp after rs
    if cfg.plot_path:
        from .plot import _pyplot

        _pyplot()  # fail now, not after the run, when matplotlib is missing

    # load on the machine before we start anything: others' work disturbs the numbers
    b0 = cpu_monitor.read_cpu_times()
    time.sleep(1.0)
    b1 = cpu_monitor.read_cpu_times()
    background = 100.0 * (b1[0] - b0[0]) / max(1, b1[1] - b0[1])
    load1 = os.getloadavg()[0]

    run_id = uuid.uuid4().hex[:8]
    n_hosts = cfg.workers + (cfg.reducers if any(uses_reducers(a) for a in algos) else 0)
    if any(control_ab.with_control_plane(a, cfg.control_plane) for a in algos):
        n_hosts += 1  # the control-plane poller's
    where = (f"{cfg.emulate_gbps:g} Gbit/s emulated full-duplex NIC per host (network namespaces + tbf), "
             f"{n_hosts} hosts" if cfg.emulate_gbps else "loopback")
    out(f"# reduction-server bench: workers={cfg.workers} reducers={cfg.reducers} dtype={cfg.dtype} op={cfg.op} "
        f"iters={cfg.iters} warmup={cfg.warmup}"
        + ("" if cfg.model else f" iters_bytes={cfg.iters_bytes} warmup_bytes={cfg.warmup_bytes}")
        + f" algos={','.join(algos)}"
        + (f" compression={cfg.compression} (rs: float32 sent as 16-bit)" if cfg.compression else ""))
    out(f"# network: {where}")
    out(f"# machine: {machine_description()}")
    out(f"# background CPU load before the run: {background:.0f}% of {os.cpu_count()} cores, load average "
        f"{load1:.2f}" + (" (the machine is not idle: expect disturbed numbers)" if background > 10 else ""))
    out(f"# rs: RS_CHUNK_BYTES={rs_config.get('chunk_bytes')} (largest chunk; a round uses about shard/64, at "
        f"least 16 KiB, 64 KiB for shards under 128 KiB, shard/128 for shards over 4 MiB) RS_WINDOW={rs_config.get('window')} RS_STREAMS={rs_config.get('streams')}; "
        f"ring chunk {cfg.chunk_bytes or rs_config.get('chunk_bytes')} B")
    out(f"# TCP congestion control: {_describe_congestion(cfg, ccs)}")
    cp_line = control_ab.describe(cfg.control_plane, cfg.poll_interval, cfg.ab_passes)
    if cp_line:
        out(cp_line)
    if plan is not None:
        for line in plan.describe():
            out(line)

    all_rows: List[Dict[str, Any]] = []
    if plan is not None:
        make_row = plan.make_row(cfg)
    else:
        make_row = _size_row_maker(cfg, numpy_dtype(cfg.dtype).itemsize,
                                   cfg.chunk_bytes or int(rs_config.get("chunk_bytes")))

    def work_passes() -> Any:
        """The passes of one congestion control: the model's steps, or every size in `run_order`."""
        if plan is not None:
            return ((a, plan.work(cases), len(cases)) for a, cases in steps.passes(plan, algos, all_rows))
        return ((a, {"sizes": sizes}, len(sizes)) for a in run_order)

    # keyed by (congestion control, algorithm): each congestion control's passes are a run of their own
    errors: Dict[Tuple[Optional[str], str], Optional[str]] = {}
    cpu_by_algo: Dict[Tuple[Optional[str], str], List[Any]] = {}
    polls_by_algo: Dict[Tuple[Optional[str], str], List[Dict[str, Any]]] = {}
    rows_by_cc: Dict[Optional[str], List[Dict[str, Any]]] = {cc: [] for cc in ccs}
    emu_ctx = None
    try:
        if cfg.emulate_gbps:
            from . import emulate

            try:
                emu_ctx = emulate.EmulatedHosts(n_hosts, cfg.emulate_gbps, prefix=cfg.netns_prefix)
                hosts: Any = _EmulatedHosts(emu_ctx.__enter__())
            except emulate.EmulationError as exc:
                emu_ctx = None
                raise ConfigError(f"--emulate-gbps: {exc}") from None
        else:
            hosts = _LoopbackHosts()

        prog, add_task = _progress(cfg)
        try:
            for cc in ccs:
                extra_env: Dict[str, str] = {}
                if cc is not None:
                    # rs's and the ring's sockets get this pass's setting ('default': the kernel's),
                    # whatever the caller's environment says
                    extra_env[rs_config.SETTINGS["tcp_congestion"].env] = cc
                    hosts.set_congestion(None if cc == DEFAULT_CONGESTION else cc)
                for algo, work, n_results in work_passes():
                    key = (cc, algo)
                    if n_results == 0 or errors.get(key):
                        continue
                    mon = cpu_monitor.CpuMonitor(interval=0.5).start()
                    advance = add_task(algo if cc is None else f"{algo} {cc}", n_results) if add_task else None

                    def row_and_progress(a: str, key: Any, msgs: List[Dict[str, Any]], wall: float,
                                         advance: Any = advance, cc: Optional[str] = cc) -> Dict[str, Any]:
                        row = make_row(a, key, msgs, wall)
                        if cc is not None:
                            row["congestion"] = _cc_label(cc)
                        if advance is not None:
                            advance(row.get("label") or f"{row['size']} B")
                        return row

                    try:
                        rows, err = _run_algo(algo, cfg, hosts, work, row_and_progress, run_id, extra_env,
                                              polls=polls_by_algo.setdefault(key, []))
                    finally:
                        mon.stop()
                        cpu_by_algo.setdefault(key, []).append(mon)
                    if uses_reducers(algo):
                        for r in rows:
                            r["control_plane"] = "on" if control_ab.with_control_plane(algo, cfg.control_plane) else "off"
                    all_rows += rows
                    rows_by_cc[cc] += rows
                    errors[key] = errors.get(key) or err
                    if err:
                        log.error("%s%s failed: %s", algo, "" if cc is None else f" ({cc})", err)
        finally:
            if prog is not None:
                prog.stop()
    finally:
        if emu_ctx is not None:
            emu_ctx.__exit__(None, None, None)

    if plan is not None:  # --model: one congestion control
        steps.finish(all_rows)
        all_rows.sort(key=steps.sort_key)
        rows_by_cc = {ccs[0]: all_rows}
        where_short = f"{cfg.emulate_gbps:g} Gbit/s emulated hosts" if cfg.emulate_gbps else "loopback"
        out("")
        out(report.format_step_table(all_rows, f"{cfg.model}: one DDP training step, W={cfg.workers}, "
                                               f"R={cfg.reducers}, {where_short}"))
        for (cc, algo), err in errors.items():
            if err:
                out(f"# {algo} FAILED: {err}")
    for cc in ccs:
        mine_rows = rows_by_cc[cc]
        if len(ccs) > 1 or cc is not None:
            out("")
            out(f"# ===== TCP congestion control: {_cc_label(cc)} =====")
        bench_cpu = _mean_by_algo(mine_rows, "bench_cpu_percent")
        reducer_cpu = _mean_by_algo(mine_rows, "reducer_cpu_s")  # per pass
        if plan is None:
            if len(run_order) > len(algos):  # several passes of an algorithm: one row per size of each
                mine_rows = rows_by_cc[cc] = report.merge_passes(mine_rows)
                for r in mine_rows:
                    r["bench_cpu_percent"] = bench_cpu.get(r["algo"])
                    r["reducer_cpu_s"] = reducer_cpu.get(r["algo"])
            for algo in algos:
                out("")
                out(report.format_algo_table(algo, [r for r in mine_rows if r["algo"] == algo], cfg.workers,
                                             cfg.reducers, errors.get((cc, algo)),
                                             compression=cfg.compression if control_ab.base_algo(algo) == "rs" else None))
        for algo in algos:
            counts = polls_by_algo.get((cc, algo))
            if counts:
                merged = merge_counts(counts)
                for r in mine_rows:
                    if r["algo"] == algo:
                        r["polls"] = merged
                if cfg.control_plane == "on":
                    out(control_ab.format_polls(merged, cfg.poll_interval, algo))
        if cfg.control_plane == "ab" and plan is None:
            out("")
            out(control_ab.format_table(mine_rows, cfg.poll_interval, bench_cpu, reducer_cpu, cfg.ab_passes))
        for algo in algos:
            rows_a = [r for r in mine_rows if r["algo"] == algo]
            mine = next((r.get("bench_cpu_percent") for r in rows_a), None)
            mons = cpu_by_algo.get((cc, algo))
            if mons:
                txt = f"# CPU during the {algo} run (start-up, input restores and checks included): whole machine " \
                      f"mean {sum(m.mean_percent for m in mons) / len(mons):.0f}% of {mons[0].ncpu} cores"
                if mine is not None:
                    txt += (f", of which this benchmark's processes {mine:.0f}% (user + system time; the rest is "
                            "kernel network processing in softirq, and any other load)")
                out(txt)
            flows = next((r.get("flows") for r in rows_a if r.get("flows")), None)
            if flows:
                out(f"# congestion control of the {algo} run's connections on worker 0"
                    + (" and reducer 0" if uses_reducers(algo) else "") + " (ss -ti, once connected): "
                    + ", ".join(f"{k} {v}" for k, v in sorted(flows.items())))
        if mine_rows and plan is None:
            out("")
            out(report.format_summary(mine_rows, cfg.workers, cfg.reducers, cfg.emulate_gbps))
            out("")
            out(report.format_variance(mine_rows))
        if cfg.emulate_gbps:
            for algo in algos:
                hot = [r for r in mine_rows if r["algo"] == algo and (r.get("cpu_percent") or 0) > cfg.cpu_warn_percent]
                if hot:
                    which = ", ".join(f"{r.get('label') or str(r['size']) + ' B'} ({r['cpu_percent']:.0f}%)"
                                      for r in hot)
                    out(f"# WARNING: {algo}: the machine's CPU was busy more than {cfg.cpu_warn_percent:.0f}% during "
                        f"the timed all-reduces at {which}: there the {os.cpu_count()} cores, not the emulated "
                        f"{cfg.emulate_gbps:g} Gbit/s links, may be the limit")
    all_rows = [r for cc in ccs for r in rows_by_cc[cc]]
    for r in all_rows:
        r["background_cpu_percent"] = background
        r["load_average_1m"] = load1
    if cfg.json_path:
        report.write_json(cfg.json_path, all_rows)
        out(f"# wrote {len(all_rows)} rows to {cfg.json_path}")
    if cfg.plot_path and all_rows:
        from . import plot

        if plan is not None:
            plot.plot_steps(all_rows, cfg.plot_path, cfg.workers, cfg.reducers, cfg.emulate_gbps)
            out(f"# wrote plot {cfg.plot_path}")
        else:
            for cc in ccs:
                path = cfg.plot_path if len(ccs) == 1 else _suffixed(cfg.plot_path, _cc_label(cc))
                plot.plot(rows_by_cc[cc], path, cfg.workers, cfg.reducers, cfg.emulate_gbps)
                out(f"# wrote plot {path}")
    failed = [(cc, a) for (cc, a), err in errors.items() if err]
    if failed:
        raise BenchError("benchmark failed for " + ", ".join(
            f"{a}{'' if cc is None else f' ({cc})'}: {errors[(cc, a)]}" for cc, a in failed))
    return all_rows


def _cc_label(cc: Optional[str]) -> str:
    """The congestion control a pass ran under, as rows record it."""
    if cc is None or cc == DEFAULT_CONGESTION:
        return kernel_congestion()
    return cc


def _describe_congestion(cfg: BenchConfig, ccs: List[Optional[str]]) -> str:
    if ccs == [None]:
        from .._native import core

        rs_cc = core.tcp_congestion()  # RS_TCP_CONGESTION as this process resolved it ('' = the kernel's)
        return (f"the kernel's default ({kernel_congestion()})" +
                (f"; rs and ring sockets: {rs_cc} (RS_TCP_CONGESTION={rs_config.get('tcp_congestion')})"
                 if rs_cc else "") +
                " (--congestion NAME[,NAME] to choose; one pass per name)")
    names = ", ".join(f"{_cc_label(c)}{' (kernel default)' if c == DEFAULT_CONGESTION else ''}" for c in ccs)
    how = ("every connection of every emulated host (route congctl in each namespace) and rs/ring sockets "
           "(RS_TCP_CONGESTION)" if cfg.emulate_gbps else
           "rs and ring sockets only (RS_TCP_CONGESTION); gloo keeps the kernel's default on loopback")
    return f"one pass each: {names}; applied to {how}"


def _suffixed(path: str, tag: str) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}-{tag}{ext}"


def _mean_by_algo(rows: List[Dict[str, Any]], key: str) -> Dict[str, Optional[float]]:
    """The mean of rows[key] per algorithm (None where no row has it)."""
    out: Dict[str, Optional[float]] = {}
    for algo in dict.fromkeys(r["algo"] for r in rows):
        vals = [r[key] for r in rows if r["algo"] == algo and r.get(key) is not None]
        out[algo] = sum(vals) / len(vals) if vals else None
    return out


def _progress(cfg: BenchConfig):
    """A rich progress bar on stderr; returns (progress, add_task), add_task(algo, total) -> advance(label)."""
    if not cfg.progress:
        return None, None
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        return None, None
    prog = Progress(TextColumn("{task.description:<7}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[last]}"), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=False)
    prog.start()

    def add_task(algo: str, total: int) -> Callable[[str], None]:
        task = prog.add_task(algo, total=total, last="")
        return lambda label: prog.update(task, advance=1, last=label)

    return prog, add_task
