"""algbw vs size, log-log, one line per algorithm, with the link-rate bounds of ring and rs."""

from __future__ import annotations

from typing import Any

from ..wording import install_hint
from .report import MIN_BOUND_SIZE, TCP_PAYLOAD_FRACTION, bus_factor, rs_factor

STYLE = {
    "rs": ("tab:blue", "o"),
    "rs+bf16": ("tab:purple", "D"),
    "ring": ("tab:orange", "s"),
    "gloo": ("tab:green", "^"),
}


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit(f"--plot needs matplotlib: {install_hint('plot', 'matplotlib')}") from exc
    return plt


def plot(
    rows: list[dict[str, Any]],
    path: str,
    workers: int,
    reducers: int,
    emulate_gbps: float | None = None,
    title: str | None = None,
) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    algos = [a for a in ("rs", "ring", "gloo") if any(r["algo"] == a and r.get("time_us") for r in rows)]
    sizes = sorted({r["size"] for r in rows})
    for a in algos:
        pts = sorted((r["size"], r["algbw"]) for r in rows if r["algo"] == a and r.get("time_us"))
        color, marker = STYLE.get(a, (None, "x"))
        label = {
            "rs": f"rs (reduction server, R={reducers})",
            "ring": "ring (this project)",
            "gloo": "gloo (torch.distributed)",
        }.get(a, a)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=label)
    if emulate_gbps and sizes:
        link = TCP_PAYLOAD_FRACTION * emulate_gbps / 8  # GB/s of payload per direction
        ring_bw = link / bus_factor(workers)
        rs_bw = link / rs_factor(workers, reducers)
        xs = [sizes[0], sizes[-1]]
        if "rs" in algos:
            ax.plot(
                xs,
                [rs_bw] * 2,
                ls="--",
                color=STYLE["rs"][0],
                alpha=0.7,
                label=f"rs bound: {0.956:g} x B / max(1, W/R) = {rs_bw:.3f} GB/s",
            )
        ax.plot(
            xs,
            [ring_bw] * 2,
            ls=":",
            color=STYLE["ring"][0],
            alpha=0.7,
            label=f"ring bound: {0.956:g} x B / (2(n-1)/n) = {ring_bw:.3f} GB/s",
        )
        if sizes[0] < MIN_BOUND_SIZE:
            # Below 1 MiB the tbf burst (256 KiB) lets a message through faster than the rate:
            # points there may lie above the bounds, which only hold for sustained transfers.
            right = MIN_BOUND_SIZE / 2**0.5 if sizes[-1] >= MIN_BOUND_SIZE else sizes[-1] * 2**0.5
            ax.axvspan(sizes[0] / 2**0.5, right, color="0.5", alpha=0.08, lw=0)
            ax.text(
                max(sizes[0], min(sizes[0] * 4, right / 8)),
                0.02,
                "tbf burst (256 KiB):\nbounds do not apply here",
                fontsize=7,
                color="0.35",
                va="bottom",
                transform=ax.get_xaxis_transform(),
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("buffer size (bytes)")
    ax.set_ylabel("algbw = size / time (GB/s, 1e9 B)")
    ax.set_xticks(sizes)
    ax.set_xticklabels([_human(s) for s in sizes], rotation=45, fontsize=8)
    where = f"{emulate_gbps:g} Gbit/s emulated NICs" if emulate_gbps else "loopback (one machine)"
    ax.set_title(title or f"all-reduce, W={workers} workers, {where}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _human(n: int) -> str:
    for unit, k in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k}{unit}"
    return str(n)


def plot_steps(
    rows: list[dict[str, Any]], path: str, workers: int, reducers: int, emulate_gbps: float | None = None
) -> None:
    """Training steps: one group of bars per (bucket cap, backward time), one bar per algorithm,
    split into compute (grey) and exposed communication; speed-up over gloo on top."""
    plt = _pyplot()
    cases = list(dict.fromkeys((r["bucket_cap_mb"], r["compute_ms"]) for r in rows))
    algos = list(dict.fromkeys(r["algo"] for r in rows))
    by = {(r["algo"], r["bucket_cap_mb"], r["compute_ms"]): r for r in rows}
    width = 0.8 / max(1, len(algos))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 + 1.4 * len(cases) * max(1, len(algos)) / 2), 4.8), dpi=110)
    for j, a in enumerate(algos):
        color = STYLE.get(a, (None, None))[0]
        xs, compute, exposed = [], [], []
        for i, (cap, ms) in enumerate(cases):
            r = by.get((a, cap, ms))
            if r is None:
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            compute.append(r["compute_ms"])
            exposed.append(r["exposed_us"] / 1e3)
        ax.bar(xs, compute, width, color="0.85", edgecolor="0.6", label="compute (backward)" if j == 0 else None)
        ax.bar(xs, exposed, width, bottom=compute, color=color, label=f"{a}: exposed communication")
        for x, (cap, ms) in zip(xs, [c for c in cases if (a, *c) in by]):
            r = by[(a, cap, ms)]
            if r.get("speedup_vs_gloo") and a != "gloo":
                ax.text(x, r["step_us"] / 1e3, f"{r['speedup_vs_gloo']:.2f}x", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([f"cap {cap:g} MiB\ncompute {ms:.1f} ms" for cap, ms in cases], fontsize=8)
    ax.set_ylabel("step time (ms): slowest rank's median")
    model = rows[0].get("model", "?")
    where = f"{emulate_gbps:g} Gbit/s emulated NICs" if emulate_gbps else "loopback (one machine)"
    ax.set_title(
        f"{model}: one DDP step's gradients, W={workers}, R={reducers}, {where}\n(label: speed-up over gloo)",
        fontsize=10,
    )
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
