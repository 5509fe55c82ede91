"""Runs the benchmark: starts the rank processes of each algorithm (on loopback or in
emulated hosts), collects their samples, prints the tables and writes JSON / plot.

Every measured rank is its own process (reducer.bench.rank), started once per algorithm;
it loops over all sizes itself. Reducers (rs only) are processes too. With
``emulate_gbps`` every worker and every reducer gets its own network namespace
(reducer.bench.emulate) with a B Gbit/s full-duplex link.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import config as rs_config
from ..addresses import format_address
from ..dtypes import check_op, numpy_dtype
from ..errors import ConfigError
from . import bulk, control_ab, cpu_monitor, emulate, plot, report, steps, tcp_counters
from .congestion import check_congestion, congestion_label, describe_congestion, use_congestion
from .options import (
    ALL_ALGOS,
    EXTRA_ALGOS,
    BenchConfig,
    _check_compression,
    available_algos,
    machine_description,
    wire_dtype,
)
from .plot import _pyplot
from .poller import merge_counts
from .procs import BenchError, LoopbackHosts, NamespaceHosts, _Proc, spawn, wait_all
from .report import uses_reducers

log = logging.getLogger("reducer.bench")


# ------------------------------------------------------------------------ one algorithm
RowMaker = Callable[[str, Any, list[dict[str, Any]], float], dict[str, Any]]


class _Pass:
    """The processes of one algorithm's pass, started and stopped in the steps of _run_algo: the
    reducers (algorithms that use them), the control-plane poller (when they run the control
    plane), the W measured ranks; `rows` collects the results as they stream in."""

    def __init__(self, algo: str, cfg: BenchConfig, hosts: Any, run_id: str, extra_env: dict[str, str] | None) -> None:
        self.algo, self.cfg, self.hosts, self.run_id, self.extra_env = algo, cfg, hosts, run_id, extra_env
        self.events: queue.Queue = queue.Queue()
        self.procs: list[_Proc] = []  # every process started (stopped at the end), watched while waiting
        self.rprocs: list[_Proc] = []
        self.rready: dict[_Proc, dict[str, Any]] = {}
        self.reducer_addrs: list[str] = []
        self.poller: _Proc | None = None
        self.pready: dict[_Proc, dict[str, Any]] = {}
        self.wprocs: list[_Proc] = []
        self.ready: dict[_Proc, dict[str, Any]] = {}
        self.rows: list[dict[str, Any]] = []
        self.t_rready = self.t_pready = self.t_ready = 0.0

    def _host(self, i: int) -> int:
        """Process i's host (workers 0..W-1, reducers W.., the poller W+R); all on one on loopback."""
        return i if self.hosts.emulated else 0

    def _spawn(self, i: int, name: str, job: dict[str, Any]) -> _Proc:
        return spawn(self.hosts, self._host(i), name, job, self.events, self.extra_env)

    def _wait_started(self, procs: list[_Proc], event: str) -> dict[_Proc, dict[str, Any]]:
        return wait_all(self.events, procs, event, self.cfg.start_timeout(), watch=self.procs)

    def start_reducers(self) -> None:
        """The reducers, if the algorithm uses them, up and listening: their addresses."""
        W = self.cfg.workers
        if uses_reducers(self.algo):
            control = control_ab.with_control_plane(self.algo, self.cfg.control_plane)
            for k in range(self.cfg.reducers):
                job = {
                    "role": "reducer",
                    "bind_host": self.hosts.bind_host(self._host(W + k)),
                    "threads": rs_config.get("threads"),
                    "control_plane": control,
                }
                self.rprocs.append(self._spawn(W + k, f"reducer {k}", job))
            self.procs += self.rprocs
            self.rready = self._wait_started(self.rprocs, "ready")
            self.reducer_addrs = [
                format_address(self.hosts.bind_host(self._host(W + k)), self.rready[p]["port"])
                for k, p in enumerate(self.rprocs)
            ]
        self.t_rready = self.t_pready = time.monotonic()  # the reducers are up (if any)

    def start_poller(self) -> None:
        """When the reducers run the control plane: the poller, polling them."""
        if not (control_ab.with_control_plane(self.algo, self.cfg.control_plane) and self.rprocs):
            return
        # on a host of its own when emulated (W + R): its requests cross the reducers' shaped links
        job = {
            "role": "poller",
            "interval": self.cfg.poll_interval,
            "control": [self.rready[p]["control_address"] for p in self.rprocs],
            "metrics": [self.rready[p]["metrics_url"] for p in self.rprocs],
        }
        self.poller = self._spawn(self.cfg.workers + self.cfg.reducers, "control-plane poller", job)
        self.procs.append(self.poller)
        self.pready = self._wait_started([self.poller], "ready")
        self.t_pready = time.monotonic()

    def start_workers(self, work: dict[str, Any]) -> None:
        """The W ranks, handed `work`: each says where it listens, gets every rank's address and
        connects; returns once all are 'ready' (connected, not started)."""
        cfg, algo = self.cfg, self.algo
        is_rs = control_ab.base_algo(algo) == "rs"
        chunk = cfg.chunk_bytes or int(rs_config.get("chunk_bytes"))
        for i in range(cfg.workers):
            job = {
                "role": "worker",
                "algo": algo,
                "rank": i,
                "world": cfg.workers,
                "dtype": cfg.dtype,
                "op": cfg.op,
                "iters": cfg.iters,
                "iters_bytes": cfg.iters_bytes,
                "warmup": cfg.warmup,
                "warmup_bytes": cfg.warmup_bytes,
                "timeout": cfg.timeout,
                "connect_timeout": cfg.start_timeout(),
                "bind_host": self.hosts.bind_host(self._host(i)),
                "reducers": self.reducer_addrs,
                "group": f"bench-{self.run_id}",
                "chunk_bytes": chunk,
                "session": int(self.run_id, 16) & 0xFFFFFFFF,
                "compression": cfg.compression if is_rs else None,
                "wire_dtype": wire_dtype(algo, cfg),
                **work,
            }
            self.wprocs.append(self._spawn(i, f"{algo} rank {i}", job))
        self.procs += self.wprocs
        listen = self._wait_started(self.wprocs, "listen")
        addrs = [
            format_address(self.hosts.bind_host(self._host(i)), listen[p].get("port") or 0)
            for i, p in enumerate(self.wprocs)
        ]
        for p in self.wprocs:
            p.send({"addresses": addrs})
        self.ready = self._wait_started(self.wprocs, "ready")
        self.t_ready = time.monotonic()

    def flows(self) -> dict[str, int] | None:
        """The congestion control of worker 0's (and reducer 0's) established connections, counted
        (emulated hosts only, else None)."""
        flows: dict[str, int] | None = None
        for h in [0] + ([self.cfg.workers] if self.rprocs and self.hosts.emulated else []):
            got = self.hosts.flow_congestion(h)
            if got is not None:
                flows = flows or {}
                for name, n in got.items():
                    flows[name] = flows.get(name, 0) + n
        return flows

    def stream_results(self, make_row: RowMaker) -> dict[_Proc, dict[str, Any]]:
        """Start the ranks and turn each result key's W messages into a row as they stream in;
        returns the ranks' 'done' messages, which come after their last result."""
        for p in self.wprocs:  # connected and looked at: go
            p.send({"start": True})
        pending: dict[Any, dict[_Proc, dict[str, Any]]] = {}
        t_wall = time.monotonic()

        def on_result(proc: _Proc, msg: dict[str, Any]) -> None:
            nonlocal t_wall
            if msg.get("event") != "result":
                return
            per = pending.setdefault(msg["key"], {})
            per[proc] = msg
            if len(per) < self.cfg.workers:
                return
            self.rows.append(make_row(self.algo, msg["key"], [per[p] for p in self.wprocs], time.monotonic() - t_wall))
            t_wall = time.monotonic()

        stall_timeout = max(600.0, 4 * self.cfg.timeout)
        return wait_all(
            self.events, self.wprocs, "done", stall_timeout, on_other=on_result, watch=self.procs, idle=True
        )

    def collect_cpu(self, done: dict[_Proc, dict[str, Any]], polls: list[dict[str, Any]] | None) -> None:
        """Stop the poller and the reducers and set every row's bench_cpu_percent (and reducer_cpu_s);
        the poller's counts are appended to `polls`."""
        wall = time.monotonic() - self.t_ready
        # The bench's own processes' share of the machine: each process's CPU seconds over the time
        # it was measured (workers: 'ready' to 'done', with input restores and result checks; reducers
        # and the poller: their own 'ready' to the end), in cores; the rest of the load is someone else's.
        worker_cpu_s = sum(done[p]["cpu_s"] - self.ready[p]["cpu_s"] for p in self.wprocs)
        cores = worker_cpu_s / wall if wall > 0 else 0.0
        if self.poller is not None:
            self.poller.close_stdin()
            pdone = wait_all(self.events, [self.poller], "done", 60.0)[self.poller]
            cores += (pdone["cpu_s"] - self.pready[self.poller]["cpu_s"]) / max(1e-3, time.monotonic() - self.t_pready)
            if polls is not None:
                polls.append(pdone["polls"])
        if self.rprocs:
            for p in self.rprocs:
                p.close_stdin()
            rdone = wait_all(self.events, self.rprocs, "done", 30.0)
            reducer_cpu_s = sum(rdone[p]["cpu_s"] - self.rready[p]["cpu_s"] for p in self.rprocs)
            cores += reducer_cpu_s / max(1e-3, time.monotonic() - self.t_rready)
            for r in self.rows:
                r["reducer_cpu_s"] = reducer_cpu_s  # all reducers, this pass: 'ready' to the end
        share = 100.0 * cores / (os.cpu_count() or 1) if wall > 0 else None
        for r in self.rows:
            r["bench_cpu_percent"] = share
            r["worker_cpu_s"] = worker_cpu_s  # all workers, this pass: 'ready' to 'done'

    def stop(self) -> None:
        for p in self.procs:
            p.close_stdin()
        for p in self.procs:
            p.kill()


def _run_algo(
    algo: str,
    cfg: BenchConfig,
    hosts: Any,
    work: dict[str, Any],
    make_row: RowMaker,
    run_id: str,
    extra_env: dict[str, str] | None = None,
    polls: list[dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Start the ranks (and reducers) of one algorithm, hand them `work` (the job's "sizes", or
    "steps" and "elements"), and turn each result key's W messages into a row with
    make_row(algo, key, messages in rank order, wall seconds). extra_env: added to every
    process's environment. Each row gets "flows": the congestion control of worker 0's (and
    reducer 0's) established connections once the group is connected (emulated hosts only).
    When its reducers run the control plane, a poller polls them meanwhile and its counts are
    appended to `polls`."""
    one = _Pass(algo, cfg, hosts, run_id, extra_env)
    try:
        one.start_reducers()
        one.start_poller()
        one.start_workers(work)
        flows = one.flows()
        tcp_before = hosts.tcp_counters()
        done = one.stream_results(make_row)
        tcp = tcp_counters.delta(tcp_before, hosts.tcp_counters())
        one.collect_cpu(done, polls)
        for r in one.rows:
            if flows is not None:
                r["flows"] = flows
            if tcp is not None:
                r["tcp"] = tcp
        return one.rows, None
    except BenchError as exc:
        return one.rows, str(exc)
    finally:
        one.stop()


# ------------------------------------------------------------------------ the run
def _choose_algos(
    cfg: BenchConfig,
    candidates: Sequence[str],
    avail: dict[str, str | None],
    out: Callable[[str], None],
    default: Sequence[str] | None = None,
) -> list[str]:
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


def _size_row_maker(cfg: BenchConfig) -> RowMaker:
    esize = numpy_dtype(cfg.dtype).itemsize
    chunk = cfg.chunk_bytes or int(rs_config.get("chunk_bytes"))

    def make(algo: str, size: Any, msgs: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
        is_rs = control_ab.base_algo(algo) == "rs"
        cpu = next((m.get("cpu_percent") for m in msgs if m.get("cpu_percent") is not None), None)
        return report.make_row(
            algo,
            size,
            size // esize,
            cfg.dtype,
            cfg.op,
            cfg.workers,
            cfg.reducers,
            [m["samples_us"] for m in msgs],
            sum(int(m["wrong"]) for m in msgs),
            cpu_percent=cpu,
            wall_s=wall_s,
            emulate_gbps=cfg.emulate_gbps,
            iters=cfg.iters,
            warmup=cfg.warmup,
            chunk_bytes=chunk if algo == "ring" else int(rs_config.get("chunk_bytes")),
            streams=int(rs_config.get("streams")) if is_rs else 1,
            wire_dtype=wire_dtype(algo, cfg) or cfg.dtype,
            **({"window": int(rs_config.get("window")), "compression": cfg.compression} if is_rs else {}),
            **({"link_window_max": max(int(m.get("link_window_max") or 0) for m in msgs)} if is_rs else {}),
        )

    return make


def run_sizes(algo: str, cfg: BenchConfig, hosts: Any, run_id: str) -> tuple[list[dict[str, Any]], str | None]:
    """One algorithm over cfg.sizes on `hosts` (emulated or not): its rows and error, without the
    report (for benchmarks that compare something else against these baselines)."""
    return _run_algo(algo, cfg, hosts, {"sizes": list(cfg.sizes)}, _size_row_maker(cfg), run_id)


_Key = tuple[str | None, str]  # (congestion control, algorithm)


@dataclass
class _RunSpec:
    """What a run does, once its configuration is checked (see _validate)."""

    cfg: BenchConfig
    ccs: list[str | None]  # a pass over the algorithms each; None: leave congestion control alone
    algos: list[str]  # what the tables show: with ab, rs+cp after rs
    run_order: list[str]  # the passes over the sizes
    sizes: list[int]
    plan: steps.StepPlan | None  # --model: training steps instead of sizes

    def row_maker(self) -> RowMaker:
        return self.plan.make_row(self.cfg) if self.plan is not None else _size_row_maker(self.cfg)

    def work_passes(self, all_rows: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], int]]:
        """The passes of one congestion control, (algorithm, work, results expected): the model's
        steps (reading the run's rows as they grow), or every size in `run_order`."""
        if self.plan is not None:
            plan = self.plan
            return ((a, plan.work(cases), len(cases)) for a, cases in steps.passes(plan, self.algos, all_rows))
        return ((a, {"sizes": self.sizes}, len(self.sizes)) for a in self.run_order)


@dataclass
class _Results:
    """What the passes produced, keyed by (congestion control, algorithm): each congestion
    control's passes are a run of their own."""

    rows_by_cc: dict[str | None, list[dict[str, Any]]]
    all_rows: list[dict[str, Any]] = field(default_factory=list)  # in run order; steps.passes reads it
    errors: dict[_Key, str | None] = field(default_factory=dict)
    cpu_by_algo: dict[_Key, list[Any]] = field(default_factory=dict)
    polls_by_algo: dict[_Key, list[dict[str, Any]]] = field(default_factory=dict)

    def add(self, key: _Key, rows: list[dict[str, Any]], err: str | None, control_plane: str) -> None:
        cc, algo = key
        if uses_reducers(algo):
            for r in rows:
                r["control_plane"] = "on" if control_ab.with_control_plane(algo, control_plane) else "off"
        self.all_rows += rows
        self.rows_by_cc[cc] += rows
        self.errors[key] = self.errors.get(key) or err
        if err:
            log.error("%s%s failed: %s", algo, "" if cc is None else f" ({cc})", err)


def run(cfg: BenchConfig, out: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run the benchmark, print its tables with `out`, write JSON / plot; returns the rows.

    cfg.model set: training steps of that model (reducer.bench.steps); otherwise buffer sizes."""
    spec = _validate(cfg, out)
    background, load1 = _background_load()  # before we start anything: others' work disturbs the numbers
    run_id = uuid.uuid4().hex[:8]
    n_hosts = _count_hosts(spec)
    _print_header(spec, n_hosts, background, load1, out)
    res = _Results({cc: [] for cc in spec.ccs})
    with _open_hosts(spec.cfg, n_hosts) as hosts:
        bulk_Bps = bulk.baseline(spec.cfg, hosts, out)
        _run_passes(spec, hosts, run_id, res)
    if spec.plan is not None:
        _report_steps(spec, res, out)
    for cc in spec.ccs:
        _report_congestion(spec, res, cc, out)
    all_rows = [r for cc in spec.ccs for r in res.rows_by_cc[cc]]
    for line in bulk.format_ratios(all_rows, bulk_Bps, spec.cfg.workers, spec.cfg.reducers) if bulk_Bps else []:
        out(line)
    for r in all_rows:
        r["background_cpu_percent"] = background
        r["load_average_1m"] = load1
    _write_outputs(spec, res, all_rows, out)
    failed = [(cc, a) for (cc, a), err in res.errors.items() if err]
    if failed:
        raise BenchError(
            "benchmark failed for "
            + ", ".join(f"{a}{'' if cc is None else f' ({cc})'}: {res.errors[(cc, a)]}" for cc, a in failed)
        )
    return all_rows


def _validate(cfg: BenchConfig, out: Callable[[str], None]) -> _RunSpec:
    """cfg checked and normalised, and what it asks to run; ConfigError if it cannot run."""
    if cfg.workers < 1 or cfg.reducers < 1:
        raise ConfigError("--workers and --reducers must be at least 1")
    numpy_dtype(cfg.dtype)
    cfg = _check_compression(dataclasses.replace(cfg, op=check_op(cfg.op)))
    if cfg.iters < 1 or cfg.iters_bytes < 0 or cfg.warmup < 0 or cfg.warmup_bytes < 0:
        raise ConfigError("--iters must be >= 1, --iters-bytes, --warmup and --warmup-bytes >= 0")
    check_congestion(cfg.congestion)
    bulk.check(cfg)
    ccs: list[str | None] = [*cfg.congestion] if cfg.congestion else [None]  # None: leave congestion control alone
    if cfg.model and len(ccs) > 1:
        raise ConfigError("--model runs one congestion control at a time: give --congestion one name")
    plan = None
    sizes: list[int] = []
    if cfg.model:
        model = cfg.model
        if cfg.dtype != "float32":
            raise ConfigError("--model replays float32 gradients: --dtype must be float32")
        cfg = dataclasses.replace(cfg, op="avg")  # DDP averages
        plan = steps.StepPlan(model, cfg.bucket_cap_mb, cfg.first_bucket_mb, cfg.compute_ms, cfg.scale)
        algos = _choose_algos(cfg, steps.ALGOS, available_algos(steps=True), out)
        if plan.needs_gloo and "gloo" not in algos:
            raise ConfigError("--compute-ms gloo needs the gloo algorithm (and torch)")
    else:
        esize = numpy_dtype(cfg.dtype).itemsize
        sizes = sorted({s - s % esize for s in cfg.sizes if s >= esize})
        if not sizes:
            raise ConfigError(f"no size holds a whole {cfg.dtype} element")
        algos = _choose_algos(
            cfg,
            ALL_ALGOS + EXTRA_ALGOS,
            available_algos(),
            out,
            default=ALL_ALGOS + (EXTRA_ALGOS if cfg.compression else ()),
        )
    control_ab.check(cfg.control_plane, algos, cfg.model, cfg.ab_passes, cfg.poll_interval)
    run_order = control_ab.pass_order(algos, cfg.control_plane, cfg.ab_passes)
    if cfg.plot_path:
        _pyplot()  # fail now, not after the run, when matplotlib is missing
    return _RunSpec(cfg, ccs, list(dict.fromkeys(run_order)), run_order, sizes, plan)


def _background_load() -> tuple[float, float]:
    """The machine's CPU load over one second (percent of all cores) and its 1-minute load average."""
    b0 = cpu_monitor.read_cpu_times()
    time.sleep(1.0)
    b1 = cpu_monitor.read_cpu_times()
    return 100.0 * (b1[0] - b0[0]) / max(1, b1[1] - b0[1]), os.getloadavg()[0]


def _count_hosts(spec: _RunSpec) -> int:
    """The emulated hosts the run needs: the workers', the reducers', the control-plane poller's."""
    cfg = spec.cfg
    n_hosts = cfg.workers + (cfg.reducers if any(uses_reducers(a) for a in spec.algos) else 0)
    if any(control_ab.with_control_plane(a, cfg.control_plane) for a in spec.algos):
        n_hosts += 1  # the control-plane poller's
    return n_hosts


def _print_header(spec: _RunSpec, n_hosts: int, background: float, load1: float, out: Callable[[str], None]) -> None:
    cfg = spec.cfg
    where = (
        f"{cfg.emulate_gbps:g} Gbit/s emulated full-duplex NIC per host (network namespaces + tbf), {n_hosts} hosts"
        if cfg.emulate_gbps
        else "loopback"
    )
    out(
        f"# reduction-server bench: workers={cfg.workers} reducers={cfg.reducers} dtype={cfg.dtype} op={cfg.op} "
        f"iters={cfg.iters} warmup={cfg.warmup}"
        + ("" if cfg.model else f" iters_bytes={cfg.iters_bytes} warmup_bytes={cfg.warmup_bytes}")
        + f" algos={','.join(spec.algos)}"
        + (f" compression={cfg.compression} (rs: float32 sent as 16-bit)" if cfg.compression else "")
    )
    out(f"# network: {where}")
    out(f"# machine: {machine_description()}")
    out(
        f"# background CPU load before the run: {background:.0f}% of {os.cpu_count()} cores, load average "
        f"{load1:.2f}" + (" (the machine is not idle: expect disturbed numbers)" if background > 10 else "")
    )
    out(
        f"# rs: RS_CHUNK_BYTES={rs_config.get('chunk_bytes')} (largest chunk; a round uses about shard/64, at "
        f"least 16 KiB, 64 KiB for shards under 128 KiB, shard/128 for shards over 4 MiB; from 128 KiB shards at "
        f"most 512 KiB / (W x 4), at least 8 KiB; window RS_WINDOW, from 128 KiB shards at most shard / (32 x chunk) "
        f"and 512 KiB / (W x chunk), at least 2, those bytes in as few chunks as fit (at least 2); "
        f"more where the path's bandwidth-delay product needs: "
        f"core.pipeline_for, path_window) "
        f"RS_WINDOW={rs_config.get('window')} RS_STREAMS={rs_config.get('streams')}; "
        f"ring chunk {cfg.chunk_bytes or rs_config.get('chunk_bytes')} B"
    )
    out(f"# TCP congestion control: {describe_congestion(spec.ccs, bool(cfg.emulate_gbps))}")
    cp_line = control_ab.describe(cfg.control_plane, cfg.poll_interval, cfg.ab_passes)
    if cp_line:
        out(cp_line)
    if spec.plan is not None:
        for line in spec.plan.describe():
            out(line)


@contextlib.contextmanager
def _open_hosts(cfg: BenchConfig, n_hosts: int) -> Iterator[Any]:
    """The hosts the processes run on: n_hosts emulated ones (torn down after), or loopback."""
    if not cfg.emulate_gbps:
        yield LoopbackHosts()
        return

    emu_ctx = None
    try:
        try:
            emu_ctx = emulate.EmulatedHosts(
                n_hosts,
                cfg.emulate_gbps,
                prefix=cfg.netns_prefix,
                delay_ms=cfg.emulate_delay_ms,
                jitter_ms=cfg.emulate_jitter_ms,
                loss=cfg.emulate_loss,
            )
            hosts = NamespaceHosts(emu_ctx.__enter__())
        except emulate.EmulationError as exc:
            emu_ctx = None
            raise ConfigError(f"--emulate-gbps: {exc}") from None
        yield hosts
    finally:
        if emu_ctx is not None:
            emu_ctx.__exit__(None, None, None)


def _run_passes(spec: _RunSpec, hosts: Any, run_id: str, res: _Results) -> None:
    """Every congestion control's passes over the algorithms, into `res` (an algorithm that failed
    under a congestion control is not run again under it)."""
    make_row = spec.row_maker()
    prog, add_task = _progress(spec.cfg)
    try:
        for cc in spec.ccs:
            extra_env = use_congestion(hosts, cc)
            for algo, work, n_results in spec.work_passes(res.all_rows):
                key = (cc, algo)
                if n_results == 0 or res.errors.get(key):
                    continue
                mon = cpu_monitor.CpuMonitor(interval=0.5).start()
                advance = add_task(algo if cc is None else f"{algo} {cc}", n_results) if add_task else None
                try:
                    rows, err = _run_algo(
                        algo,
                        spec.cfg,
                        hosts,
                        work,
                        _pass_row_maker(make_row, cc, advance),
                        run_id,
                        extra_env,
                        polls=res.polls_by_algo.setdefault(key, []),
                    )
                finally:
                    mon.stop()
                    res.cpu_by_algo.setdefault(key, []).append(mon)
                res.add(key, rows, err, spec.cfg.control_plane)
    finally:
        if prog is not None:
            prog.stop()


def _pass_row_maker(make_row: RowMaker, cc: str | None, advance: Callable[[str], None] | None) -> RowMaker:
    """make_row, each row marked with the pass's congestion control, the progress bar advanced."""

    def row_and_progress(a: str, key: Any, msgs: list[dict[str, Any]], wall: float) -> dict[str, Any]:
        row = make_row(a, key, msgs, wall)
        if cc is not None:
            row["congestion"] = congestion_label(cc)
        if advance is not None:
            advance(row.get("label") or f"{row['size']} B")
        return row

    return row_and_progress


# ------------------------------------------------------------------------ the report
def _report_steps(spec: _RunSpec, res: _Results, out: Callable[[str], None]) -> None:
    """--model (one congestion control): the step table of every pass, and what failed."""
    cfg = spec.cfg
    steps.finish(res.all_rows)
    res.all_rows.sort(key=steps.sort_key)
    res.rows_by_cc = {spec.ccs[0]: res.all_rows}
    where_short = f"{cfg.emulate_gbps:g} Gbit/s emulated hosts" if cfg.emulate_gbps else "loopback"
    out("")
    out(
        report.format_step_table(
            res.all_rows, f"{cfg.model}: one DDP training step, W={cfg.workers}, R={cfg.reducers}, {where_short}"
        )
    )
    for (_cc, algo), err in res.errors.items():
        if err:
            out(f"# {algo} FAILED: {err}")


def _report_congestion(spec: _RunSpec, res: _Results, cc: str | None, out: Callable[[str], None]) -> None:
    """The tables and notes of the passes under congestion control `cc` (several passes of an
    algorithm are merged into one row per size in res.rows_by_cc)."""
    cfg, sized = spec.cfg, spec.plan is None
    mine_rows = res.rows_by_cc[cc]
    if len(spec.ccs) > 1 or cc is not None:
        out("")
        out(f"# ===== TCP congestion control: {congestion_label(cc)} =====")
    bench_cpu = _mean_by_algo(mine_rows, "bench_cpu_percent")
    reducer_cpu = _mean_by_algo(mine_rows, "reducer_cpu_s")  # per pass
    if sized:
        if len(spec.run_order) > len(spec.algos):  # several passes of an algorithm: one row per size of each
            mine_rows = res.rows_by_cc[cc] = report.merge_passes(mine_rows)
            for r in mine_rows:
                r["bench_cpu_percent"] = bench_cpu.get(r["algo"])
                r["reducer_cpu_s"] = reducer_cpu.get(r["algo"])
        for algo in spec.algos:
            out("")
            out(
                report.format_algo_table(
                    algo,
                    [r for r in mine_rows if r["algo"] == algo],
                    cfg.workers,
                    cfg.reducers,
                    res.errors.get((cc, algo)),
                    compression=cfg.compression if control_ab.base_algo(algo) == "rs" else None,
                )
            )
    _report_polls(spec, res.polls_by_algo, cc, mine_rows, out)
    if cfg.control_plane == "ab" and sized:
        out("")
        out(control_ab.format_table(mine_rows, cfg.poll_interval, bench_cpu, reducer_cpu, cfg.ab_passes))
    for algo in spec.algos:
        _report_algo_notes(algo, [r for r in mine_rows if r["algo"] == algo], res.cpu_by_algo.get((cc, algo)), out)
    if mine_rows and sized:
        out("")
        out(report.format_summary(mine_rows, cfg.workers, cfg.reducers, cfg.emulate_gbps))
        out("")
        out(report.format_variance(mine_rows))
        windows = report.format_windows(mine_rows)
        if windows:
            out(windows)
    if cfg.emulate_gbps:
        _warn_cpu_bound(cfg, spec.algos, mine_rows, out)


def _report_polls(
    spec: _RunSpec,
    polls_by_algo: dict[_Key, list[dict[str, Any]]],
    cc: str | None,
    rows: list[dict[str, Any]],
    out: Callable[[str], None],
) -> None:
    """Each algorithm's poller counts, merged over its passes, into its rows (printed with --control-plane on)."""
    for algo in spec.algos:
        counts = polls_by_algo.get((cc, algo))
        if counts:
            merged = merge_counts(counts)
            for r in rows:
                if r["algo"] == algo:
                    r["polls"] = merged
            if spec.cfg.control_plane == "on":
                out(control_ab.format_polls(merged, spec.cfg.poll_interval, algo))


def _report_algo_notes(
    algo: str, rows_a: list[dict[str, Any]], mons: list[Any] | None, out: Callable[[str], None]
) -> None:
    """The machine's CPU during an algorithm's passes, and the congestion control of its connections."""
    mine = next((r.get("bench_cpu_percent") for r in rows_a), None)
    if mons:
        txt = (
            f"# CPU during the {algo} run (start-up, input restores and checks included): whole machine "
            f"mean {sum(m.mean_percent for m in mons) / len(mons):.0f}% of {mons[0].ncpu} cores"
        )
        if mine is not None:
            txt += (
                f", of which this benchmark's processes {mine:.0f}% (user + system time; the rest is "
                "kernel network processing in softirq, and any other load)"
            )
        out(txt)
    flows = next((r.get("flows") for r in rows_a if r.get("flows")), None)
    if flows:
        out(
            f"# congestion control of the {algo} run's connections on worker 0"
            + (" and reducer 0" if uses_reducers(algo) else "")
            + " (ss -ti, once connected): "
            + ", ".join(f"{k} {v}" for k, v in sorted(flows.items()))
        )
    tcp_line = tcp_counters.describe(algo, next((r.get("tcp") for r in rows_a if r.get("tcp")), None))
    if tcp_line:
        out(tcp_line)


def _warn_cpu_bound(cfg: BenchConfig, algos: list[str], rows: list[dict[str, Any]], out: Callable[[str], None]) -> None:
    """Emulated links: a warning where the machine's CPU, not the links, may have been the limit."""
    for algo in algos:
        hot = [r for r in rows if r["algo"] == algo and (r.get("cpu_percent") or 0) > cfg.cpu_warn_percent]
        if hot:
            which = ", ".join(f"{r.get('label') or str(r['size']) + ' B'} ({r['cpu_percent']:.0f}%)" for r in hot)
            out(
                f"# WARNING: {algo}: the machine's CPU was busy more than {cfg.cpu_warn_percent:.0f}% during "
                f"the timed all-reduces at {which}: there the {os.cpu_count()} cores, not the emulated "
                f"{cfg.emulate_gbps:g} Gbit/s links, may be the limit"
            )


def _write_outputs(spec: _RunSpec, res: _Results, all_rows: list[dict[str, Any]], out: Callable[[str], None]) -> None:
    """--json and --plot (sizes: one plot per congestion control)."""
    cfg = spec.cfg
    if cfg.json_path:
        report.write_json(cfg.json_path, all_rows)
        out(f"# wrote {len(all_rows)} rows to {cfg.json_path}")
    if cfg.plot_path and all_rows:
        if spec.plan is not None:
            plot.plot_steps(all_rows, cfg.plot_path, cfg.workers, cfg.reducers, cfg.emulate_gbps)
            out(f"# wrote plot {cfg.plot_path}")
        else:
            for cc in spec.ccs:
                path = cfg.plot_path if len(spec.ccs) == 1 else _suffixed(cfg.plot_path, congestion_label(cc))
                plot.plot(res.rows_by_cc[cc], path, cfg.workers, cfg.reducers, cfg.emulate_gbps)
                out(f"# wrote plot {path}")


def _suffixed(path: str, tag: str) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}-{tag}{ext}"


def _mean_by_algo(rows: list[dict[str, Any]], key: str) -> dict[str, float | None]:
    """The mean of rows[key] per algorithm (None where no row has it)."""
    out: dict[str, float | None] = {}
    for algo in dict.fromkeys(r["algo"] for r in rows):
        vals = [r[key] for r in rows if r["algo"] == algo and r.get(key) is not None]
        out[algo] = sum(vals) / len(vals) if vals else None
    return out


def _progress(cfg: BenchConfig):
    """A rich progress bar on stderr; returns (progress, add_task), add_task(algo, total) -> advance(label)."""
    if not cfg.progress:
        return None, None
    try:
        from rich.console import Console  # noqa: PLC0415 (rich (60 ms): not at the CLI's start)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415 (rich (60 ms): not at the CLI's start)
    except ImportError:
        return None, None
    prog = Progress(
        TextColumn("{task.description:<7}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[last]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    )
    prog.start()

    def add_task(algo: str, total: int) -> Callable[[str], None]:
        task = prog.add_task(algo, total=total, last="")
        return lambda label: prog.update(task, advance=1, last=label)

    return prog, add_task
