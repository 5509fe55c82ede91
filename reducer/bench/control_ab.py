"""`bench --control-plane`: does the reducers' control plane cost the data path anything?

Modes:
- ``off`` (default): the reducers run the data plane only, as before;
- ``on``: every rs pass runs its reducers with the control plane (gRPC health, GetStats, Drain on
  a control port) and a Prometheus /metrics endpoint, as `reduction-server serve --metrics-port`
  does, while a poller (reducer.bench.poller) calls GetStats and fetches /metrics on every reducer
  every --poll-interval-ms;
- ``ab``: rs is measured both ways in one run: "rs" (control plane off) and "rs+cp" (on, polled),
  in alternating passes A B B A (A B B A A B B A ... with more --ab-passes), each pass over every
  size, so a slow drift of the machine's load weighs on both alike. The table gives on/off per size
  with the spread between a variant's own passes: the noise floor the ratio is to be read against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
from . import report

MODES = ("off", "on", "ab")
RS, RS_CP = "rs", "rs+cp"  # the A and B variants of `ab`


def check(mode: str, algos: Sequence[str], model: str | None, passes: int, interval_s: float) -> None:
    """ConfigError for a combination that cannot run (or needs a package that is missing)."""
    if mode not in MODES:
        raise ConfigError(f"bad --control-plane {mode!r}: choose from {', '.join(MODES)}")
    if mode == "off":
        return
    if interval_s <= 0:
        raise ConfigError("--poll-interval-ms must be > 0")
    if mode == "ab":
        if model:
            raise ConfigError("--control-plane ab compares buffer sizes: not with --model (use on)")
        if RS not in algos:
            raise ConfigError("--control-plane ab measures rs: include rs in --algos")
        if passes < 1:
            raise ConfigError("--ab-passes must be >= 1")
    try:
        from ..control import import_grpc, import_prometheus

        import_grpc()
        import_prometheus()
    except ImportError as exc:
        raise ConfigError(f"--control-plane {mode}: {exc}") from None


def base_algo(algo: str) -> str:
    """The algorithm `algo` measures: rs+cp is rs (same workers, same settings), with other reducers."""
    return RS if algo == RS_CP else algo


def with_control_plane(algo: str, mode: str) -> bool:
    """Whether the reducers of `algo`'s pass run the control plane (and a poller polls them)."""
    return algo == RS_CP or (mode == "on" and report.uses_reducers(algo))


def pass_order(algos: Sequence[str], mode: str, passes: int) -> list[str]:
    """Algorithms in run order: with `ab`, rs becomes `passes` pairs of rs / rs+cp, alternating which
    goes first (A B B A ...), where rs stood; the others run once, as they would."""
    if mode != "ab":
        return list(algos)
    out: list[str] = []
    for a in algos:
        if a == RS:
            for k in range(passes):
                out += [RS, RS_CP] if k % 2 == 0 else [RS_CP, RS]
        else:
            out.append(a)
    return out


def describe(mode: str, interval_s: float, passes: int) -> str | None:
    """The header line of the run (None when the control plane is off)."""
    what = (
        f"every reducer serves gRPC (health, GetStats, Drain) and Prometheus /metrics; a poller calls GetStats "
        f"and fetches /metrics on each every {interval_s * 1e3:g} ms"
    )
    if mode == "on":
        return f"# control plane: on: {what}"
    if mode == "ab":
        order = " ".join(("A B" if k % 2 == 0 else "B A") for k in range(passes))
        return f"# control plane: A/B: rs = off (A), rs+cp = on (B: {what}); passes {order}"
    return None


def _spread(times: Sequence[float]) -> float | None:
    return max(times) / min(times) - 1.0 if len(times) > 1 and min(times) > 0 else None


def ratios(rows: list[dict[str, Any]], min_size: int = report.MIN_BOUND_SIZE) -> dict[str, Any]:
    """on/off per size, and their geometric mean over sizes >= min_size (merged rows of rs and rs+cp)."""
    off = {r["size"]: r for r in rows if r["algo"] == RS}
    on = {r["size"]: r for r in rows if r["algo"] == RS_CP}
    per = {
        s: on[s]["time_us"] / off[s]["time_us"]
        for s in sorted(set(off) & set(on))
        if off[s]["time_us"] > 0 and on[s]["time_us"] > 0
    }
    big = [v for s, v in per.items() if s >= min_size]
    gmean = None
    if big:
        prod = 1.0
        for v in big:
            prod *= v
        gmean = prod ** (1.0 / len(big))
    return {"per_size": per, "geomean": gmean, "geomean_sizes": len(big)}


def format_polls(polls: dict[str, Any], interval_s: float, algo: str) -> str:
    """One line: what the poller of `algo`'s passes did (merged counts of reducer.bench.poller)."""
    secs = polls.get("seconds") or 0.0
    rate = (
        f", {polls['get_stats'] / secs:.0f} GetStats/s and {polls['scrapes'] / secs:.0f} scrapes/s" if secs > 0 else ""
    )
    return (
        f"# poller of {algo} (every {interval_s * 1e3:g} ms): {polls['get_stats']} GetStats and {polls['scrapes']} "
        f"/metrics scrapes ({polls['metrics_bytes'] / 1e6:.1f} MB) in {secs:.1f} s{rate}; {polls['errors']} "
        f"failed, {polls['late']} cycles late; the last GetStats saw {polls['rounds_seen']} rounds"
        + (
            f"; the poller used {100 * polls['cpu_s'] / secs:.0f}% of a core (here on the same machine; a real "
            "scraper runs elsewhere)"
            if secs > 0
            else ""
        )
        + (f"; first failure: {polls['first_error']}" if polls.get("first_error") else "")
    )


def cpu_per_request_ms(
    reducer_cpu_s: dict[str, float | None], polls: dict[str, Any] | None, passes: int
) -> float | None:
    """The reducers' CPU milliseconds per control-plane request (a GetStats or a scrape): the CPU the
    reducers used in an on pass beyond an off pass (the same all-reduces), over the requests of a pass."""
    off, on = reducer_cpu_s.get(RS), reducer_cpu_s.get(RS_CP)
    if off is None or on is None or not polls or passes < 1:
        return None
    requests = (polls["get_stats"] + polls["scrapes"]) / passes
    return 1e3 * (on - off) / requests if requests > 0 else None


def format_table(
    rows: list[dict[str, Any]],
    interval_s: float,
    cpu_by_algo: dict[str, float | None],
    reducer_cpu_s: dict[str, float | None],
    passes: int,
) -> str:
    """The A/B table from merged rows: per size rs off / on times, on/off, each variant's pass-to-pass
    spread; then the geometric mean, what the poller did, the bench's CPU per variant and the
    reducers' CPU per control-plane request."""
    off = {r["size"]: r for r in rows if r["algo"] == RS}
    on = {r["size"]: r for r in rows if r["algo"] == RS_CP}
    res = ratios(rows)
    lines = [
        "# Control plane A/B: rs with the reducers' control plane off vs on (polled); on/off = rs+cp time / rs "
        "time, each the slowest rank's median over all its passes' timed iterations",
        "# spread = a variant's slowest pass / its fastest - 1, per size: differences below it are noise",
        f"# {'size(B)':>12} {'off(us)':>11} {'on(us)':>11} {'on/off':>7} {'spread off':>11} {'spread on':>10}",
    ]
    for s in sorted(set(off) | set(on)):
        a, b = off.get(s), on.get(s)
        ratio = res["per_size"].get(s)
        sa = _spread(a.get("pass_time_us", [])) if a else None
        sb = _spread(b.get("pass_time_us", [])) if b else None
        lines.append(
            f"  {s:>12} {report.fmt_time(a['time_us'] if a else None):>11} "
            f"{report.fmt_time(b['time_us'] if b else None):>11} "
            f"{'-' if ratio is None else f'{ratio:.3f}':>7} "
            f"{'-' if sa is None else f'{100 * sa:.1f}%':>11} {'-' if sb is None else f'{100 * sb:.1f}%':>10}"
        )
    if res["geomean"] is not None:
        lines.append(
            f"# on/off, geometric mean over the {res['geomean_sizes']} sizes >= "
            f"{report.MIN_BOUND_SIZE >> 20} MiB: {res['geomean']:.3f} ({100 * (res['geomean'] - 1):+.1f}%)"
        )
    polls = next((r["polls"] for r in rows if r["algo"] == RS_CP and r.get("polls")), None)
    if polls:
        lines.append(format_polls(polls, interval_s, RS_CP))
    per_request = cpu_per_request_ms(reducer_cpu_s, polls, passes)
    if per_request is not None:
        lines.append(
            f"# the reducers' CPU per pass (all {rows[0]['reducers']}): off {reducer_cpu_s[RS]:.1f} s, on "
            f"{reducer_cpu_s[RS_CP]:.1f} s: {per_request:.2f} ms per GetStats or scrape"
        )
    if cpu_by_algo.get(RS) is not None and cpu_by_algo.get(RS_CP) is not None:
        lines.append(
            f"# CPU of the bench's processes (user + system, share of all cores): rs {cpu_by_algo[RS]:.0f}%, "
            f"rs+cp {cpu_by_algo[RS_CP]:.0f}% (the reducers' gRPC and metrics threads and the poller "
            "included)"
        )
    return "\n".join(lines)
