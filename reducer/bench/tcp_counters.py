"""The emulated hosts' TCP counters over a pass: segments sent and retransmitted, retransmission
timeouts and tail-loss probes, summed over every host's network namespace (the kernel's
/proc/net/snmp and /proc/net/netstat as seen inside it, read by EmulatedHosts.tcp_counters).
Incast shows here first: a lost burst becomes retransmissions, and a lost tail a timeout of at
least 200 ms (docs/performance.md, "Fan-in"). The qdiscs' drops say where packets were lost: in a
sending host's own queue (its links' windows overfill it) or at the switch's port to the receiver
(incast): docs/performance.md, "The path window and bursts"."""

from __future__ import annotations

import re
from typing import Any

# (file's table, counter) -> the name rows and the report use
COUNTERS = {
    ("Tcp", "OutSegs"): "sent",
    ("Tcp", "RetransSegs"): "retransmitted",
    ("TcpExt", "TCPTimeouts"): "timeouts",
    ("TcpExt", "TCPLossProbes"): "loss_probes",
}


def parse(text: str) -> dict[str, int]:
    """The COUNTERS in the text of /proc/net/snmp and /proc/net/netstat (pairs of lines: a table's
    names, then its values)."""
    got: dict[str, int] = {}
    lines = text.splitlines()
    for names, values in zip(lines, lines[1:]):
        table, _, keys = names.partition(":")
        vtable, _, vals = values.partition(":")
        if table != vtable or not keys.strip() or keys.split()[0].lstrip("-").isdigit():
            continue
        for key, val in zip(keys.split(), vals.split()):
            name = COUNTERS.get((table, key))
            if name is not None and val.lstrip("-").isdigit():
                got[name] = int(val)
    return got


def parse_drops(text: str) -> int:
    """Packets dropped, summed over the qdiscs in the text of `tc -s qdisc show` ("(dropped N, ...")."""
    return sum(int(m) for m in re.findall(r"\(dropped (\d+),", text))


def delta(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int] | None:
    if before is None or after is None:
        return None
    return {k: after[k] - before.get(k, 0) for k in after}


def describe(algo: str, d: dict[str, Any] | None) -> str | None:
    """The report's line for a pass's counters, or None."""
    if not d or not d.get("sent"):
        return None
    return (
        f"# TCP over the {algo} run's timed and warm-up rounds (all emulated hosts): {d['sent']} segments sent, "
        f"{d.get('retransmitted', 0)} retransmitted ({100.0 * d.get('retransmitted', 0) / d['sent']:.2f}%), "
        f"{d.get('timeouts', 0)} retransmission timeouts, {d.get('loss_probes', 0)} tail-loss probes"
        + (
            f"; packets dropped by the hosts' own queues {d['host_drops']}, by the switch's ports {d['switch_drops']}"
            if "host_drops" in d and "switch_drops" in d
            else ""
        )
    )
