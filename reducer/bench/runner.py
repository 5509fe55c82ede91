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
from . import cpu_monitor, report

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
    warmup: int = 3
    algos: Optional[List[str]] = None        # None: every available one
    emulate_gbps: Optional[float] = None
    json_path: Optional[str] = None
    plot_path: Optional[str] = None
    timeout: float = 60.0                    # per all-reduce, seconds without progress
    connect_timeout: float = 120.0
    chunk_bytes: Optional[int] = None        # ring pipeline chunk (default: RS_CHUNK_BYTES, rs's largest chunk)
    compression: Optional[str] = None        # rs only: 'bf16' / 'fp16' sends the float32 buffer as 16-bit
    netns_prefix: str = "rsb"
    progress: bool = True
    cpu_warn_percent: float = 70.0


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


def available_algos() -> Dict[str, Optional[str]]:
    """algo -> None if it can run here, else the reason it cannot."""
    out: Dict[str, Optional[str]] = {"rs": None, "ring": None, "gloo": None, "gloo-bf16": None}
    if importlib.util.find_spec("torch") is None:
        out["gloo"] = out["gloo-bf16"] = "torch is not installed (pip install 'reduction-server[torch]')"
    return out


def wire_dtype(algo: str, cfg: BenchConfig) -> Optional[str]:
    """The 16-bit type `algo` puts the float32 buffer on the wire as (None: the buffer's own)."""
    if algo == "gloo-bf16":
        return "bfloat16"
    if algo == "rs" and cfg.compression:
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
           extra_env: Optional[Dict[str, str]] = None) -> _Proc:
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(_PACKAGE_PARENT), os.environ.get("PYTHONPATH", "")])),
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.update(extra_env or {})
    errfile = tempfile.TemporaryFile(mode="w+", prefix=f"rsb-{name}-")
    p = hosts.popen(host_index, [sys.executable, "-m", "reducer.bench.rank"], env=env, stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=errfile, text=True, bufsize=1)
    proc = _Proc(name, p, events, errfile)
    proc.send(job)
    return proc


def _wait_all(events: "queue.Queue", procs: List[_Proc], event: str, timeout: float,
              on_other: Optional[Callable[[_Proc, Dict[str, Any]], None]] = None,
              watch: Optional[List[_Proc]] = None) -> Dict[_Proc, Dict[str, Any]]:
    """Wait until every proc in `procs` emitted `event`; raise BenchError on error/exit/timeout.
    On an error, a process of `watch` (default `procs`) that died is named as the cause."""
    got: Dict[_Proc, Dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(got) < len(procs):
        left = deadline - time.monotonic()
        if left <= 0:
            missing = ", ".join(p.name for p in procs if p not in got)
            raise BenchError(f"timed out after {timeout:.0f} s waiting for '{event}' from {missing}")
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
def _run_algo(algo: str, cfg: BenchConfig, hosts: Any, sizes: List[int], progress: Any, run_id: str) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    W, R = cfg.workers, cfg.reducers
    esize = numpy_dtype(cfg.dtype).itemsize
    events: "queue.Queue" = queue.Queue()
    procs: List[_Proc] = []
    rows: List[Dict[str, Any]] = []
    chunk = cfg.chunk_bytes or int(rs_config.get("chunk_bytes"))
    try:
        reducer_addrs: List[str] = []
        rprocs: List[_Proc] = []
        rready: Dict[_Proc, Dict[str, Any]] = {}
        if algo == "rs":
            for k in range(R):
                h = W + k if hosts.emulated else 0
                rprocs.append(_spawn(hosts, h, f"reducer {k}",
                                     {"role": "reducer", "bind_host": hosts.bind_host(h),
                                      "threads": rs_config.get("threads")}, events))
            procs += rprocs
            rready = _wait_all(events, rprocs, "ready", cfg.connect_timeout, watch=procs)
            for k, p in enumerate(rprocs):
                host = hosts.bind_host(W + k if hosts.emulated else 0)
                reducer_addrs.append(format_address(host, rready[p]["port"]))
        wprocs = []
        for i in range(W):
            job = {"role": "worker", "algo": algo, "rank": i, "world": W, "sizes": sizes, "dtype": cfg.dtype,
                   "op": cfg.op, "iters": cfg.iters, "warmup": cfg.warmup, "timeout": cfg.timeout,
                   "connect_timeout": cfg.connect_timeout, "bind_host": hosts.bind_host(i if hosts.emulated else 0),
                   "reducers": reducer_addrs, "group": f"bench-{run_id}", "chunk_bytes": chunk,
                   "session": int(run_id, 16) & 0xFFFFFFFF, "compression": cfg.compression if algo == "rs" else None,
                   "wire_dtype": wire_dtype(algo, cfg)}
            wprocs.append(_spawn(hosts, i if hosts.emulated else 0, f"{algo} rank {i}", job, events))
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

        pending: Dict[int, Dict[_Proc, Dict[str, Any]]] = {}
        t_wall = time.monotonic()
        done_sizes = 0
        stall_timeout = max(600.0, 4 * cfg.timeout)

        def on_size(proc: _Proc, msg: Dict[str, Any]) -> None:
            nonlocal t_wall, done_sizes
            if msg.get("event") != "size":
                return
            per = pending.setdefault(msg["size"], {})
            per[proc] = msg
            if len(per) < W:
                return
            cpu = next((m.get("cpu_percent") for m in per.values() if m.get("cpu_percent") is not None), None)
            size = msg["size"]
            ordered = [per[p] for p in wprocs]
            row = report.make_row(algo, size, size // esize, cfg.dtype, cfg.op, W, R,
                                  [m["samples_us"] for m in ordered], sum(int(m["wrong"]) for m in ordered),
                                  cpu_percent=cpu, wall_s=time.monotonic() - t_wall,
                                  emulate_gbps=cfg.emulate_gbps, iters=cfg.iters, warmup=cfg.warmup,
                                  chunk_bytes=chunk if algo == "ring" else int(rs_config.get("chunk_bytes")),
                                  streams=int(rs_config.get("streams")) if algo == "rs" else 1,
                                  wire_dtype=wire_dtype(algo, cfg) or cfg.dtype,
                                  **({"window": int(rs_config.get("window")), "compression": cfg.compression}
                                     if algo == "rs" else {}))
            t_wall = time.monotonic()
            rows.append(row)
            done_sizes += 1
            if progress is not None:
                progress(algo, size)

        # Sizes stream in; 'done' comes after the last one.
        done = _wait_all(events, wprocs, "done", stall_timeout, on_other=on_size, watch=procs)
        wall = time.monotonic() - t_ready
        cpu_s = sum(done[p]["cpu_s"] - ready[p]["cpu_s"] for p in wprocs)
        if rprocs:
            for p in rprocs:
                p.close_stdin()
            rdone = _wait_all(events, rprocs, "done", 30.0)
            cpu_s += sum(rdone[p]["cpu_s"] - rready[p]["cpu_s"] for p in rprocs)
        # The bench's own processes' share of the machine, between 'ready' and 'done'
        # (includes input restores and result checks): the rest of the machine's load is
        # someone else's.
        share = 100.0 * cpu_s / (wall * (os.cpu_count() or 1)) if wall > 0 else None
        for r in rows:
            r["bench_cpu_percent"] = share
        return rows, None
    except BenchError as exc:
        return rows, str(exc)
    finally:
        for p in procs:
            p.close_stdin()
        for p in procs:
            p.kill()


# ------------------------------------------------------------------------ the run
def run(cfg: BenchConfig, out: Callable[[str], None] = print) -> List[Dict[str, Any]]:
    """Run the benchmark, print its tables with `out`, write JSON / plot; returns the rows."""
    if cfg.workers < 1 or cfg.reducers < 1:
        raise ConfigError("--workers and --reducers must be at least 1")
    numpy_dtype(cfg.dtype)
    cfg = _check_compression(dataclasses.replace(cfg, op=check_op(cfg.op)))
    if cfg.iters < 1 or cfg.warmup < 0:
        raise ConfigError("--iters must be >= 1 and --warmup >= 0")
    esize = numpy_dtype(cfg.dtype).itemsize
    sizes = sorted({s - s % esize for s in cfg.sizes if s >= esize})
    if not sizes:
        raise ConfigError(f"no size holds a whole {cfg.dtype} element")
    avail = available_algos()
    if cfg.algos:
        unknown = [a for a in cfg.algos if a not in avail]
        if unknown:
            raise ConfigError(f"unknown algorithm(s) {', '.join(unknown)}: choose from "
                              f"{', '.join(ALL_ALGOS + EXTRA_ALGOS)}")
        algos = []
        for a in cfg.algos:
            if avail[a]:
                out(f"# note: skipping {a}: {avail[a]}")
            else:
                algos.append(a)
    else:
        default = ALL_ALGOS + (("gloo-bf16",) if cfg.compression else ())
        algos = [a for a in default if avail[a] is None]
        for a in default:
            if avail[a]:
                out(f"# note: skipping {a}: {avail[a]}")
    if cfg.plot_path:
        from .plot import _pyplot

        _pyplot()  # fail now, not after the run, when matplotlib is missing

    # load on the machine before we start anything: others' work disturbs the numbers
    b0 = cpu_monitor.read_cpu_times()
    time.sleep(1.0)
    b1 = cpu_monitor.read_cpu_times()
    background = 100.0 * (b1[0] - b0[0]) / max(1, b1[1] - b0[1])

    run_id = uuid.uuid4().hex[:8]
    where = (f"{cfg.emulate_gbps:g} Gbit/s emulated full-duplex NIC per host (network namespaces + tbf), "
             f"{cfg.workers + (cfg.reducers if 'rs' in algos else 0)} hosts" if cfg.emulate_gbps else "loopback")
    out(f"# reduction-server bench: workers={cfg.workers} reducers={cfg.reducers} dtype={cfg.dtype} op={cfg.op} "
        f"iters={cfg.iters} warmup={cfg.warmup} algos={','.join(algos)}"
        + (f" compression={cfg.compression} (rs: float32 sent as 16-bit)" if cfg.compression else ""))
    out(f"# network: {where}")
    out(f"# machine: {machine_description()}")
    out(f"# background CPU load before the run: {background:.0f}% of {os.cpu_count()} cores"
        + (" (the machine is not idle: expect disturbed numbers)" if background > 10 else ""))
    out(f"# rs: RS_CHUNK_BYTES={rs_config.get('chunk_bytes')} (largest chunk; a round uses about shard/64, at "
        f"least 64 KiB) RS_WINDOW={rs_config.get('window')} RS_STREAMS={rs_config.get('streams')}; "
        f"ring chunk {cfg.chunk_bytes or rs_config.get('chunk_bytes')} B")

    all_rows: List[Dict[str, Any]] = []
    errors: Dict[str, Optional[str]] = {}
    cpu_by_algo: Dict[str, Any] = {}
    emu_ctx = None
    try:
        if cfg.emulate_gbps:
            from . import emulate

            n_hosts = cfg.workers + (cfg.reducers if "rs" in algos else 0)
            try:
                emu_ctx = emulate.EmulatedHosts(n_hosts, cfg.emulate_gbps, prefix=cfg.netns_prefix)
                hosts: Any = _EmulatedHosts(emu_ctx.__enter__())
            except emulate.EmulationError as exc:
                emu_ctx = None
                raise ConfigError(f"--emulate-gbps: {exc}") from None
        else:
            hosts = _LoopbackHosts()

        prog, advance = _progress(cfg, algos, sizes)
        try:
            for algo in algos:
                mon = cpu_monitor.CpuMonitor(interval=0.5).start()
                try:
                    rows, err = _run_algo(algo, cfg, hosts, sizes, advance, run_id)
                finally:
                    mon.stop()
                    cpu_by_algo[algo] = mon
                all_rows += rows
                errors[algo] = err
                if err:
                    log.error("%s failed: %s", algo, err)
        finally:
            if prog is not None:
                prog.stop()
    finally:
        if emu_ctx is not None:
            emu_ctx.__exit__(None, None, None)

    for algo in algos:
        out("")
        out(report.format_algo_table(algo, [r for r in all_rows if r["algo"] == algo], cfg.workers, cfg.reducers,
                                     errors.get(algo), compression=cfg.compression if algo == "rs" else None))
        mine = next((r.get("bench_cpu_percent") for r in all_rows if r["algo"] == algo), None)
        if algo in cpu_by_algo:
            mon = cpu_by_algo[algo]
            txt = f"# CPU during the {algo} run (start-up, input restores and checks included): whole machine " \
                  f"mean {mon.mean_percent:.0f}% of {mon.ncpu} cores"
            if mine is not None:
                txt += (f", of which this benchmark's processes {mine:.0f}% (user + system time; the rest is "
                        "kernel network processing in softirq, and any other load)")
            out(txt)
    if all_rows:
        out("")
        out(report.format_summary(all_rows, cfg.workers, cfg.reducers, cfg.emulate_gbps))
    if cfg.emulate_gbps:
        for algo in algos:
            hot = [r for r in all_rows if r["algo"] == algo and (r.get("cpu_percent") or 0) > cfg.cpu_warn_percent]
            if hot:
                which = ", ".join(f"{r['size']} B ({r['cpu_percent']:.0f}%)" for r in hot)
                out(f"# WARNING: {algo}: the machine's CPU was busy more than {cfg.cpu_warn_percent:.0f}% during the "
                    f"timed all-reduces at {which}: there the {os.cpu_count()} cores, not the emulated "
                    f"{cfg.emulate_gbps:g} Gbit/s links, may be the limit")
    for r in all_rows:
        r["background_cpu_percent"] = background
    if cfg.json_path:
        report.write_json(cfg.json_path, all_rows)
        out(f"# wrote {len(all_rows)} rows to {cfg.json_path}")
    if cfg.plot_path and all_rows:
        from .plot import plot

        plot(all_rows, cfg.plot_path, cfg.workers, cfg.reducers, cfg.emulate_gbps)
        out(f"# wrote plot {cfg.plot_path}")
    failed = [a for a in algos if errors.get(a)]
    if failed:
        raise BenchError("benchmark failed for " + ", ".join(f"{a}: {errors[a]}" for a in failed))
    return all_rows


def _progress(cfg: BenchConfig, algos: List[str], sizes: List[int]):
    """A rich progress bar on stderr (one task per algorithm); returns (progress, advance)."""
    if not cfg.progress:
        return None, None
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        return None, None
    prog = Progress(TextColumn("{task.description:<6}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[last]}"), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=False)
    tasks = {a: prog.add_task(a, total=len(sizes), last="") for a in algos}
    prog.start()

    def advance(algo: str, size: int) -> None:
        prog.update(tasks[algo], advance=1, last=f"{size} B")

    return prog, advance
