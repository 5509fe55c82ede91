"""`reduction-server status [HOST:PORT ...]`: every reducer of a job and its groups, live or as JSON.

The addresses are control-plane addresses (`serve --control-port`, default data port + 1).
Without addresses the reducers come from the cluster description (CLUSTER_SPEC, TF_CONFIG or
RS_REDUCERS, reducer.cluster.discover) and their control port is RS_CONTROL_PORT, else each
reducer's data port + 1. Exit status: 0 when every reducer answered, 1 otherwise, 2 on bad usage.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Sequence

from reducer.errors import ConfigError

DEFAULT_INTERVAL = 2.0
DEFAULT_TIMEOUT = 5.0


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subparsers.add_parser(
        "status",
        help="show the reducers of a job and their groups (live table, or --json once)",
        description="Asks every reducer's control plane (GetStats) and shows a live table of the "
                    "reducers and their groups, refreshed every --interval seconds until Ctrl-C; "
                    "--json prints one snapshot. Without addresses the reducers come from "
                    "CLUSTER_SPEC / TF_CONFIG / RS_REDUCERS, their control port being "
                    "RS_CONTROL_PORT, else the data port + 1.",
    )
    p.add_argument("addresses", nargs="*", metavar="HOST:PORT", help="control-plane addresses of reducers")
    p.add_argument("--json", action="store_true", help="print one snapshot as JSON and exit")
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL,
                   help="seconds between refreshes of the live table (default %(default)s)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="seconds to wait for each reducer's answer (default %(default)s)")
    p.add_argument("--auth-token-file", default=None,
                   help="file holding the shared secret, which reducers that have one want proven for GetStats "
                        "(default: $RS_AUTH_TOKEN, $RS_AUTH_TOKEN_FILE)")
    p.set_defaults(func=run)


def control_addresses(addresses: Sequence[str], env: Optional[Mapping[str, str]] = None) -> List[str]:
    """The addresses given, else the reducers of the cluster description at their control ports."""
    from reducer import cluster, config

    if addresses:
        for a in addresses:
            cluster.parse_address(a)   # ConfigError names the bad one
        return list(addresses)
    env = os.environ if env is None else env
    info = cluster.discover(env)
    raw = env.get(config.SETTINGS["control_port"].env, "")
    try:
        port = config.SETTINGS["control_port"].parse(raw)
    except ValueError as exc:
        raise ConfigError(f"{config.SETTINGS['control_port'].env}={raw!r} is not valid: {exc}") from None
    if port == config.OFF or port == 0:
        raise ConfigError(f"{config.SETTINGS['control_port'].env}={raw!r} does not name the reducers' control "
                          "port: pass their control addresses instead")
    out = []
    for addr in info.reducers:
        host, data_port = cluster.parse_address(addr)
        out.append(cluster.format_address(host, port if port is not None else data_port + 1))
    return out


def snapshot(addresses: Sequence[str], timeout: float, token: Optional[str] = None) -> List[Dict[str, Any]]:
    """GetStats of every reducer, in order: its answer, or {"address", "error"}."""
    from reducer.control.client import ControlClient, ControlError

    def one(address: str) -> Dict[str, Any]:
        try:
            with ControlClient(address, timeout=timeout, token=token) as client:
                return dict(client.get_stats(), address=address)
        except ControlError as exc:
            return {"address": address, "error": str(exc)}

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(addresses)))) as ex:
        return list(ex.map(one, addresses))


def _mb(n: Any) -> str:
    return f"{int(n) / 1e6:,.1f}"


def render(reducers: Sequence[Mapping[str, Any]]) -> Any:
    from rich.console import Group
    from rich.table import Table

    top = Table(title="reducers", title_justify="left")
    for name in ("control", "data", "state", "groups", "workers", "rounds", "MB in", "MB out", "errors",
                 "rejected", "memory MB", "uptime s"):
        top.add_column(name, justify="left" if name in ("control", "data", "state") else "right")
    groups = Table(title="groups", title_justify="left")
    for name in ("reducer", "job", "group", "ranks", "rounds", "MB in", "MB out", "age s", "last error"):
        groups.add_column(name, justify="left" if name in ("reducer", "job", "group", "last error") else "right")
    for r in reducers:
        if "error" in r:
            top.add_row(r["address"], "", "[red]no answer[/red]", *[""] * 8, r["error"][:60])
            continue
        c = r["counters"]
        state = r["state"] if r["state"] == "serving" else f"[yellow]{r['state']}[/yellow]"
        top.add_row(r["address"], r["data_address"], state, str(c.get("groups", "")),
                    str(c.get("connected_workers", "")), str(c.get("rounds_completed", "")),
                    _mb(c.get("bytes_received", 0)), _mb(c.get("bytes_sent", 0)), str(c.get("errors", "")),
                    str(c.get("rejected", "")), _mb(c.get("memory_bytes", 0)), f"{r['uptime_s']:.0f}")
        for g in r["groups"]:
            ranks = f"{g['connected']}/{g['world_size']}"
            groups.add_row(r["address"], g["job"], g["group"], ranks if g["complete"] else f"[yellow]{ranks}[/yellow]",
                           str(g["rounds"]), _mb(g["bytes_received"]), _mb(g["bytes_sent"]), f"{g['age_s']:.0f}",
                           f"[red]{g['last_error']}[/red]" if g["last_error"] else "")
    return Group(top, groups)


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0 or args.timeout <= 0:
        print("reduction-server status: error: --interval and --timeout must be > 0", file=sys.stderr)
        return 2
    from reducer import config

    try:
        addresses = control_addresses(args.addresses)
        token = config.resolve_auth_token(token_file=args.auth_token_file)
    except ConfigError as exc:
        print(f"reduction-server status: error: {exc} (or pass the reducers' control addresses HOST:PORT)",
              file=sys.stderr)
        return 2
    if args.json:
        reducers = snapshot(addresses, args.timeout, token)
        json.dump({"reducers": reducers}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0 if all("error" not in r for r in reducers) else 1

    from rich.live import Live

    reducers = snapshot(addresses, args.timeout, token)
    try:
        with Live(render(reducers), auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                reducers = snapshot(addresses, args.timeout, token)
                live.update(render(reducers), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0 if all("error" not in r for r in reducers) else 1
