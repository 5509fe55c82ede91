"""The GPU check's judgements: one function per claim, each a `Check`, then the verdict line
and the JSON summary. Pure functions of the phases' results (no processes, no torch), so they
are unit tested on recorded data."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .nccl_log import NcclLog, summarize_tuning

PLUGIN_NAME = "reduction-server"
DDP_RTOL = 1e-6  # relative; world 2 sums a+b in either order, so equal runs are bitwise equal


@dataclass
class Check:
    name: str
    ok: bool | None  # None = skipped (not counted against the verdict)
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


def check_collnet(logs: Sequence[NcclLog], plugin: str = PLUGIN_NAME) -> Check:
    """NCCL loaded the plugin's net and CollNet, every rank used it as its network, CollNet
    connected, and the tuner put at least one all-reduce on CollNet (rank 0's TUNING lines)."""
    problems = []
    if not logs or not any(lg.lines for lg in logs):
        return Check("collnet", False, "no NCCL log lines (NCCL_DEBUG=INFO output missing)")
    for r, lg in enumerate(logs):
        if not (lg.net_plugin or "").startswith(plugin):
            problems.append(f"rank {r}: net plugin {plugin!r} not loaded ({lg.net_plugin or 'no plugin line'})")
        if not (lg.collnet_plugin or "").startswith(plugin):
            problems.append(f"rank {r}: collnet plugin not loaded ({lg.collnet_plugin or 'no collnet plugin line'})")
        if lg.networks and any(n != plugin for n in lg.networks):
            problems.append(f"rank {r}: 'Using network {lg.networks[0]}', not {plugin}")
        elif not lg.networks:
            problems.append(f"rank {r}: no 'Using network' line")
        for line in lg.collnet_disabled:
            problems.append(f"rank {r}: {line}")
    connected = any(lg.collnet_connected or lg.collnet_channels for lg in logs)
    if not connected:
        problems.append("no CollNet connection in the logs ('Connected CollNet' / 'via COLLNET/')")
    choices = logs[0].allreduce_choices()
    on_collnet = [c for c in choices if c.collnet]
    if not choices:
        problems.append("rank 0 logged no tuner choice for AllReduce (NCCL_DEBUG_SUBSYS needs TUNING)")
    elif not on_collnet:
        algos = sorted({c.algo for c in choices})
        problems.append(f"NCCL's tuner chose {', '.join(algos)} for every AllReduce, never CollNet")
    data = {
        "net_plugin": logs[0].net_plugin,
        "collnet_plugin": logs[0].collnet_plugin,
        "networks": [lg.networks for lg in logs],
        "collnet_connected": connected,
        "allreduce_on_collnet": len(on_collnet),
        "allreduce_total": len(choices),
        "collnet_bytes": logs[0].collnet_bytes(),
        "tuning": summarize_tuning(choices),
    }
    if problems:
        return Check("collnet", False, "; ".join(problems), data)
    return Check(
        "collnet",
        True,
        f"{len(on_collnet)} of {len(choices)} AllReduce on "
        f"{'/'.join(sorted({c.algo for c in on_collnet}))} via {logs[0].networks[0]}",
        data,
    )


def check_reducer_bytes(stats: Sequence[Mapping[str, Any]], collnet_bytes: int, heads: int = 2) -> Check:
    """The reducers received at least what the CollNet all-reduces carried: every head sends its
    whole buffer to the reducers, so sum(bytes_received) >= heads x the CollNet bytes."""
    received = [int(s.get("bytes_received", -1)) for s in stats]
    data = {
        "bytes_received": received,
        "bytes_sent": [int(s.get("bytes_sent", -1)) for s in stats],
        "rounds_completed": [int(s.get("rounds_completed", -1)) for s in stats],
        "collnet_bytes": collnet_bytes,
        "expected_at_least": heads * collnet_bytes,
    }
    if not stats or any(r < 0 for r in received):
        return Check("reducer_bytes", False, f"reducer stats missing ({len(stats)} reducer(s) reported)", data)
    total = sum(received)
    if collnet_bytes <= 0:
        return Check("reducer_bytes", False, f"no CollNet all-reduce to account for (reducers got {total} B)", data)
    if total < heads * collnet_bytes:
        return Check(
            "reducer_bytes",
            False,
            f"reducers received {total} B, less than {heads} heads x {collnet_bytes} B on CollNet",
            data,
        )
    idle = [i for i, r in enumerate(received) if r == 0]
    note = f" (reducer(s) {idle} received nothing)" if idle else ""
    return Check(
        "reducer_bytes",
        True,
        f"reducers received {total} B >= {heads} x {collnet_bytes} B on CollNet; per reducer {received}{note}",
        data,
    )


def check_sums(results: Sequence[Mapping[str, Any]], sizes: Sequence[int], dtypes: Sequence[str]) -> Check:
    """Every rank checked every (dtype, size) and found no element off the CPU reference."""
    problems = []
    rows_total = 0
    seconds: dict[str, float] = {}
    for res in results:
        rank = res.get("rank", "?")
        rows = {(r["dtype"], r["bytes"]): r for r in res.get("sums", [])}
        rows_total += len(rows)
        if rank == 0:
            seconds = {f"{dt}:{size}": row.get("seconds") for (dt, size), row in rows.items()}
        for dt in dtypes:
            for size in sizes:
                itemsize = 4 if dt == "float32" else 2
                row = rows.get((dt, max(1, size // itemsize) * itemsize))
                if row is None:
                    problems.append(f"rank {rank}: {dt} {size} B not run")
                elif row["mismatches"]:
                    problems.append(
                        f"rank {rank}: {dt} {size} B: {row['mismatches']} wrong (first {row.get('first_bad')})"
                    )
    if not results:
        problems.append("no worker results")
    data = {"rows": rows_total, "sizes": list(sizes), "dtypes": list(dtypes), "rank0_seconds": seconds}
    if problems:
        return Check("sums", False, "; ".join(problems[:6]) + (" ..." if len(problems) > 6 else ""), data)
    return Check("sums", True, f"{len(dtypes)} dtypes x {len(sizes)} sizes exact on {len(results)} ranks", data)


def check_ddp(
    with_plugin: Sequence[Mapping[str, Any]], without: Sequence[Mapping[str, Any]], rtol: float = DDP_RTOL
) -> Check:
    """Same seeds and data, the gradients summed by CollNet or by NCCL's own ring: the losses of
    every rank at every step agree to rtol (in practice bitwise: a+b for two ranks is one IEEE
    addition whatever the algorithm, and DDP divides by 2 exactly)."""

    def losses(results: Sequence[Mapping[str, Any]]) -> dict[int, list[float]]:
        return {int(r["rank"]): list(r.get("ddp", {}).get("losses", [])) for r in results}

    a, b = losses(with_plugin), losses(without)
    data: dict[str, Any] = {"with_plugin": a, "without_plugin": b}
    if not a or not b or sorted(a) != sorted(b) or any(not v for v in a.values()):
        return Check("ddp", False, "DDP losses missing from one of the runs", data)
    worst = 0.0
    bitwise = True
    for rank in a:
        if len(a[rank]) != len(b[rank]):
            return Check("ddp", False, f"rank {rank}: {len(a[rank])} vs {len(b[rank])} steps", data)
        for x, y in zip(a[rank], b[rank]):
            bitwise &= x == y
            worst = max(worst, abs(x - y) / max(abs(y), 1e-30))
    data.update(max_rel_diff=worst, bitwise_equal=bitwise)
    steps = len(next(iter(a.values())))
    if worst > rtol:
        return Check("ddp", False, f"losses differ: max relative difference {worst:.3g} > {rtol:g}", data)
    how = "bitwise equal" if bitwise else f"max relative difference {worst:.3g} <= {rtol:g}"
    return Check("ddp", True, f"{steps} steps x {len(a)} ranks, losses with and without the plugin {how}", data)


def check_teardown(
    name: str, status: int | None, results: Sequence[Mapping[str, Any]], world: int = 2, why: str = ""
) -> Check:
    """The phase's processes exited 0 and each got past destroy_process_group()."""
    states = {int(r.get("rank", -1)): r.get("teardown") for r in results}
    data = {"status": status, "teardown": states}
    if status is None:
        return Check(name, False, f"did not run: {why}" if why else "did not run", data)
    bad = [f"rank {r}: teardown {s}" for r, s in sorted(states.items()) if s != "ok"]
    if len(states) < world:
        bad.append(f"{world - len(states)} rank(s) wrote no result")
    if status != 0:
        bad.insert(0, f"exit status {status}" + (f" ({why})" if why else ""))
    if bad:
        return Check(name, False, "; ".join(bad), data)
    return Check(name, True, f"{world} ranks destroyed their communicators and exited 0", data)


def check_plain_network(log: NcclLog, plugin: str = PLUGIN_NAME) -> Check:
    """The baseline run really ran without the plugin (else the DDP comparison proves nothing)."""
    data = {"networks": log.networks, "net_plugin": log.net_plugin}
    if not log.networks:
        return Check("baseline_without_plugin", False, "no 'Using network' line in the baseline run", data)
    if plugin in log.networks or (log.net_plugin or "").startswith(plugin):
        return Check("baseline_without_plugin", False, "the baseline run loaded the plugin", data)
    return Check("baseline_without_plugin", True, f"baseline used NCCL's {log.networks[0]} net", data)


def summarize(
    checks: Sequence[Check], environment: Mapping[str, Any], phases: Mapping[str, Any], warnings: Sequence[str] = ()
) -> dict[str, Any]:
    failed = [c for c in checks if c.ok is False]
    return {
        "verdict": "FAIL" if failed or not any(c.ok for c in checks) else "PASS",
        "reasons": [f"{c.name}: {c.detail}" for c in failed],
        "warnings": list(warnings),
        "checks": {c.name: asdict(c) for c in checks},
        "environment": dict(environment),
        "phases": dict(phases),
    }


def verdict_line(summary: Mapping[str, Any]) -> str:
    checks = summary.get("checks", {})
    if summary["verdict"] == "PASS":
        passed = [n for n, c in checks.items() if c["ok"]]
        skipped = [n for n, c in checks.items() if c["ok"] is None]
        text = f"GPU CHECK PASS: {', '.join(passed)}"
        if skipped:
            text += f" (skipped: {', '.join(skipped)})"
    else:
        text = "GPU CHECK FAIL: " + " | ".join(summary["reasons"] or ["no check passed"])
    if summary.get("warnings"):
        text += " [warnings: " + "; ".join(summary["warnings"]) + "]"
    return text


def to_json(summary: Mapping[str, Any]) -> str:
    return json.dumps(summary, indent=2, sort_keys=False, default=str)
