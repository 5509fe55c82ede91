"""algbw vs size, log-log, one line per algorithm, with the link-rate bounds of ring and rs."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from .report import MIN_BOUND_SIZE, TCP_PAYLOAD_FRACTION, bus_factor, rs_factor

STYLE = {"rs": ("tab:blue", "o"), "ring": ("tab:orange", "s"), "gloo": ("tab:green", "^")}


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'reduction-server[plot]' (or: pip install matplotlib)")
    return plt


def plot(rows: List[Dict[str, Any]], path: str, workers: int, reducers: int,
         emulate_gbps: Optional[float] = None, title: Optional[str] = None) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    algos = [a for a in ("rs", "ring", "gloo") if any(r["algo"] == a and r.get("time_us") for r in rows)]
    sizes = sorted({r["size"] for r in rows})
    for a in algos:
        pts = sorted((r["size"], r["algbw"]) for r in rows if r["algo"] == a and r.get("time_us"))
        color, marker = STYLE.get(a, (None, "x"))
        label = {"rs": f"rs (reduction server, R={reducers})", "ring": "ring (this project)",
                 "gloo": "gloo (torch.distributed)"}.get(a, a)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=label)
    if emulate_gbps and sizes:
        link = TCP_PAYLOAD_FRACTION * emulate_gbps / 8  # GB/s of payload per direction
        ring_bw = link / bus_factor(workers)
        rs_bw = link / rs_factor(workers, reducers)
        xs = [sizes[0], sizes[-1]]
        if "rs" in algos:
            ax.plot(xs, [rs_bw] * 2, ls="--", color=STYLE["rs"][0], alpha=0.7,
                    label=f"rs bound: {0.956:g} x B / max(1, W/R) = {rs_bw:.3f} GB/s")
        ax.plot(xs, [ring_bw] * 2, ls=":", color=STYLE["ring"][0], alpha=0.7,
                label=f"ring bound: {0.956:g} x B / (2(n-1)/n) = {ring_bw:.3f} GB/s")
        if sizes[0] < MIN_BOUND_SIZE:
            # Below 1 MiB the tbf burst (256 KiB) lets a message through faster than the rate:
            # points there may lie above the bounds, which only hold for sustained transfers.
            right = MIN_BOUND_SIZE / 2 ** 0.5 if sizes[-1] >= MIN_BOUND_SIZE else sizes[-1] * 2 ** 0.5
            ax.axvspan(sizes[0] / 2 ** 0.5, right, color="0.5", alpha=0.08, lw=0)
            ax.text(max(sizes[0], min(sizes[0] * 4, right / 8)), 0.02, "tbf burst (256 KiB):\nbounds do not apply here",
                    fontsize=7, color="0.35", va="bottom", transform=ax.get_xaxis_transform())
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
