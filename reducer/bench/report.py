"""nccl-tests-style tables, the speed-up summary and the JSON rows of a benchmark run.

Conventions (nccl-tests `all_reduce_perf`): GB = 1e9 bytes; algbw = size / time;
busbw = algbw x 2(n-1)/n for every algorithm (n = workers), so the columns compare;
time is the slowest rank's median over the timed iterations.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Sequence
from io import StringIO
from typing import Any

from ..wording import plural  # noqa: F401 (also re-exported: callers read report.plural)

MIN_BOUND_SIZE = 1 << 20  # below this the tbf burst (256 KiB) lets a message pass faster than the rate
TCP_PAYLOAD_FRACTION = 0.956  # tbf counts Ethernet+IP+TCP headers: 1448 / 1514 of the rate is payload

ALGO_TITLES = {
    "rs": "rs: reduction server (this project; {workers} -> {reducers} -> {workers})",
    "rs+cp": "rs+cp: reduction server with the control plane on (gRPC control port and /metrics on every reducer, "
    "polled; see the A/B table)",
    "rs+bf16": "rs+bf16: reduction server, gradients sent as bfloat16 (reducer.torch.bf16_compress_hook)",
    "ring": "ring: ring all-reduce (this project's C++ ring over the same transport and kernels)",
    "gloo": "gloo: torch.distributed gloo backend (ring all-reduce)",
    "gloo-bf16": "gloo-bf16: gloo all-reducing a bfloat16 copy of the buffer (torch's bf16 hook: cast, all-reduce, "
    "copy back; the casts are timed)",
}
ALGO_ORDER = ("rs", "ring", "gloo", "gloo-bf16")


def wire_fraction(row: dict[str, Any]) -> float:
    """Bytes on the wire per byte of the buffer: 1/2 when float32 travels as a 16-bit type."""
    wire = row.get("wire_dtype")
    return 0.5 if wire in ("bfloat16", "float16") and row.get("dtype") == "float32" else 1.0


def uses_reducers(algo: str) -> bool:
    """rs and its variants (rs+bf16) run through reducer processes."""
    return algo == "rs" or algo.startswith("rs+")


def bus_factor(n: int) -> float:
    """2(n-1)/n: the bytes a ring moves per worker, per byte of the buffer."""
    return 2.0 * (n - 1) / n if n > 1 else 1.0


def rs_factor(workers: int, reducers: int) -> float:
    """Per byte of the buffer, the time factor of the reduction server: 1 while the reducers'
    total bandwidth covers the workers' (R >= W with equal NICs), W/R once they are the bottleneck."""
    return max(1.0, workers / reducers)


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of xs, linear between closest ranks (numpy's default)."""
    v = sorted(xs)
    if not v:
        raise ValueError("percentile of no values")
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def iteration_times(samples_by_rank: Sequence[Sequence[float]]) -> list[float]:
    """Per timed iteration, the slowest rank's time: iterations are barrier-separated, so
    sample i of every rank belongs to the same all-reduce."""
    n = min((len(s) for s in samples_by_rank), default=0)
    return [max(s[i] for s in samples_by_rank) for i in range(n)]


def iteration_stats(samples_by_rank: Sequence[Sequence[float]]) -> dict[str, float]:
    """min / p10 / median / p90 / max of the per-iteration times (slowest rank per iteration), and
    spread = (p90 - p10) / median."""
    it = iteration_times(samples_by_rank)
    if not it:
        return {}
    med = statistics.median(it)
    st = {"min": min(it), "p10": percentile(it, 10), "median": med, "p90": percentile(it, 90), "max": max(it)}
    st["spread"] = (st["p90"] - st["p10"]) / med if med > 0 else 0.0
    return st


def link_seconds(nbytes: float, gbps: float) -> float:
    """Seconds one emulated link needs for `nbytes` of payload at tbf's TCP payload rate."""
    return nbytes / (TCP_PAYLOAD_FRACTION * gbps * 1e9 / 8)


def rs_bound_seconds(size: int, workers: int, reducers: int, gbps: float, wire: float = 1.0) -> float:
    """The rs link bound: one worker link carries S x max(1, W/R) bytes (x `wire`, 1/2 for 16-bit data)."""
    return link_seconds(size * wire * rs_factor(workers, reducers), gbps)


def _timing(size: int, workers: int, samples_by_rank: Sequence[Sequence[float]]) -> dict[str, Any]:
    medians = [statistics.median(s) for s in samples_by_rank]
    time_us = max(medians)
    algbw = size / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
    return {
        "time_us": time_us,
        "algbw": algbw,
        "busbw": algbw * bus_factor(workers),
        "rank_median_us": medians,
        "samples_us": [list(s) for s in samples_by_rank],
        "iter_us": iteration_stats(samples_by_rank),
    }


def make_row(
    algo: str,
    size: int,
    count: int,
    dtype: str,
    op: str,
    workers: int,
    reducers: int,
    samples_by_rank: Sequence[Sequence[float]],
    wrong: int,
    **extra: Any,
) -> dict[str, Any]:
    row = {
        "algo": algo,
        "size": size,
        "count": count,
        "dtype": dtype,
        "op": op,
        "workers": workers,
        "reducers": reducers if uses_reducers(algo) else 0,
        "wrong": wrong,
    }
    row.update(_timing(size, workers, samples_by_rank))
    row.update(extra)
    return row


def merge_passes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (algo, size) from rows of several passes over the same sizes: each rank's samples
    of all passes together (time = slowest rank's median of them), #wrong and wall time summed, cpu%
    averaged; pass_time_us keeps each pass's own time, in run order."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["algo"], r["size"]), []).append(r)
    out = []
    for parts in groups.values():
        row = dict(parts[0])
        row["pass_time_us"] = [p["time_us"] for p in parts]
        if len(parts) > 1:
            samples = [sum((list(p["samples_us"][k]) for p in parts), []) for k in range(len(row["samples_us"]))]
            row.update(_timing(row["size"], row["workers"], samples))
            row["wrong"] = sum(p["wrong"] for p in parts)
            row["wall_s"] = sum(p.get("wall_s") or 0.0 for p in parts)
            cpus = [p["cpu_percent"] for p in parts if p.get("cpu_percent") is not None]
            row["cpu_percent"] = sum(cpus) / len(cpus) if cpus else None
        out.append(row)
    return out


def bound_fraction(row: dict[str, Any], emulate_gbps: float, reducers: int) -> float:
    """Link-rate bound / measured time for a row of an emulated run (1.0 = at the link rate).
    Bound = bytes per link / (TCP payload rate): rs S x max(1, W/R), ring and gloo S x 2(n-1)/n,
    S halved for 16-bit wire data."""
    w = row["workers"]
    per_link = rs_factor(w, reducers) if uses_reducers(row["algo"]) else bus_factor(w)
    return link_seconds(row["size"] * wire_fraction(row) * per_link, emulate_gbps) / (row["time_us"] * 1e-6)


# The project's targets: rs at least as fast as the ring from 64 KiB to 256 MiB, and at >= 95% of the
# link bound from 4 MiB to 256 MiB (emulated links).
TARGET_VS_RING = (64 << 10, 256 << 20)
TARGET_BOUND = (4 << 20, 256 << 20, 0.95)


def fmt_time(us: float | None) -> str:
    if us is None:
        return "-"
    return f"{us:.1f}" if us < 1e5 else f"{us:.0f}"


def _fmt_cpu(p: float | None) -> str:
    return "-" if p is None else f"{p:.0f}"


def format_algo_table(
    algo: str,
    rows: list[dict[str, Any]],
    workers: int,
    reducers: int,
    error: str | None = None,
    compression: str | None = None,
) -> str:
    title = ALGO_TITLES.get(algo, algo).format(workers=plural(workers, "worker"), reducers=plural(reducers, "reducer"))
    if compression:
        title += f"; compression {compression}: the buffer travels as 16-bit values (half the bytes)"
    out = [
        f"# {title}",
        f"# in-place all-reduce; time = slowest rank's median; GB = 1e9 B; busbw = algbw x 2(n-1)/n, n = {workers}",
        "# cpu% = whole machine busy during the timed iterations ('-': too short to sample)",
        "#",
        f"# {'size(B)':>12} {'count':>12} {'type':>9} {'redop':>6} {'time(us)':>11} "
        f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>7} {'cpu%':>5}",
    ]
    for r in rows:
        out.append(
            f"  {r['size']:>12} {r['count']:>12} {r['dtype']:>9} {r['op']:>6} {fmt_time(r['time_us']):>11} "
            f"{r['algbw']:>12.3f} {r['busbw']:>12.3f} {r['wrong']:>7} {_fmt_cpu(r.get('cpu_percent')):>5}"
        )
    if error:
        out.append(f"# FAILED: {error}")
    if rows:
        avg = sum(r["busbw"] for r in rows) / len(rows)
        wrong = sum(r["wrong"] for r in rows)
        out.append(f"# Out of bounds values : {wrong} {'FAILED' if any(r['wrong'] for r in rows) else 'OK'}")
        out.append(f"# Avg bus bandwidth    : {avg:.3f} GB/s")
    return "\n".join(out)


def format_summary(rows: list[dict[str, Any]], workers: int, reducers: int, emulate_gbps: float | None = None) -> str:
    """The speed-up of rs per size. With emulated links, against the link theory (and %bound,
    targets); on loopback, where no link but the CPU limits the run, with the CPU use instead."""
    by = {(r["algo"], r["size"]): r for r in rows}
    sizes = sorted({r["size"] for r in rows})
    algos = [a for a in ALGO_ORDER if any(r["algo"] == a for r in rows)]
    frac = {a: next(wire_fraction(r) for r in rows if r["algo"] == a) for a in algos}
    # theory: rs vs an algorithm moving the buffer's full bytes; with compressed rs, twice the ring's factor
    theory = bus_factor(workers) / frac.get("rs", 1.0)
    rsf = rs_factor(workers, reducers)
    tw = {a: max(11, len(a) + 4) for a in algos}  # column widths: time, speed-up, %bound
    sw = {a: max(8, len(a) + 3) for a in algos}
    bw = {a: max(11, len(a) + 6) for a in algos}
    cols = [f"{'size(B)':>12}"] + [f"{a + '(us)':>{tw[a]}}" for a in algos]
    if "rs" in algos:
        cols += [f"{'rs/' + a:>{sw[a]}}" for a in algos if a != "rs"]
    cpu_of = "rs" if "rs" in algos else (algos[0] if algos else "")
    if emulate_gbps:
        cols.append(f"{'theory':>7}")
        if rsf > 1:
            cols.append(f"{'theory@R':>8}")
        cols += [f"{a + '%bound':>{bw[a]}}" for a in algos]
    else:
        cols.append(f"{'cpu%':>5}")
    # the targets are stated for emulated links (on loopback the CPU, not a link, is the limit)
    check_ring = "rs" in algos and "ring" in algos and bool(emulate_gbps)
    check_bound = "rs" in algos and bool(emulate_gbps)
    if check_ring or check_bound:
        cols.append("  target")
    lines = [
        f"# Summary: speed-up of rs = (other's time) / (rs time); n = {plural(workers, 'worker')}, "
        f"{plural(reducers, 'reducer')}"
    ]
    if emulate_gbps:
        lines += _theory_notes(workers, theory, rsf, frac.get("rs", 1.0), emulate_gbps)
    else:
        lines += _loopback_notes(workers, reducers, frac.get("rs", 1.0), cpu_of)
    lines.append("# " + " ".join(cols))
    for s in sizes:
        cells = [f"{s:>12}"]
        times = {a: (by[(a, s)]["time_us"] if (a, s) in by else None) for a in algos}
        cells += [f"{fmt_time(times[a]):>{tw[a]}}" for a in algos]
        if "rs" in algos:
            for a in algos:
                if a == "rs":
                    continue
                if times["rs"] and times[a]:
                    cells.append(f"{times[a] / times['rs']:>{sw[a] - 1}.2f}x")
                else:
                    cells.append(f"{'-':>{sw[a]}}")
        if emulate_gbps:
            cells.append(f"{theory:>6.2f}x")
            if rsf > 1:
                cells.append(f"{theory / rsf:>7.2f}x")
            for a in algos:
                if times[a] and s >= MIN_BOUND_SIZE:
                    cells.append(f"{100 * bound_fraction(by[(a, s)], emulate_gbps, reducers):>{bw[a] - 1}.1f}%")
                else:
                    cells.append(f"{'-':>{bw[a]}}")
        else:
            cells.append(f"{_fmt_cpu(by.get((cpu_of, s), {}).get('cpu_percent')):>5}")
        if check_ring or check_bound:
            cells.append("  " + _target_cell(by, s, check_ring, check_bound, emulate_gbps, reducers))
        lines.append("  " + " ".join(cells))
    if check_ring or check_bound:
        lines.append(
            "# target: 'met', or what fails: 'rs<ring' (64 KiB-256 MiB: rs at least as fast "
            "as the ring), '<95%' (4 MiB-256 MiB: rs at >= 95% of its link bound); '-' outside both ranges"
        )
        lines += verdicts(rows, reducers, emulate_gbps if check_bound else None, check_ring)
    return "\n".join(lines)


def _theory_notes(workers: int, theory: float, rsf: float, rs_wire: float, emulate_gbps: float) -> list[str]:
    """What the emulated links predict: the theory, theory@R and %bound columns."""
    lines = [
        f"# theory = 2(n-1)/n = {bus_factor(workers):.3f} (ring bytes per worker / rs bytes per worker, "
        "reducers not the limit)"
    ]
    if rs_wire < 1:
        lines[-1] = (
            f"# theory = 2 x 2(n-1)/n = {theory:.3f}: rs sends the float32 buffer as 16-bit values (half the "
            f"bytes) vs an algorithm sending float32; vs gloo-bf16 (also 16-bit) it is 2(n-1)/n = "
            f"{bus_factor(workers):.3f}"
        )
    if rsf > 1:
        lines.append(
            f"# theory@R = theory / (W/R) = {theory / rsf:.3f}: with R < W the reducers' links carry W/R x "
            "the bytes of a worker's link and become the bottleneck"
        )
    lines.append(
        f"# %bound = link-rate bound / time, bound = bytes per link / ({TCP_PAYLOAD_FRACTION} x "
        f"{emulate_gbps:g} Gbit/s): rs S x max(1, W/R), ring and gloo S x 2(n-1)/n, S halved for "
        "16-bit wire data; shown from 1 MiB"
    )
    return lines


def _loopback_notes(workers: int, reducers: int, rs_wire: float, cpu_of: str) -> list[str]:
    """What limits a loopback run (docs/performance.md, "Loopback, no emulation (CPU-bound)")."""
    cores = os.cpu_count() or 1
    copies = bus_factor(workers) / 2 / rs_wire
    return [
        f"# limit: loopback, so no network link limits this run: the CPU does. Every byte sent is a kernel copy "
        f"made by the {plural(cores, 'core')} that {plural(workers, 'worker')} and {plural(reducers, 'reducer')} "
        "share, so the link theory (2(n-1)/n, measured with --emulate-gbps) does not apply here",
        f"# if copies were all that counted, rs/ring would be {copies:.2f}x (rs copies 2 x W x S bytes"
        + (" as 16-bit values" if rs_wire < 1 else "")
        + ", the ring 2(n-1)/n x W x S); on a cluster each host has "
        "its own NIC and cores",
        f"# cpu% = the machine busy during {cpu_of}'s timed iterations ('-': too short to sample; at those sizes "
        "per-message latency, not bandwidth, sets the time)",
    ]


def _target_cell(
    by: dict[Any, dict[str, Any]],
    size: int,
    check_ring: bool,
    check_bound: bool,
    emulate_gbps: float | None,
    reducers: int,
) -> str:
    rs = by.get(("rs", size))
    if rs is None:
        return "-"
    fails, checked = [], False
    ring = by.get(("ring", size))
    if check_ring and ring is not None and TARGET_VS_RING[0] <= size <= TARGET_VS_RING[1]:
        checked = True
        if rs["time_us"] > ring["time_us"]:
            fails.append("rs<ring")
    if check_bound and emulate_gbps and TARGET_BOUND[0] <= size <= TARGET_BOUND[1]:
        checked = True
        if bound_fraction(rs, emulate_gbps, reducers) < TARGET_BOUND[2]:
            fails.append("<95%")
    return ",".join(fails) if fails else ("met" if checked else "-")


def _size_name(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def verdicts(
    rows: list[dict[str, Any]], reducers: int, emulate_gbps: float | None, check_ring: bool = True
) -> list[str]:
    """The target verdicts over one run's rows (one congestion control): one line each,
    'met' / 'NOT met' with the failing sizes, and which sizes of the range were not measured."""
    by = {(r["algo"], r["size"]): r for r in rows}
    out = []

    def sizes_in(lo: int, hi: int) -> list[int]:
        return sorted(s for (a, s) in by if a == "rs" and lo <= s <= hi)

    if check_ring:
        lo, hi = TARGET_VS_RING
        sizes = [s for s in sizes_in(lo, hi) if ("ring", s) in by]
        bad = [
            f"{_size_name(s)} {by[('ring', s)]['time_us'] / by[('rs', s)]['time_us']:.2f}x"
            for s in sizes
            if by[("rs", s)]["time_us"] > by[("ring", s)]["time_us"]
        ]
        out.append(
            _verdict_line(f"rs >= ring at every size {_size_name(lo)}-{_size_name(hi)}", sizes, bad, lo, hi, "rs/ring")
        )
    if emulate_gbps:
        lo, hi, need = TARGET_BOUND
        sizes = sizes_in(lo, hi)
        bad = [
            f"{_size_name(s)} {100 * bound_fraction(by[('rs', s)], emulate_gbps, reducers):.1f}%"
            for s in sizes
            if bound_fraction(by[("rs", s)], emulate_gbps, reducers) < need
        ]
        out.append(
            _verdict_line(
                f"rs >= {100 * need:.0f}% of the link bound {_size_name(lo)}-{_size_name(hi)}",
                sizes,
                bad,
                lo,
                hi,
                "rs %bound",
            )
        )
    return out


def _verdict_line(what: str, sizes: list[int], bad: list[str], lo: int, hi: int, unit: str) -> str:
    if not sizes:
        return f"# verdict: {what}: not measured (no size in the range)"
    missing = []
    s = lo
    while s <= hi:  # the powers of two of the range that were not run
        if s not in sizes:
            missing.append(_size_name(s))
        s *= 2
    tail = f"; not measured: {', '.join(missing)}" if missing else ""
    if bad:
        return f"# verdict: {what}: NOT met at {len(bad)} of {len(sizes)} sizes ({unit}: {', '.join(bad)}){tail}"
    return f"# verdict: {what}: met at all {len(sizes)} sizes measured{tail}"


def format_variance(rows: list[dict[str, Any]]) -> str:
    """Per size and algorithm, the per-iteration times (slowest rank per iteration): median and
    p10-p90, spread = (p90 - p10) / median, and min-max."""
    algos = [a for a in ALGO_ORDER if any(r["algo"] == a for r in rows)]
    by = {(r["algo"], r["size"]): r for r in rows}
    sizes = sorted({r["size"] for r in rows})
    w = 38
    lines = [
        "# Per-iteration times (ms), slowest rank per iteration: median [p10-p90] spread (p90-p10)/median, min-max",
        "# " + f"{'size(B)':>12} " + " ".join(f"{a:<{w}}" for a in algos),
    ]
    for s in sizes:
        cells = []
        for a in algos:
            st = (by.get((a, s)) or {}).get("iter_us")
            if not st:
                cells.append(f"{'-':<{w}}")
                continue
            ms = {k: v / 1e3 for k, v in st.items() if k != "spread"}
            cells.append(
                f"{_fmt_ms(ms['median'])} [{_fmt_ms(ms['p10'])}-{_fmt_ms(ms['p90'])}] "
                f"{100 * st['spread']:.0f}% {_fmt_ms(ms['min'])}-{_fmt_ms(ms['max'])}".ljust(w)
            )
        lines.append(f"  {s:>12} " + " ".join(cells))
    return "\n".join(lines)


def format_windows(rows: list[dict[str, Any]]) -> str:
    """The chunks in flight rs's widest link allowed at each size (any worker, as of its last round):
    pipeline_for's window, widened where a path needs more (Communicator.stats() link_window_max)."""
    cells = [f"{r['algo']} {_size_name(r['size'])}: {r['link_window_max']}" for r in rows if r.get("link_window_max")]
    if not cells:
        return ""
    return "# windows (chunks in flight on the widest link, widened where the path needs more): " + ", ".join(cells)


def _fmt_ms(ms: float) -> str:
    return f"{ms:.2f}" if ms < 10 else (f"{ms:.1f}" if ms < 1000 else f"{ms:.0f}")


def format_step_table(rows: list[dict[str, Any]], title: str, width: int = 130) -> str:
    """Training steps (rows of reducer.bench.steps, finished) as a rich table, plus what rs hides."""
    from rich.console import Console  # noqa: PLC0415 (rich (60 ms): not at the CLI's start)
    from rich.table import Table  # noqa: PLC0415 (rich (60 ms): not at the CLI's start)

    t = Table(title=title, title_justify="left", show_lines=False)
    for name, justify in (
        ("algo", "left"),
        ("bucket cap", "right"),
        ("buckets", "right"),
        ("compute ms", "right"),
        ("step ms", "right"),
        ("exposed ms", "right"),
        ("steps/s", "right"),
        ("vs gloo", "right"),
        ("exposed/total", "right"),
        ("#wrong", "right"),
        ("cpu%", "right"),
    ):
        t.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for r in rows:
        t.add_row(
            r["algo"],
            f"{r['bucket_cap_mb']:g} MiB",
            str(r["buckets"]),
            f"{r['compute_ms']:.1f}" + (" (gloo)" if r.get("compute_from") == "gloo" else ""),
            f"{r['step_us'] / 1e3:.1f}",
            f"{r['exposed_us'] / 1e3:.1f}",
            f"{r['steps_per_s']:.2f}" if r.get("steps_per_s") else "-",
            f"{r['speedup_vs_gloo']:.2f}x" if r.get("speedup_vs_gloo") else "-",
            f"{r['exposed_fraction']:.2f}" if r.get("exposed_fraction") is not None else "-",
            str(r["wrong"]),
            _fmt_cpu(r.get("cpu_percent")),
        )
    buf = StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(t)
    lines = [buf.getvalue().rstrip()]
    lines.append(
        "# step = slowest rank's median step time (backward start to the last bucket averaged); exposed = "
        "step - compute; vs gloo = gloo's step / this step (same buckets and compute); exposed/total = "
        "exposed / this algorithm's step with no compute; compute '(gloo)' = gloo's communication time"
    )
    for r in rows:
        if r.get("exposed_fraction") is not None:
            lines.append(
                f"# {r['algo']}, {r['label']}: {r['exposed_us'] / 1e3:.1f} ms of its "
                f"{r['comm_us'] / 1e3:.1f} ms of communication stay exposed (exposed/total "
                f"{r['exposed_fraction']:.2f}): it hides {100 * r['hidden_fraction']:.0f}%"
            )
    return "\n".join(lines)


def write_json(path: str, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(list(rows), f, indent=1)
        f.write("\n")
