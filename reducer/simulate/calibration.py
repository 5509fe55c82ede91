"""The emulated runs the simulator is calibrated on, and its predictions of them.

Every measured time is from docs/performance.md or issue 31 (``reduction-server bench
--emulate-gbps B``: each host in its own network namespace with a tbf-shaped link, 20 ms queues);
times given there as "% of the bound" or "x the ring" are converted with the same bound
(payload = 0.956 x the line rate). ``python -m reducer.simulate.calibration`` prints the table of
docs/performance.md ("Simulated jobs").
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .model import Network
from .rows import simulate

MIB = 1 << 20
TOLERANCE = 0.15


@dataclass(frozen=True)
class Measured:
    workers: int
    gbps: float
    nbytes: int
    rs_ms: float
    ring_ms: float
    source: str
    reducers: int = 0  # 0: R = W


def _rs_bound_ms(nbytes: int, gbps: float) -> float:
    return nbytes / (gbps * 1e9 / 8 * 0.956) * 1e3


def _from_pct(workers: int, gbps: float, nbytes: int, pct: float, ratio: float, source: str) -> Measured:
    rs = _rs_bound_ms(nbytes, gbps) / (pct / 100)
    return Measured(workers, gbps, nbytes, rs, rs * ratio, source)


W4 = "docs/performance.md, W=4 R=4 1 Gbit/s sweep 2026-11-25 15:22 (M3)"
W8 = "docs/performance.md, W=R=8 0.5 Gbit/s 2026-11-25 21:31 (M3): % of the bound and rs/ring"
# Run for this table, not fitted on (2026-11-28 07:07 UTC, AMD EPYC with AVX-512, loaded: load average 12 from other
# work): `reduction-server bench --workers W --reducers R --sizes ... --algos rs,ring
# --emulate-gbps 0.2 --iters 3 --warmup 1 --iters-bytes 0 --warmup-bytes 0`
HERE = "this table's own runs, 2026-11-28, load average 12"
NOW = "docs/performance.md, 'Many workers', 2026-11-28 10:48-10:53 UTC, quiet"
FIXED = "docs/performance.md, 'Many workers', 2026-11-28 13:05-13:10 UTC, quiet"
FEWER = "docs/performance.md, 'Fewer frames for the same bytes', 2026-11-29 06:00-06:35 UTC, quiet"
CASES: list[Measured] = [
    Measured(4, 1.0, 4 * MIB, 36.3, 51.3, W4),
    Measured(4, 1.0, 16 * MIB, 146.0, 210.0, W4),
    Measured(4, 1.0, 64 * MIB, 571.0, 847.0, W4),
    Measured(4, 1.0, 256 * MIB, 2285.0, 3377.0, W4),
    _from_pct(8, 0.5, 4 * MIB, 83.7, 1.44, W8),
    _from_pct(8, 0.5, 16 * MIB, 93.4, 1.64, W8),
    _from_pct(8, 0.5, 64 * MIB, 96.2, 1.70, W8),
    Measured(4, 0.2, 4 * MIB, 172.7, 260.3, HERE),
    Measured(4, 0.2, 16 * MIB, 717.4, 1056.0, HERE),
    Measured(8, 0.2, 16 * MIB, 1437.7, 1230.7, HERE, reducers=4),
    # With the window from the shard and the 8 KiB fan-in floor (protocol/plan.h; the rows above ran
    # the code before it: a window of 4 everywhere, 4 KiB chunks at W = 32), quiet machine (load
    # average 1.3-2.6 before each run), same commands (W=32: --iters 2):
    Measured(4, 1.0, 4 * MIB, 36.6, 51.5, NOW),
    Measured(4, 1.0, 16 * MIB, 142.4, 210.3, NOW),
    Measured(4, 1.0, 64 * MIB, 565.1, 843.6, NOW),
    # W = R = 16 and 32 with the path window sized from the results' rate (client/schedule.cc
    # sample_rate), mean of two runs each. The W = 16 and 32 rows measured before it are gone: their
    # windows grew to 6-14 chunks from TCP delivery-rate samples that read bursts as the link's rate,
    # the workers' own queues dropped, and a round lost 0.1-0.3 s (docs/performance.md, "The path
    # window and bursts"): a defect of the code then, not the network the simulator models.
    Measured(16, 0.05, 4 * MIB, 701.6, 1303.8, FIXED + " (--emulate-gbps 0.05)"),
    Measured(16, 0.05, 16 * MIB, 2895.5, 5230.5, FIXED + " (--emulate-gbps 0.05)"),
    Measured(32, 0.025, 16 * MIB, 5822.0, 10821.7, FIXED + " (--emulate-gbps 0.025, --iters 2)"),
    # A window's bytes in as few chunks as fit (protocol/plan.h pipeline_for; W = 4 and 8: 2 chunks
    # of twice the size where the rows above had 4; W = 16 16 MiB: 16 KiB x 2 for 8 KiB x 4; W = 32
    # unchanged), and the epoll waits; quiet, one run each, the commands above with W = 8 at 0.5 and
    # W = 4 at 1 Gbit/s (AMD EPYC with AVX2 only).
    Measured(8, 0.5, 4 * MIB, 70.5, 120.4, FEWER),
    Measured(8, 0.5, 16 * MIB, 283.7, 489.2, FEWER),
    Measured(8, 0.5, 64 * MIB, 1128.6, 1970.7, FEWER),
    Measured(4, 1.0, 4 * MIB, 34.6, 51.0, FEWER),
    Measured(4, 1.0, 16 * MIB, 143.1, 210.1, FEWER),
    Measured(4, 1.0, 64 * MIB, 564.8, 842.9, FEWER),
    Measured(4, 1.0, 256 * MIB, 2262.2, 3373.7, FEWER),
    Measured(16, 0.05, 4 * MIB, 699.4, 1303.7, FEWER),
    Measured(16, 0.05, 16 * MIB, 2881.3, 5229.2, FEWER),
    Measured(32, 0.025, 16 * MIB, 5806.7, 10818.9, FEWER + " (--iters 2)"),
]
# W=32 R=32 0.025 Gbit/s 16 MiB (issue 31): only "rs >= 1.75x the ring" in a quiet run.
W32_MIN_SPEEDUP = 1.75


def predict(case: Measured) -> tuple[float, float]:
    """(rs, ring) simulated, ms, with the emulation's network (20 ms queues)."""
    rows = simulate(case.workers, case.reducers or case.workers, [case.nbytes], Network(case.gbps))
    return rows[0]["seconds"] * 1e3, rows[1]["seconds"] * 1e3


def w32_speedup() -> float:
    rows = simulate(32, 32, [16 * MIB], Network(0.025))
    return float(rows[0]["speedup"])


def table() -> str:
    out = [
        "| W | R | Gbit/s | size | rs measured | rs simulated | error | ring measured | ring simulated | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in CASES:
        rs, ring = predict(c)
        e_rs, e_ring = (rs - c.rs_ms) / c.rs_ms, (ring - c.ring_ms) / c.ring_ms
        out.append(
            f"| {c.workers} | {c.reducers or c.workers} | {c.gbps:g} | {c.nbytes // MIB} MiB | "
            f"{c.rs_ms:.1f} ms | {rs:.1f} ms | {e_rs:+.1%} | {c.ring_ms:.1f} ms | {ring:.1f} ms | {e_ring:+.1%} |"
        )
    out.append(
        f"\nW=R=32, 0.025 Gbit/s, 16 MiB: simulated rs/ring {w32_speedup():.2f}x (measured: >= {W32_MIN_SPEEDUP}x)"
    )
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
