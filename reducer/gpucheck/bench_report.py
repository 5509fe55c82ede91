"""The GPU check's benchmark (``--bench``): iteration plan, bandwidths, rows, table and verdict.

Pure functions of the workers' result files and NCCL logs (no processes, no torch), so they are
unit tested on synthetic rows; reducer.gpucheck.bench runs the phases.

Bandwidths as nccl-tests computes them for all-reduce (doc/PERFORMANCE.md there):
algbw = bytes / time, busbw = algbw x 2(n-1)/n, n the number of ranks; in GB/s (1e9 B/s).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from .nccl_log import NcclLog

MiB = 1024 * 1024
DEFAULT_SIZES = [MiB * 4**k for k in range(6)]  # 1 MiB, 4 MiB, ..., 1 GiB
TARGET_FROM = 64 * MiB  # the target: CollNet busbw >= Socket busbw at every size from here
FIRST_CALL_SIZE = 256 * MiB  # the size whose first call took 0.27-0.49 s in the GPU check
MIN_ITERS = 3
VARIANTS = ("collnet", "socket", "plugin-p2p")
TRANSPORT_SLACK = 0.9  # the plugin's p2p net below 0.9 x Socket's busbw: its transport is a limit


def iteration_plan(size: int, warmup: int, iters: int, iters_bytes: int) -> tuple[int, int]:
    """(warm-up calls, timed calls) for one size: about `iters_bytes` of timed calls (at least
    MIN_ITERS, at most `iters`) and a quarter of that in warm-up (at least 1, at most `warmup`)."""
    size = max(1, size)
    timed = min(iters, max(MIN_ITERS, -(-iters_bytes // size)))
    warm = min(warmup, max(1, -(-iters_bytes // (4 * size))))
    return max(0, warm), max(1, timed)


def bus_factor(world: int) -> float:
    """nccl-tests' all-reduce bus factor 2(n-1)/n (1 for two ranks)."""
    return 2.0 * (world - 1) / world if world > 0 else 0.0


def bandwidths(nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * bus_factor(world)


def _algo_for(log: NcclLog | None, nbytes: int) -> str:
    """The tuner's most frequent choice for all-reduces of `nbytes` (rank 0's log), '' if none."""
    if log is None:
        return ""
    got = Counter(t.algo for t in log.allreduce_choices() if t.nbytes == nbytes)
    return got.most_common(1)[0][0] if got else ""


def variant_rows(
    variant: str, results: Sequence[Mapping[str, Any]], log: NcclLog | None, world: int = 2
) -> list[dict[str, Any]]:
    """One row per size from the ranks' ``bench`` lists: the slowest rank's median (steady state)
    and first call; sizes no rank finished are left out, skipped sizes say why."""
    by_size: dict[int, list[Mapping[str, Any]]] = {}
    for res in results:
        for entry in res.get("bench") or []:
            by_size.setdefault(int(entry["bytes"]), []).append(entry)
    network = log.networks[0] if log is not None and log.networks else ""
    rows = []
    for nbytes in sorted(by_size):
        entries = by_size[nbytes]
        skipped = [e["skipped"] for e in entries if e.get("skipped")]
        if skipped:
            rows.append({"variant": variant, "bytes": nbytes, "skipped": skipped[0]})
            continue
        seconds = max(statistics.median(e["times"]) for e in entries)
        first = max(float(e["first_seconds"]) for e in entries)
        algbw, busbw = bandwidths(nbytes, seconds, world)
        rows.append(
            {
                "variant": variant,
                "bytes": nbytes,
                "seconds": seconds,
                "algbw": round(algbw, 4),
                "busbw": round(busbw, 4),
                "first_seconds": first,
                "first_busbw": round(bandwidths(nbytes, first, world)[1], 4),
                "loop_seconds": max(float(e.get("loop_seconds", 0.0)) for e in entries),
                "iters": min(len(e["times"]) for e in entries),
                "warmup": min(int(e.get("warmup", 0)) for e in entries),
                "ranks": len(entries),
                "wrong": sum(int(e.get("wrong", 0)) for e in entries),
                "algo": _algo_for(log, nbytes),
                "network": network,
            }
        )
    return rows


def _measured(rows: Sequence[Mapping[str, Any]], variant: str) -> dict[int, Mapping[str, Any]]:
    return {int(r["bytes"]): r for r in rows if r["variant"] == variant and "seconds" in r}


def size_text(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Every row, then busbw side by side per size with CollNet / Socket."""
    lines = [
        f"# {'variant':<11} {'size':>8} {'first(s)':>9} {'median(s)':>10} {'algbw':>7} {'busbw':>7} "
        f"{'first/med':>9} {'iters':>5} {'algo':<14} network   (GB/s)"
    ]
    for r in rows:
        if "seconds" not in r:
            lines.append(f"  {r['variant']:<11} {size_text(r['bytes']):>8} skipped: {r.get('skipped', '')}")
            continue
        ratio = r["first_seconds"] / r["seconds"] if r["seconds"] > 0 else 0.0
        lines.append(
            f"  {r['variant']:<11} {size_text(r['bytes']):>8} {r['first_seconds']:>9.4f} {r['seconds']:>10.5f} "
            f"{r['algbw']:>7.2f} {r['busbw']:>7.2f} {ratio:>8.1f}x {r['iters']:>5} {r['algo'] or '-':<14} "
            f"{r['network'] or '-'}" + (f"  WRONG: {r['wrong']}" if r["wrong"] else "")
        )
    by = {v: _measured(rows, v) for v in VARIANTS}
    sizes = sorted(set().union(*(set(m) for m in by.values())))
    lines.append(f"# {'size':>8} " + " ".join(f"{v:>11}" for v in VARIANTS) + "  collnet/socket  (busbw GB/s)")
    for s in sizes:
        cells = " ".join(f"{by[v][s]['busbw']:>11.2f}" if s in by[v] else f"{'-':>11}" for v in VARIANTS)
        c, k = by["collnet"].get(s), by["socket"].get(s)
        ratio = f"{c['busbw'] / k['busbw']:>13.2f}x" if c and k and k["busbw"] > 0 else f"{'-':>14}"
        lines.append(f"  {size_text(s):>8} {cells} {ratio}")
    return "\n".join(lines)


def first_call_note(rows: Sequence[Mapping[str, Any]], size: int = FIRST_CALL_SIZE) -> str:
    """The issue's question: is the steady state far faster than the first call at 256 MiB?"""
    parts = []
    for v in VARIANTS:
        r = _measured(rows, v).get(size)
        if r and r["seconds"] > 0:
            parts.append(
                f"{v} first {r['first_seconds']:.3f} s, median {r['seconds']:.4f} s "
                f"({r['first_seconds'] / r['seconds']:.1f}x)"
            )
    if not parts:
        return f"first call vs steady state: {size_text(size)} not measured"
    return f"first call vs steady state at {size_text(size)}: " + "; ".join(parts)


def call_bytes(reducer_stats: Sequence[Mapping[str, Any]], world: int = 2) -> float | None:
    """The plugin's average CollNet call size from the reducers' counters: each call is one round
    on every reducer, which receives the call's shard (call / R) from each of the `world` heads."""
    shards = [
        int(s["bytes_received"]) / int(s["rounds_completed"]) / world
        for s in reducer_stats
        if int(s.get("rounds_completed", 0)) > 0 and "bytes_received" in s
    ]
    return len(reducer_stats) * sum(shards) / len(shards) if shards else None


def limits(
    rows: Sequence[Mapping[str, Any]],
    probes: Mapping[str, Any],
    reducers: int,
    world: int = 2,
    reducer_stats: Sequence[Mapping[str, Any]] = (),
) -> list[str]:
    """What limits the CollNet variant, most likely first, each with its numbers (a heuristic:
    the tuner's choice, the plugin's own transport vs Socket, then the measured CPU rates by how
    close CollNet came to them), at the largest size >= TARGET_FROM measured for CollNet."""
    coll = _measured(rows, "collnet")
    sizes = [s for s in coll if s >= TARGET_FROM] or list(coll)
    if not sizes:
        return []
    s = max(sizes)
    r, out = coll[s], []
    if r["algo"] and not r["algo"].startswith("COLLNET"):
        out.append(f"NCCL's tuner put the collnet variant's {size_text(s)} all-reduce on {r['algo']}, not CollNet")
    p2p, sock = _measured(rows, "plugin-p2p").get(s), _measured(rows, "socket").get(s)
    if p2p and sock and sock["busbw"] > 0 and p2p["busbw"] < TRANSPORT_SLACK * sock["busbw"]:
        out.append(
            f"the plugin's own transport: its p2p net (no reducers) gets {p2p['busbw']:.2f} GB/s busbw at "
            f"{size_text(s)}, {p2p['busbw'] / sock['busbw']:.2f}x NCCL Socket's {sock['busbw']:.2f} "
            "(its staging copies and TCP streams)"
        )
    rate = s / r["seconds"]  # bytes per second each head sends (and receives)
    ranked = []
    sum_Bps = probes.get("sum_Bps")
    if sum_Bps:
        need = (world - 1) * s / max(1, reducers) / r["seconds"]
        ranked.append(
            (
                need / sum_Bps,
                f"the reducers' CPU sum rate: each of {reducers} reducer(s) adds {need / 1e9:.2f} GB/s of input, "
                f"{100 * need / sum_Bps:.0f}% of one core's float32 sum kernel ({sum_Bps / 1e9:.2f} GB/s)",
            )
        )
    loop_Bps = probes.get("loopback_Bps")
    if loop_Bps:
        ranked.append(
            (
                rate / loop_Bps,
                f"loopback TCP: each head sends and receives {rate / 1e9:.2f} GB/s, {100 * rate / loop_Bps:.0f}% "
                f"of one loopback TCP stream ({loop_Bps / 1e9:.2f} GB/s); CollNet moves {2 * world} x S through the "
                f"kernel per all-reduce on one machine (each head S up and S down), NCCL's ring 2 x S",
            )
        )
    out += [text for _, text in sorted(ranked, key=lambda x: -x[0])]
    per_call = call_bytes(reducer_stats, world)
    calls = f"about {per_call / 1024:.0f} KiB each by the reducers' counters" if per_call else "NCCL's chunks"
    out.append(
        "not measured separately: the plugin's staging copies and the per-call overhead of NCCL's proxy and "
        f"of a reducer round (one round per CollNet call, calls of {calls})"
    )
    return out


def target(rows: Sequence[Mapping[str, Any]], limit_texts: Sequence[str]) -> dict[str, Any]:
    """The verdict on 'plugin CollNet busbw >= NCCL Socket's from 64 MiB': met True / False, or
    None when it could not be judged; `line` is the one line to print."""
    wrong = [f"{r['variant']} {size_text(r['bytes'])}" for r in rows if r.get("wrong")]
    coll, sock = _measured(rows, "collnet"), _measured(rows, "socket")
    both = sorted(s for s in coll if s >= TARGET_FROM and s in sock)
    ratios = {s: coll[s]["busbw"] / sock[s]["busbw"] if sock[s]["busbw"] > 0 else 0.0 for s in both}
    text = ", ".join(f"{size_text(s)} {ratios[s]:.2f}x" for s in both)
    if wrong:
        return {"met": None, "ratios": ratios, "line": f"GPU BENCH FAIL: wrong sums in {', '.join(wrong)}"}
    if not both:
        return {
            "met": None,
            "ratios": ratios,
            "line": f"GPU BENCH INCOMPLETE: no size >= {size_text(TARGET_FROM)} measured for both collnet and socket",
        }
    missed = [s for s in both if ratios[s] < 1.0]
    if not missed:
        line = (
            f"GPU BENCH TARGET MET: plugin CollNet busbw >= NCCL Socket's at every size >= "
            f"{size_text(TARGET_FROM)} (collnet/socket: {text})"
        )
        return {"met": True, "ratios": ratios, "line": line}
    why = limit_texts[0] if limit_texts else "unknown"
    line = (
        f"GPU BENCH TARGET MISSED: plugin CollNet busbw < NCCL Socket's at "
        f"{', '.join(size_text(s) for s in missed)} (collnet/socket: {text}); limited by: {why}"
    )
    return {"met": False, "ratios": ratios, "line": line}
