#!/usr/bin/env python3
"""What a reducer failover costs (issue 13), on emulated hosts.

    sudo python -m benchmarks.bench_failover                        # 1 Gbit/s, W=4, R=4, 64 MiB float32
    sudo python -m benchmarks.bench_failover --repeat 3 --ab-sizes 1M,64M --rounds 5

W + R emulated hosts (reducer/bench/emulate.py: one network namespace per host, a rate-limited
full-duplex link each, as `reduction-server bench --emulate-gbps`; needs root). Reducers are the
bench's reducer processes (reducer.bench.rank), workers are processes of this file
(`--worker`, started by reducer.bench.procs.spawn), each with the worker library's
Communicator. Every all-reduce is timed between two barriers (a one-element all-reduce), so every
worker starts it at (nearly) the same moment; time = the slowest worker's (median) time.

One experiment (`--repeat` runs it again with fresh reducers and workers):
  1. release A/B: the same `--ab-sizes` rounds with failover=False and failover=True (two
     communicators in two groups on the same reducers), interleaved (off, on, on, off, ...):
     failover=True adds the DONE/CLEAR release messages of docs/protocol.md section 6.
  2. normal: `--rounds` rounds of `--size` bytes of float32 (sum) on R reducers (failover on).
  3. failover: one more such round; rank 0 SIGKILLs reducer `--victim` `--kill-at` x the normal
     round time after the round started. The workers finish it on R-1 reducers.
  4. following: `--rounds` rounds on the R-1 survivors, against the R-1 link bound
     S x max(1, W/(R-1)) / (0.956 x link rate) (reducer.bench.report.rs_bound_seconds), and
     interleaved with them (following, fresh, fresh, following, ...) the same rounds on a *fresh*
     session on the R-1 survivors (a new Communicator, its own group): the baseline that shows
     what the failover itself leaves behind, measured under the same conditions.

Checks: every worker's inputs are random float32 (seeded by rank), so the fold order shows in the
bits. The first normal round is compared with the float64 sum of all inputs (tolerance W x eps32
x sum |x|); every later round, the failover round included, must equal it bit for bit (the
survivors fold in rank order as the lost reducer did). Any difference fails the run (exit 1).

Printed: the ratios failover round / normal round, following rounds / R-1 bound and following
rounds / fresh R-1 session, with the verdicts against issue 13's targets (<= 1.6x, within 5%), and the
release A/B ratio on/off. The load average is printed before and after; above 2 the numbers are marked PRELIMINARY.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from reducer import config as rs_config
from reducer.addresses import format_address
from reducer.bench import emulate, options, procs, report
from reducer.bench.rank import _read_json_line, cpu_seconds, emit
from reducer.communicator import Communicator

LOAD_LIMIT = 2.0  # above this load average the numbers are preliminary
FAILOVER_LIMIT = 1.6  # issue 13: the failover round takes at most 1.6x a normal round
FOLLOWING_LIMIT = 0.05  # issue 13: the following rounds are within 5% of the R-1 link bound
SEED = 13
CLOSE_WAIT_S = 15.0  # a worker's Communicator.close() taking longer is reported as hung


# ------------------------------------------------------------------------ pure helpers
def random_input(rank: int, count: int, seed: int = SEED) -> np.ndarray:
    """Rank's input: `count` standard-normal float32 values (a fresh array; the same on every call)."""
    return np.random.default_rng((seed, rank)).standard_normal(count, dtype=np.float32)


def float64_reference(world: int, count: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """(float64 sum of every rank's random_input, absolute tolerance per element). A float32 sum of
    `world` values in any order is within (world - 1) x eps32 x sum |x| of the exact sum; the
    tolerance is world x eps32 x sum |x| (and at least one eps32)."""
    ref = np.zeros(count, np.float64)
    mag = np.zeros(count, np.float64)
    for r in range(world):
        x = random_input(r, count, seed).astype(np.float64)
        ref += x
        mag += np.abs(x)
    eps = float(np.finfo(np.float32).eps)
    return ref, np.maximum(world * eps * mag, eps)


def count_off(out: np.ndarray, ref: np.ndarray, tol: np.ndarray) -> int:
    """Elements of `out` farther than `tol` from `ref`."""
    return int(np.count_nonzero(np.abs(out.astype(np.float64) - ref) > tol))


def count_bits_differ(a: np.ndarray, b: np.ndarray) -> int:
    """Elements whose bit patterns differ (a NaN is not equal to itself here only if its bits differ)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError("shape or dtype mismatch")
    u = np.dtype(f"u{a.dtype.itemsize}")
    return int(np.count_nonzero(a.view(u) != b.view(u)))


def slowest(samples_by_rank: Sequence[Sequence[float]]) -> float:
    """The slowest worker's median (the bench's `time`)."""
    return max(statistics.median(s) for s in samples_by_rank)


def verdicts(normal_s: float, failover_s: float, following_s: float, bound_s: float) -> dict[str, Any]:
    """Issue 13's two targets: failover round / normal round <= 1.6, following / R-1 bound <= 1.05."""
    fo = failover_s / normal_s
    fl = following_s / bound_s
    return {
        "failover_ratio": fo,
        "failover_ok": fo <= FAILOVER_LIMIT,
        "following_ratio": fl,
        "following_ok": fl <= 1.0 + FOLLOWING_LIMIT,
    }


# ------------------------------------------------------------------------ worker process
def _timed(comm: Any, buf: np.ndarray, inp: np.ndarray, tiny: np.ndarray) -> float:
    """Restore the input, barrier, time one all-reduce of `buf`, barrier."""
    np.copyto(buf, inp)
    comm.allreduce(tiny, compression="none")
    t0 = time.perf_counter()
    comm.allreduce(buf, op="sum", compression="none")
    t1 = time.perf_counter()
    comm.allreduce(tiny, compression="none")  # nobody checks (uses CPU) while another is still timing
    return t1 - t0


class _Checker:
    """The first result of an input against the float64 reference, every later one bit for bit
    against that first."""

    def __init__(self, world: int, count: int) -> None:
        self.world, self.count = world, count
        self.first: np.ndarray | None = None
        self.wrong = 0  # elements outside the float64 tolerance (first result)
        self.differ = 0  # elements whose bits differ from the first result (later ones)

    def check(self, buf: np.ndarray) -> int:
        if self.first is None:
            ref, tol = float64_reference(self.world, self.count)
            self.wrong = count_off(buf, ref, tol)
            self.first = buf.copy()
            return self.wrong
        d = count_bits_differ(buf, self.first)
        self.differ += d
        return d


def _sigkill_at(pid: int, t_start: list[float], record: dict[str, float]) -> None:
    record["killed_after_s"] = time.perf_counter() - t_start[0]
    os.kill(pid, signal.SIGKILL)


def _connect(job: dict[str, Any], failover: bool) -> Communicator:
    """A worker's communicator, in the group of its failover setting."""
    return Communicator(
        job["reducers"],
        rank=job["rank"],
        world_size=job["world"],
        group=f"{job['group']}-{'on' if failover else 'off'}",
        job_id="bench-failover",
        timeout=job["timeout"],
        connect_timeout=job["connect_timeout"],
        failover=failover,
    )


def _worker(job: dict[str, Any]) -> None:
    rank, world = job["rank"], job["world"]

    comms = {"off": _connect(job, False), "on": _connect(job, True)}
    tiny = np.zeros(1, np.float32)
    emit(event="ready", cpu_s=cpu_seconds())

    # 1. release A/B, interleaved
    for size in job["ab_sizes"]:
        count = size // 4
        inp, buf = random_input(rank, count), np.empty(count, np.float32)
        chk = _Checker(world, count)
        samples: dict[str, list[float]] = {"off": [], "on": []}
        for it in range(1 + job["ab_rounds"]):  # iteration 0 warms up
            for mode in ("off", "on") if it % 2 == 0 else ("on", "off"):
                dt = _timed(comms[mode], buf, inp, tiny)
                chk.check(buf)
                if it > 0:
                    samples[mode].append(dt)
        emit(event=f"ab {size}", size=size, samples=samples, wrong=chk.wrong, differ=chk.differ)
    comms.pop("off").close()
    comm = comms["on"]

    # 2. normal rounds on R reducers
    count = job["size"] // 4
    inp, buf = random_input(rank, count), np.empty(count, np.float32)
    chk = _Checker(world, count)
    normal = []
    for it in range(1 + job["rounds"]):
        dt = _timed(comm, buf, inp, tiny)
        chk.check(buf)
        if it > 0:
            normal.append(dt)
    emit(event="normal", samples=normal, wrong=chk.wrong, differ=chk.differ, stats=comm.stats())

    # 3. the failover round: rank 0 kills the victim `after_s` into it
    go = _read_json_line()
    kill = go.get("kill")
    record: dict[str, float] = {}
    t_start = [0.0]
    timer = None
    if kill:
        timer = threading.Timer(kill["after_s"], _sigkill_at, (kill["pid"], t_start, record))
        timer.daemon = True
    np.copyto(buf, inp)
    comm.allreduce(tiny, compression="none")
    t_start[0] = time.perf_counter()
    if timer is not None:
        timer.start()
    comm.allreduce(buf, op="sum", compression="none")
    dt = time.perf_counter() - t_start[0]
    if timer is not None:
        timer.join(60.0)  # the kill has happened before anything else is timed
    comm.allreduce(tiny, compression="none")
    differ = chk.check(buf)
    ref, tol = float64_reference(world, count)
    emit(event="failover", seconds=dt, differ=differ, wrong=count_off(buf, ref, tol), stats=comm.stats(), **record)
    del ref, tol

    # 4. the following rounds on the survivors, interleaved with a fresh session on them
    survivors = [a for k, a in enumerate(job["reducers"]) if k != job["victim"]]
    fresh = Communicator(
        survivors,
        rank=rank,
        world_size=world,
        group=f"{job['group']}-fresh",
        job_id="bench-failover",
        timeout=job["timeout"],
        connect_timeout=job["connect_timeout"],
    )
    _timed(fresh, buf, inp, tiny)  # its first round warms it up (connections, buffers), as for the normal rounds
    differ = chk.check(buf)
    following: list[float] = []
    baseline: list[float] = []
    for it in range(job["rounds"]):
        for which in ("following", "fresh") if it % 2 == 0 else ("fresh", "following"):
            if which == "following":
                following.append(_timed(comm, buf, inp, tiny))
            else:
                baseline.append(_timed(fresh, buf, inp, tiny))
            differ += chk.check(buf)
    fresh.close()
    emit(event="following", samples=following, fresh=baseline, differ=differ, stats=comm.stats())
    # close() is bounded here: a close that hangs is reported (close_hung), not waited for
    closer = threading.Thread(target=comm.close, daemon=True)
    closer.start()
    closer.join(CLOSE_WAIT_S)
    emit(event="done", cpu_s=cpu_seconds(), close_hung=closer.is_alive())
    if closer.is_alive():
        sys.stdout.flush()
        os._exit(0)


def _worker_main() -> int:
    job = _read_json_line()
    try:
        _worker(job)
        return 0
    except BaseException as exc:  # reported, so the runner can show why
        emit(event="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        return 1


# ------------------------------------------------------------------------ the experiment
def _pid_is_reducer(pid: int) -> bool:
    """`ip netns exec` execs the command: the Popen's pid is the reducer's python process itself."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"reducer.bench.rank" in f.read()
    except OSError:
        return False


def note(text: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


class _Inbox:
    """procs.wait_all for phases that follow each other: a message of a later phase that arrives
    while an earlier one is awaited (a fast worker) is kept for its own wait, not dropped. Every
    event name is used once per process."""

    def __init__(self, events: queue.Queue, procs: list[Any], timeout: float) -> None:
        self.events, self.procs, self.timeout = events, procs, timeout
        self.kept: dict[tuple[Any, str], dict[str, Any]] = {}

    def _keep(self, proc: Any, msg: dict[str, Any]) -> None:
        self.kept[(proc, msg.get("event", ""))] = msg

    def wait(self, procs: list[Any], event: str) -> list[dict[str, Any]]:
        """Each of `procs`' message `event`, in the order of `procs`."""
        got = {p: self.kept.pop((p, event)) for p in procs if (p, event) in self.kept}
        rest = [p for p in procs if p not in got]
        if rest:
            got.update(
                procs.wait_all(self.events, rest, event, self.timeout, on_other=self._keep, watch=self.procs, idle=True)
            )
        return [got[p] for p in procs]


def _worker_job(args: argparse.Namespace, rank: int, addrs: list[str], group: str) -> dict[str, Any]:
    """What worker `rank` is told to do (its --worker process reads it)."""
    return {
        "rank": rank,
        "world": args.workers,
        "reducers": addrs,
        "group": group,
        "timeout": args.round_timeout,
        "connect_timeout": args.connect_timeout,
        "size": args.size,
        "rounds": args.rounds,
        "ab_sizes": args.ab_sizes,
        "ab_rounds": args.ab_rounds,
        "victim": args.victim,
    }


def _ab_rows(inbox: Any, wprocs: list[Any], sizes: list[int]) -> list[dict[str, Any]]:
    """The release A/B per size: the slowest worker's rounds with failover off and on."""
    ab = []
    for size in sizes:
        msgs = inbox.wait(wprocs, f"ab {size}")
        off = slowest([m["samples"]["off"] for m in msgs])
        on = slowest([m["samples"]["on"] for m in msgs])
        ab.append(
            {
                "size": size,
                "off_s": off,
                "on_s": on,
                "ratio": on / off,
                "wrong": sum(m["wrong"] for m in msgs),
                "differ": sum(m["differ"] for m in msgs),
            }
        )
    return ab


def run_once(args: argparse.Namespace, hosts: Any) -> dict[str, Any]:
    W, R = args.workers, args.reducers
    events: queue.Queue = queue.Queue()
    procs: list[Any] = []
    phase_timeout = args.timeout
    load_before = os.getloadavg()[0]
    try:
        rprocs = []
        for k in range(R):
            h = W + k
            rprocs.append(
                procs.spawn(
                    hosts,
                    h,
                    f"reducer {k}",
                    {"role": "reducer", "bind_host": hosts.bind_host(h), "threads": rs_config.get("threads")},
                    events,
                )
            )
        procs += rprocs
        rready = procs.wait_all(events, rprocs, "ready", args.connect_timeout, watch=procs)
        addrs = [format_address(hosts.bind_host(W + k), rready[p]["port"]) for k, p in enumerate(rprocs)]
        group = f"failover-{uuid.uuid4().hex[:8]}"
        wprocs = []
        for i in range(W):
            job = _worker_job(args, i, addrs, group)
            wprocs.append(
                procs.spawn(hosts, i, f"worker {i}", job, events, module="benchmarks.bench_failover", args=["--worker"])
            )
        procs += wprocs
        inbox = _Inbox(events, procs, phase_timeout)
        inbox.wait(wprocs, "ready")
        note("workers connected")

        ab = _ab_rows(inbox, wprocs, args.ab_sizes)
        note("release A/B done")
        msgs = inbox.wait(wprocs, "normal")
        note("normal rounds done")
        normal_s = slowest([m["samples"] for m in msgs])
        wrong = sum(m["wrong"] for m in msgs)
        differ = sum(m["differ"] for m in msgs)

        victim = rprocs[args.victim]
        if not _pid_is_reducer(victim.p.pid):
            raise procs.BenchError(f"pid {victim.p.pid} is not the reducer process: cannot kill it precisely")
        victim.finished = True  # its exit is expected from now on
        after_s = args.kill_at * normal_s
        for i, p in enumerate(wprocs):
            p.send({"kill": {"pid": victim.p.pid, "after_s": after_s}} if i == 0 else {})
        fmsgs = inbox.wait(wprocs, "failover")
        note("failover round done")
        lmsgs = inbox.wait(wprocs, "following")
        note("following rounds done")
        close_hung = [i for i, m in enumerate(inbox.wait(wprocs, "done")) if m.get("close_hung")]
        log_lines = [line for line in wprocs[0].stderr_tail(40).splitlines() if "failover" in line or "lost" in line]
        for p in rprocs:
            if p is not victim:
                p.close_stdin()
        procs.wait_all(events, [p for p in rprocs if p is not victim], "done", 30.0)

        failover_s = max(m["seconds"] for m in fmsgs)
        following_s = slowest([m["samples"] for m in lmsgs])
        fresh_s = slowest([m["fresh"] for m in lmsgs])
        bound_r = report.rs_bound_seconds(args.size, W, R, args.gbps)
        bound_s = report.rs_bound_seconds(args.size, W, R - 1, args.gbps)
        out = {
            "normal_s": normal_s,
            "failover_s": failover_s,
            "following_s": following_s,
            "following_first_s": max(m["samples"][0] for m in lmsgs),
            "following_rounds_s": [max(m["samples"][i] for m in lmsgs) for i in range(args.rounds)],
            "bound_R_s": bound_r,
            "fresh_s": fresh_s,
            "fresh_rounds_s": [max(m["fresh"][i] for m in lmsgs) for i in range(args.rounds)],
            "following_over_fresh": following_s / fresh_s,
            "bound_R1_s": bound_s,
            "kill_after_s": fmsgs[0].get("killed_after_s"),
            "planned_kill_s": after_s,
            "wrong": wrong + sum(m["wrong"] for m in fmsgs),
            "differ": differ + sum(m["differ"] for m in fmsgs) + sum(m["differ"] for m in lmsgs),
            "stats": [m["stats"] for m in lmsgs],
            "ab": ab,
            "log": log_lines,
            "close_hung": close_hung,
            "load": (load_before, os.getloadavg()[0]),
        }
        out.update(verdicts(normal_s, failover_s, following_s, bound_s))
        return out
    except procs.BenchError as exc:
        tails = "\n".join(f"--- {p.name}:\n{p.stderr_tail(8)}" for p in procs)
        raise procs.BenchError(f"{exc}\n{tails}") from None
    finally:
        for p in procs:
            p.kill()


def _stat(stats: list[dict[str, Any]], key: str) -> str:
    vals = sorted({s.get(key) for s in stats}, key=str)
    return "/".join(str(v) for v in vals)


def format_run(run: dict[str, Any], args: argparse.Namespace) -> str:
    R = args.reducers
    lb, la = run["load"]
    ok = "PASS" if run["failover_ok"] else "FAIL"
    ok2 = "PASS" if run["following_ok"] else "FAIL"
    lines = [
        f"# load average {lb:.2f} before, {la:.2f} after"
        + ("  ** PRELIMINARY (load > 2) **" if max(lb, la) > LOAD_LIMIT else "")
    ]
    for a in run["ab"]:
        lines.append(
            f"  release A/B {a['size']:>10} B: failover off {1e3 * a['off_s']:8.1f} ms, on "
            f"{1e3 * a['on_s']:8.1f} ms, on/off {a['ratio']:.3f}"
        )
    kill = run["kill_after_s"]
    lines += [
        f"  normal round (R={R})    {1e3 * run['normal_s']:8.1f} ms  ({100 * run['bound_R_s'] / run['normal_s']:.1f}% "
        f"of the R={R} bound {1e3 * run['bound_R_s']:.1f} ms)",
        f"  failover round         {1e3 * run['failover_s']:8.1f} ms  = {run['failover_ratio']:.2f}x normal "
        f"(limit {FAILOVER_LIMIT}x: {ok}); reducer {args.victim} killed "
        + (f"{1e3 * kill:.1f} ms into it" if kill is not None else "NOT (the round ended first)"),
        f"  following rounds (R={R - 1}) {1e3 * run['following_s']:8.1f} ms  = {run['following_ratio']:.3f}x "
        f"the R={R - 1} bound {1e3 * run['bound_R1_s']:.1f} ms (limit {1 + FOLLOWING_LIMIT:.2f}x: {ok2}); "
        f"each (slowest worker): {', '.join(f'{1e3 * t:.0f}' for t in run['following_rounds_s'])} ms",
        f"  fresh R={R - 1} session    {1e3 * run['fresh_s']:8.1f} ms  = {run['fresh_s'] / run['bound_R1_s']:.3f}x the "
        f"bound (interleaved with the following rounds; following / fresh = {run['following_over_fresh']:.3f}); each: "
        f"{', '.join(f'{1e3 * t:.0f}' for t in run['fresh_rounds_s'])} ms",
        f"  checks: {run['wrong']} elements off the float64 reference, {run['differ']} differing from the healthy "
        f"round's bits (+ A/B: {sum(a['wrong'] + a['differ'] for a in run['ab'])}); workers' stats: "
        f"reducer_failovers {_stat(run['stats'], 'reducer_failovers')}, reducers_active "
        f"{_stat(run['stats'], 'reducers_active')}, repaired_bytes {_stat(run['stats'], 'repaired_bytes')}, "
        f"reducer_rejoins {_stat(run['stats'], 'reducer_rejoins')}",
    ]
    if run["close_hung"]:
        lines.append(
            f"  WARNING: Communicator.close() did not return within {CLOSE_WAIT_S:g} s on worker(s) "
            f"{run['close_hung']} after the failover"
        )
    lines += [f"  rank 0 log: {line.strip()}" for line in run["log"][-4:]]
    return "\n".join(lines)


def _parse_sizes(text: str) -> list[int]:
    """options.parse_sizes, whole float32 elements; '' = none."""
    return [s - s % 4 for s in options.parse_sizes(text)] if text.strip() else []


def _run_and_print(args: argparse.Namespace, hosts: Any, k: int) -> dict[str, Any]:
    run = run_once(args, hosts)
    print(f"# run {k + 1}/{args.repeat}")
    print(format_run(run, args), flush=True)
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gbps", type=float, default=1.0, help="emulated link rate (1)")
    ap.add_argument("--workers", type=int, default=4, help="W (4)")
    ap.add_argument("--reducers", type=int, default=4, help="R (4; one of them is killed)")
    ap.add_argument("--size", type=rs_config.parse_size, default=64 << 20, help="bytes of float32 per round (64M)")
    ap.add_argument("--rounds", type=int, default=5, help="timed normal and following rounds (5 each)")
    ap.add_argument(
        "--ab-sizes",
        type=_parse_sizes,
        default=_parse_sizes("1M,64M"),
        help="sizes of the release A/B, failover off vs on ('1M,64M'; '' for none)",
    )
    ap.add_argument("--ab-rounds", type=int, default=6, help="timed rounds of each A/B variant per size (6)")
    ap.add_argument("--kill-at", type=float, default=0.5, help="kill this fraction of a normal round into the round")
    ap.add_argument("--victim", type=int, default=1, help="index of the reducer killed (1)")
    ap.add_argument("--repeat", type=int, default=1, help="run the whole experiment this many times (1)")
    ap.add_argument("--round-timeout", type=float, default=60.0, help="the workers' RS timeout, seconds")
    ap.add_argument("--connect-timeout", type=float, default=120.0)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a phase may go without a message")
    ap.add_argument("--prefix", default="rsfo", help="network namespace prefix")
    ap.add_argument("--json", default=None, help="write every run's numbers here")
    args = ap.parse_args(argv)
    if args.worker:
        return _worker_main()
    if args.reducers < 2 or not 0 <= args.victim < args.reducers:
        ap.error("need --reducers >= 2 and 0 <= --victim < --reducers")
    if args.size < 4 or args.rounds < 1 or args.ab_rounds < 1 or args.kill_at < 0:
        ap.error("need --size >= 4, --rounds >= 1, --ab-rounds >= 1, --kill-at >= 0")
    reason = emulate.unavailable_reason()
    if reason:
        print(f"SKIPPED: bench_failover needs emulated hosts (root + ip netns): {reason}", file=sys.stderr)
        return 2
    W, R = args.workers, args.reducers
    print(
        f"# reducer failover: {args.gbps:g} Gbit/s emulated hosts, W={W} R={R}, {args.size} B float32 sum, "
        f"reducer {args.victim} SIGKILLed {args.kill_at:g} x a normal round into the failover round; "
        f"rounds={args.rounds}; {options.machine_description()}"
    )
    print(
        f"# link bound = S x max(1, W/R) / ({report.TCP_PAYLOAD_FRACTION} x {args.gbps:g} Gbit/s): R={R} "
        f"{1e3 * report.rs_bound_seconds(args.size, W, R, args.gbps):.1f} ms, R={R - 1} "
        f"{1e3 * report.rs_bound_seconds(args.size, W, R - 1, args.gbps):.1f} ms"
    )
    with emulate.EmulatedHosts(W + R, args.gbps, prefix=args.prefix) as emu:
        runs = [_run_and_print(args, procs.NamespaceHosts(emu), k) for k in range(args.repeat)]
    if len(runs) > 1:
        fo = statistics.median(r["failover_ratio"] for r in runs)
        fl = statistics.median(r["following_ratio"] for r in runs)
        print(
            f"# median of {len(runs)} runs: failover round {fo:.2f}x normal "
            f"({'PASS' if fo <= FAILOVER_LIMIT else 'FAIL'} vs {FAILOVER_LIMIT}x), following rounds {fl:.3f}x the "
            f"R={R - 1} bound ({'PASS' if fl <= 1 + FOLLOWING_LIMIT else 'FAIL'} vs {1 + FOLLOWING_LIMIT:.2f}x), "
            f"following / fresh session {statistics.median(r['following_over_fresh'] for r in runs):.3f}, "
            f"fresh session {statistics.median(r['fresh_s'] / r['bound_R1_s'] for r in runs):.3f}x the bound"
        )
        for i, size in enumerate(args.ab_sizes):
            print(
                f"# median release A/B on/off at {size} B: {statistics.median(r['ab'][i]['ratio'] for r in runs):.3f}"
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(runs, f, indent=1)
    bad = sum(r["wrong"] + r["differ"] + sum(a["wrong"] + a["differ"] for a in r["ab"]) for r in runs)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
