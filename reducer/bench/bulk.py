"""The baseline of a long path (issue 31 point 2): one bulk TCP stream's rate on the same emulated
path as the all-reduce, measured in the same run, and each rs row's rate per link against it.

With ``--emulate-delay-ms/--emulate-jitter-ms/--emulate-loss`` the bench sends one TCP stream
from host 0 (worker 0) to host W (reducer 0's) for a few seconds before the algorithms run and
prints its goodput; after the results, an rs row's rate per link (its buffer's bytes each way per
second: each worker sends S and receives S over its links) as a fraction of it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from .emulate import check_path

_PORT = 5201
_SERVER = f"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', {_PORT})); s.listen(1); s.settimeout(30)
c, _ = s.accept(); c.settimeout(30); n = 0
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
"""
_CLIENT = f"""
import socket, sys, time
dst, secs, warm = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
for _ in range(100):
    try: s = socket.create_connection((dst, {_PORT}), timeout=5); break
    except OSError: time.sleep(0.1)
buf = bytes(1 << 20); t0 = time.monotonic(); sent = 0; ts = None
while time.monotonic() - t0 < warm + secs:
    s.sendall(buf)
    if ts is None and time.monotonic() - t0 >= warm: ts, sent = time.monotonic(), 0
    else: sent += len(buf)
s.shutdown(socket.SHUT_WR); print(sent / (time.monotonic() - ts))
"""


def measure(hosts: Any, src: int, dst: int, seconds: float = 4.0, warm: float = 2.0) -> float:
    """Bytes per second of one bulk TCP stream from host `src` to host `dst` (after `warm` seconds
    of slow start), on the emulated hosts `hosts` (procs.NamespaceHosts)."""
    env: dict[str, str] = {}
    server = hosts.popen(dst, [sys.executable, "-c", _SERVER], env, stdout=subprocess.DEVNULL)
    try:
        argv = [sys.executable, "-c", _CLIENT, hosts.bind_host(dst), str(seconds), str(warm)]
        client = hosts.popen(src, argv, env, stdout=subprocess.PIPE, text=True)
        text, _ = client.communicate(timeout=seconds + warm + 60)
        return float(text.strip().splitlines()[-1])
    finally:
        server.kill()
        server.wait(timeout=10)


def check(cfg: Any) -> None:
    """ConfigError (one line naming the flag) unless the path options make an emulated path."""
    try:
        check_path(cfg.emulate_delay_ms, cfg.emulate_jitter_ms, cfg.emulate_loss)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if (cfg.emulate_delay_ms or cfg.emulate_jitter_ms or cfg.emulate_loss) and not cfg.emulate_gbps:
        raise ConfigError("--emulate-delay-ms, --emulate-jitter-ms and --emulate-loss need --emulate-gbps")


def baseline(cfg: Any, hosts: Any, out: Callable[[str], None]) -> float | None:
    """One bulk stream worker 0 -> reducer 0 when the run emulates a long path (else None)."""
    if not (cfg.emulate_delay_ms or cfg.emulate_jitter_ms or cfg.emulate_loss) or not cfg.emulate_gbps:
        return None
    try:
        rate = measure(hosts, 0, cfg.workers)
    except (OSError, ValueError, IndexError, subprocess.SubprocessError) as exc:
        out(f"# one bulk TCP stream on the same path: not measured ({type(exc).__name__}: {exc})")
        return None
    out(f"# one bulk TCP stream on the same path (host 0 -> host {cfg.workers}): {rate / 1e6:.1f} MB/s")
    return rate


def format_ratios(rows: list[dict[str, Any]], bulk_Bps: float, workers: int, reducers: int) -> list[str]:
    """Each rs row's rate per worker link (buffer bytes each way per second) and on a reducer's link
    (W/R times that) against the bulk stream."""
    lines = []
    for r in rows:
        if r.get("algo") != "rs" or not r.get("time_us"):
            continue
        per_link = r["size"] / (r["time_us"] * 1e-6)
        busiest = per_link * max(1.0, workers / reducers)  # a reducer's link carries W/R links' bytes
        lines.append(
            f"# long path: rs {r['size']} B: {per_link / 1e6:.1f} MB/s per worker link = {per_link / bulk_Bps:.1%}, "
            f"{busiest / 1e6:.1f} MB/s on a reducer's link = {busiest / bulk_Bps:.1%} of one bulk TCP stream "
            f"({bulk_Bps / 1e6:.1f} MB/s)"
        )
    return lines
