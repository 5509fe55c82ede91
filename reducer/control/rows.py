"""What the control plane reports, as plain Python: a reducer's counters and its per-group rows.

Pure Python (no grpc, no prometheus_client): the gRPC service (reducer.control.service), the
metrics (reducer.control.metrics) and `reduction-server status` all read the reducer through
these two functions.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

REDACTED = "<address>"
# Candidates: [IPv6]:port, IPv4[:port], and bare runs of hex digits, dots and colons that may be
# IPv6 addresses (each checked with ipaddress before it is replaced).
_BRACKETED = re.compile(r"\[[0-9A-Za-z:.%_-]*\](?::\d{1,5})?")
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?(?![\w.])")
_MAYBE_IPV6 = re.compile(r"(?<![\w:.])[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(?:%[\w.-]+)?(?![\w:])")


@dataclass(frozen=True)
class GroupRow:
    """One group (job, group) of a reducer, its streams added up (GroupStats in reducer.proto)."""

    job: str
    group: str
    world_size: int
    connected: int  # ranks connected (stream-0 connections)
    complete: bool  # every rank has connected
    rounds: int  # rounds completed (stream 0: every stream takes part in every round)
    bytes_received: int  # all streams
    bytes_sent: int
    last_error: str  # "" when none (stream 0's error first)
    age_s: float  # seconds since the oldest stream of the group was created
    streams: int  # stream rows seen for the group
    ended: bool = False  # one of the last groups that ended (no round can run in it any more)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def group_rows(rows: Iterable[Mapping[str, Any]]) -> list[GroupRow]:
    """Fold ReducerServer.group_stats() (one dict per group *stream*) into one row per (job, group).

    Each dict has job, group, stream, world_size, connected, complete, rounds, bytes_received,
    bytes_sent, last_error, age_s and ended; a live group and an ended one of the same name are
    separate rows. World size, connected ranks, completeness and rounds come from
    stream 0 (the lowest stream present while a group is still forming); bytes are summed over the
    streams; the error is stream 0's, else the first other stream's; the age is the oldest stream's.
    Rows come back sorted by (job, group, ended).
    """
    by_key: dict[tuple[str, str, bool], list[Mapping[str, Any]]] = {}
    for row in rows:
        by_key.setdefault((str(row["job"]), str(row["group"]), bool(row.get("ended", False))), []).append(row)
    out: list[GroupRow] = []
    for (job, group, ended), listed in sorted(by_key.items()):
        # A stream listed twice among the ended (it left, then failed): its last state counts once.
        streams = sorted({int(r["stream"]): r for r in listed}.values(), key=lambda r: int(r["stream"]))
        first = streams[0]
        errors = [str(r["last_error"]) for r in streams if r["last_error"]]
        out.append(
            GroupRow(
                job=job,
                group=group,
                world_size=int(first["world_size"]),
                connected=int(first["connected"]),
                complete=bool(first["complete"]),
                rounds=int(first["rounds"]),
                bytes_received=sum(int(r["bytes_received"]) for r in streams),
                bytes_sent=sum(int(r["bytes_sent"]) for r in streams),
                last_error=errors[0] if errors else "",
                age_s=max(float(r["age_s"]) for r in streams),
                streams=len(streams),
                ended=ended,
            )
        )
    return out


def redact_addresses(text: str) -> str:
    """`text` with every IP address (with its port, if any) replaced by "<address>": what the
    control plane shows a caller that has not proved the shared secret (docs/security.md)."""

    def maybe(m: re.Match[str]) -> str:
        candidate = m.group(0).split("%", 1)[0]
        try:
            ipaddress.IPv6Address(candidate)
        except ValueError:
            return m.group(0)
        return REDACTED

    text = _BRACKETED.sub(REDACTED, text)
    text = _MAYBE_IPV6.sub(maybe, text)
    return _IPV4.sub(REDACTED, text)


def redacted(rows: Iterable[GroupRow]) -> list[GroupRow]:
    """The rows with worker addresses removed from their last_error."""
    return [replace(r, last_error=redact_addresses(r.last_error)) if r.last_error else r for r in rows]


def split_stats(stats: Mapping[str, Any], prefix: str = "") -> tuple[dict[str, int], dict[str, float], dict[str, str]]:
    """ReducerServer.stats() as (integers, other numbers, strings), whatever keys the core reports.

    Nested dicts (e.g. ``limits``) are flattened to ``"limits.max_group_bytes"``; booleans count
    as integers 0/1; negative integers (never a counter) go with the other numbers; anything else
    (lists, None) is left out.
    """
    ints: dict[str, int] = {}
    floats: dict[str, float] = {}
    strings: dict[str, str] = {}
    for key, value in stats.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            i, f, s = split_stats(value, prefix=f"{name}.")
            ints.update(i)
            floats.update(f)
            strings.update(s)
        elif isinstance(value, bool):
            ints[name] = int(value)
        elif isinstance(value, int):
            if value >= 0:
                ints[name] = value
            else:
                floats[name] = float(value)
        elif isinstance(value, float):
            floats[name] = value
        elif isinstance(value, str):
            strings[name] = value
    return ints, floats, strings
