"""`reduction-server status [HOST:PORT ...]`: every reducer of a job and its groups, live or once, or as JSON.

The addresses are control-plane addresses (`serve --control-port`, default data port + 1).
Without addresses the reducers come from the cluster description (CLUSTER_SPEC, TF_CONFIG or
RS_REDUCERS, reducer.cluster.discover) and their control port is RS_CONTROL_PORT, else each
reducer's data port + 1. Exit status: 0 when every reducer answered, 1 otherwise, 2 on bad usage.
A data address that is only the reducer's own view, reached here through another address (a port
mapping, NAT), is marked with a note (own_view_note).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reducer import cluster, config
from reducer.addresses import control_port_for
from reducer.errors import ConfigError

DEFAULT_INTERVAL = 2.0
DEFAULT_TIMEOUT = 5.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "status",
        help="show the reducers of a job and their groups (live in a terminal, else one snapshot)",
        description="Asks every reducer's control plane (GetStats) and shows the reducers, their "
        "live groups and the groups that ended. In a terminal the tables refresh every "
        "--interval seconds until Ctrl-C; with --once, or when the output is not a "
        "terminal (piped, redirected), one snapshot is printed and the command exits; "
        "--json prints one snapshot as JSON. Without addresses the reducers come from "
        "CLUSTER_SPEC / TF_CONFIG / RS_REDUCERS, their control port being "
        "RS_CONTROL_PORT, else the data port + 1.",
    )
    p.add_argument("addresses", nargs="*", metavar="HOST:PORT", help="control-plane addresses of reducers")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit (the default when not a terminal)")
    p.add_argument("--json", action="store_true", help="print one snapshot as JSON and exit")
    p.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL,
        help="seconds between refreshes of the live table (default %(default)s)",
    )
    p.add_argument(
        "--auth-token-file",
        default=None,
        help="file holding the shared secret, which reducers that have one want proven for GetStats "
        "(default: $RS_AUTH_TOKEN, $RS_AUTH_TOKEN_FILE)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds to wait for each reducer's answer (default %(default)s)",
    )
    p.set_defaults(func=run)


def control_addresses(addresses: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """The addresses given, else the reducers of the cluster description at their control ports."""
    if addresses:
        for a in addresses:
            cluster.parse_address(a)  # ConfigError names the bad one
        return list(addresses)
    env = os.environ if env is None else env
    if not cluster.has_cluster(env):
        raise ConfigError(
            "no reducers to ask: pass their control addresses (HOST:PORT ...), or run where CLUSTER_SPEC, "
            "TF_CONFIG or RS_REDUCERS names them"
        )
    info = cluster.discover(env)
    raw = env.get(config.SETTINGS["control_port"].env, "")
    try:
        port = config.SETTINGS["control_port"].parse(raw)
    except ValueError as exc:
        raise ConfigError(f"{config.SETTINGS['control_port'].env}={raw!r} is not valid: {exc}") from None
    if port == config.OFF or port == 0:
        raise ConfigError(
            f"{config.SETTINGS['control_port'].env}={raw!r} does not name the reducers' control "
            "port: pass their control addresses instead"
        )
    out = []
    for addr in info.reducers:
        host, data_port = cluster.parse_address(addr)
        control = port if port is not None else control_port_for(data_port)
        if control is None:
            raise ConfigError(
                f"reducer {addr!r} has data port {data_port}, so no default control port "
                "(data port + 1): pass its control address instead"
            )
        out.append(cluster.format_address(host, control))
    return out


def snapshot(addresses: Sequence[str], timeout: float, token: str | None = None) -> list[dict[str, Any]]:
    """GetStats of every reducer, in order: its answer, or {"address", "error"}."""
    from reducer.control.client import ControlClient, ControlError

    def one(address: str) -> dict[str, Any]:
        try:
            with ControlClient(address, timeout=timeout, token=token) as client:
                return dict(client.get_stats(), address=address)
        except ControlError as exc:
            return {"address": address, "error": str(exc)}

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(addresses)))) as ex:
        return list(ex.map(one, addresses))


_LOOPBACK_NAMES = {"localhost": "127.0.0.1", "ip6-localhost": "::1"}


def _endpoint(address: str) -> tuple[str, int] | None:
    try:
        host, port = cluster.parse_address(address)
    except ConfigError:
        return None
    host = host.lower()
    return _LOOPBACK_NAMES.get(host, host), port


def own_view_note(reducer: Mapping[str, Any]) -> str | None:
    """Why a reducer's data address may not be one to use from here, else None: it reported its own
    view of itself (no --advertise-address, no cluster entry: data_address_from "listen") and its
    control port was reached here through another address than the one it sees (a port mapping,
    NAT, another name)."""
    own = str(reducer.get("control_address") or "")
    if reducer.get("data_address_from") != "listen" or not own:
        return None  # the operator's or the cluster's word, or a reducer that does not say
    if _endpoint(own) is not None and _endpoint(own) == _endpoint(str(reducer["address"])):
        return None
    return (
        f"{reducer['address']}: data {reducer['data_address']} as the reducer sees itself (its control "
        f"port: {own}), reached here through {reducer['address']}; behind a port mapping or NAT, "
        "serve --advertise-address HOST:PORT (RS_ADVERTISE_ADDRESS) reports the address to use"
    )


def _mb(n: Any) -> str:
    return f"{int(n) / 1e6:,.1f}"


def _age(seconds: Any) -> str:
    """kubectl-style: 45s, 12m, 3h, 2d."""
    s = int(float(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def group_ended(group: Mapping[str, Any], live_groups: int | None) -> bool:
    """Whether a group row of GetStats is a group that has ended (no round can run in it any more).

    The reducer lists the last groups that ended next to its live ones. A row that says so
    (``ended``) is taken at its word; otherwise a group has ended when it is not complete and has
    failed or run rounds (a forming group has run none), or when the reducer has no live group at
    all (its ``groups`` counter: then every row listed has ended)."""
    if "ended" in group:
        return bool(group["ended"])
    if live_groups == 0:
        return True
    return not group["complete"] and (bool(group["last_error"]) or int(group["rounds"]) > 0)


def no_answer_reason(error: str) -> str:
    """The gist of a failed GetStats ("ADDR: GetStats failed: CODE: details"): CODE and the last
    clause of the details (gRPC's "failed to connect to all addresses; last error: ...: Connection
    refused" becomes "UNAVAILABLE: Connection refused")."""
    parts = error.split(": ", 3)
    if len(parts) < 3 or "failed" not in parts[1]:
        return error
    code, detail = parts[2], parts[3] if len(parts) > 3 else ""
    last = detail.rsplit(": ", 1)[-1].strip()
    return f"{code}: {last}" if last else code


def _table(title: str, columns: Sequence[str], left: int) -> Any:
    """A borderless table whose headers never shrink (values fold instead); the first `left`
    columns are text (left-aligned), the others numbers."""
    from rich.table import Table  # noqa: PLC0415 (rich (60 ms): not at the CLI's start)

    table = Table(title=title, title_justify="left", title_style="bold", box=None, pad_edge=False, header_style="bold")
    for i, name in enumerate(columns):
        table.add_column(
            name, justify="left" if i < left else "right", min_width=len(name), overflow="fold", no_wrap=i >= left
        )
    return table


def render(reducers: Sequence[Mapping[str, Any]]) -> Any:
    """The snapshot as tables that read at 80 columns: reducers, their traffic, live groups,
    ended groups (when any), and why a reducer gave no answer."""
    from rich.console import Group  # noqa: PLC0415 (rich (60 ms): not at the CLI's start)
    from rich.text import Text  # noqa: PLC0415 (rich (60 ms): not at the CLI's start)

    top = _table("reducers", ("control", "data", "state", "up", "groups", "workers"), 3)
    traffic = _table("traffic", ("control", "rounds", "MB in", "MB out", "errors", "rejected", "memory MB"), 1)
    live = _table("live groups", ("reducer", "job/group", "ranks", "rounds", "MB in", "MB out", "age"), 2)
    ended = _table(
        "ended groups (the last few each reducer keeps)",
        ("reducer", "job/group", "world", "rounds", "MB in", "MB out", "ended"),
        2,
    )
    ended.columns[-1].justify = "left"
    notes: list[Any] = []
    for r in reducers:
        if "error" in r:
            top.add_row(r["address"], "-", "[red]no answer[/red]", "-", "-", "-")
            notes.append(Text(f"no answer from {r['address']}: {no_answer_reason(r['error'])}", style="red"))
            continue
        c = r["counters"]
        state = r["state"] if r["state"] == "serving" else f"[yellow]{r['state']}[/yellow]"
        note = own_view_note(r)
        if note:
            notes.append(Text(f"* {note}", style="yellow"))
        top.add_row(
            r["address"],
            Text(r["data_address"] + ("*" if note else ""), style="yellow" if note else ""),
            state,
            _age(r["uptime_s"]),
            str(c.get("groups", "")),
            str(c.get("connected_workers", "")),
        )
        traffic.add_row(
            r["address"],
            str(c.get("rounds_completed", "")),
            _mb(c.get("bytes_received", 0)),
            _mb(c.get("bytes_sent", 0)),
            str(c.get("errors", "")),
            str(c.get("rejected", "")),
            _mb(c.get("memory_bytes", 0)),
        )
        for g in r["groups"]:
            name = f"{g['job']}/{g['group']}"
            traffic_cells = (str(g["rounds"]), _mb(g["bytes_received"]), _mb(g["bytes_sent"]))
            if g["last_error"]:
                notes.append(Text(f"{name} on {r['address']}: {g['last_error']}", style="red"))
            if group_ended(g, c.get("groups")):
                how = "[red]failed[/red]" if g["last_error"] else "left"
                ended.add_row(r["address"], name, str(g["world_size"]), *traffic_cells, how)
                continue
            ranks = f"{g['connected']}/{g['world_size']}"
            live.add_row(
                r["address"],
                name,
                ranks if g["complete"] else f"[yellow]{ranks}[/yellow]",
                *traffic_cells,
                _age(g["age_s"]),
            )
    parts: list[Any] = [top, Text(""), traffic, Text(""), live]
    if not live.row_count:
        parts.append(Text("(none)", style="dim"))
    if ended.row_count:
        parts += [Text(""), ended]
    if notes:
        parts += [Text("")] + notes
    return Group(*parts)


def run(args: argparse.Namespace) -> int:
    try:
        config.check_seconds(args.interval, "--interval")
        config.check_seconds(args.timeout, "--timeout")  # (gRPC fails at once past about 9e9 s)
    except ConfigError as exc:
        print(f"reduction-server status: error: {exc}", file=sys.stderr)
        return 2

    try:
        addresses = control_addresses(args.addresses)
        token = config.resolve_auth_token(token_file=args.auth_token_file)
    except ConfigError as exc:
        print(f"reduction-server status: error: {exc}", file=sys.stderr)
        return 2
    reducers = snapshot(addresses, args.timeout, token)
    status = 0 if all("error" not in r for r in reducers) else 1
    if args.json:
        json.dump({"reducers": reducers}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return status
    from rich.console import Console  # noqa: PLC0415 (rich (60 ms): not at the CLI's start)

    console = Console()
    if args.once or not console.is_terminal:  # piped or redirected: one snapshot, like `kubectl get`
        console.print(render(reducers))
        return status
    return _live(console, addresses, args, reducers, token)


def _live(
    console: Any, addresses: Sequence[str], args: argparse.Namespace, reducers: list[dict[str, Any]], token: str | None
) -> int:
    """The table refreshed every --interval seconds until Ctrl-C (a terminal only)."""
    from rich.live import Live  # noqa: PLC0415 (rich (60 ms): not at the CLI's start)

    try:
        with Live(render(reducers), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                reducers = snapshot(addresses, args.timeout, token)
                live.update(render(reducers), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0 if all("error" not in r for r in reducers) else 1
