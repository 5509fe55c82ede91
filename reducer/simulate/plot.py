"""Speed-up of rs over the ring against the number of workers (matplotlib, imported lazily)."""

from __future__ import annotations

from typing import Any


def plot_speedup(rows: list[dict[str, Any]], path: str, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'reduction-server[plot]'") from None
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        series.setdefault(f"{r['worker']} / {r['reducer']}", []).append((r["workers"], r["speedup"]))
    for label, pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ws = sorted({r["workers"] for r in rows})
    ax.plot(ws, [2 * (w - 1) / w for w in ws], "k--", label="link-bound theory 2(W-1)/W")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers W")
    ax.set_ylabel("speed-up: ring time / rs time")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
