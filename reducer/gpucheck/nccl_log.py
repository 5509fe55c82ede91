"""Reads what NCCL printed with NCCL_DEBUG=INFO: which net it used, whether CollNet was set up,
and which algorithm its tuner chose for each collective.

The texts are NCCL's own (src/init.cc, src/plugin/net*.cc, src/transport/coll_net.cc,
src/enqueue.cc of NCCL 2.21-2.30); every line starts with ``host:pid:tid [cudaDev] NCCL INFO``
(or ``... NCCL WARN``):

- ``NET/Plugin: Loaded net plugin <name> (vN)`` / ``... Loaded collnet plugin <name> (vN)``
  (``coll plugin`` before 2.24): an external plugin was loaded;
- ``Using network <name>``: the point-to-point net of the communicator (``Socket``/``IB`` for
  NCCL's own, ``reduction-server`` for this project's plugin);
- ``CollNet 00/0 : 0 [send] via COLLNET/<name>/0``, ``rank 0 Connected CollNet``,
  ``Connected Collnet Chains ...``: CollNet channels were connected;
- ``Communicator has 1 nodes which is less than CollNet node threshold 2, disabling CollNet``;
- the tuner's choice, printed by rank 0 with NCCL_DEBUG_SUBSYS including TUNING:
  2.24+ ``AllReduce: 4096 Bytes -> Algo COLLNET_CHAIN proto SIMPLE channel{Lo..Hi}={0..0}``,
  2.22-2.23 ``AllReduce: 4096 Bytes -> Algo 3 proto 2 time 12.5`` (numbers: NCCL's
  enum order), 2.21 ``4096 Bytes -> Algo 3 proto 2 time 12.5`` (no function name);
  ``AllReduce [Symmetric]: ... -> Kernel ...`` and ``[Copy Engine]`` name other paths;
- this project's plugin logs through NCCL's logger as ``NET/reduction-server: ...``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

# NCCL's algorithm enum (src/include/device.h), the same order in 2.19-2.30.
ALGO_BY_NUMBER = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
PROTO_BY_NUMBER = ("LL", "LL128", "SIMPLE")
COLLNET_ALGOS = frozenset({"COLLNET_DIRECT", "COLLNET_CHAIN"})

_PREFIX = re.compile(r"NCCL (INFO|WARN) ?(.*)$")
_LOADED = re.compile(r"NET/Plugin: Loaded (net|collnet|coll) plugin (\S+) \(v(\d+)\)")
_USING = re.compile(r"^Using network (\S+)")
_COLLNET_CHANNEL = re.compile(r"^CollNet \d+/\d+ : \d+ \[(send|receive)\] via COLLNET/([^/\s]+)")
_CONNECTED = re.compile(r"^(rank \d+ Connected CollNet|Connected Collnet Chains|Connected collnet \+ chain)")
_THRESHOLD = re.compile(r"less than CollNet node threshold \d+, disabling CollNet")
_TUNING = re.compile(
    r"^(?:(?P<func>[A-Za-z]+)(?P<special> \[[^\]]+\])?: )?(?P<bytes>\d+) Bytes -> "
    r"(?:Algo (?P<algo>\S+) proto (?P<proto>\S+)|(?P<other>.*))"
)
_PLUGIN = re.compile(r"NET/reduction-server: (.*)$")


def normalize_algo(text: str) -> str:
    """'CollNetChain', 'COLLNET_CHAIN', '3' -> 'COLLNET_CHAIN'."""
    if text.isdigit():
        n = int(text)
        return ALGO_BY_NUMBER[n] if n < len(ALGO_BY_NUMBER) else f"ALGO_{n}"
    flat = text.upper().replace("_", "")
    for name in ALGO_BY_NUMBER:
        if name.replace("_", "") == flat:
            return name
    return text.upper()


def normalize_proto(text: str) -> str:
    if text.isdigit():
        n = int(text)
        return PROTO_BY_NUMBER[n] if n < len(PROTO_BY_NUMBER) else f"PROTO_{n}"
    return text.upper()


@dataclass
class TuningChoice:
    """One collective as the tuner placed it (rank 0's log only)."""

    func: str  # 'AllReduce', or '' on NCCL 2.21, which does not print it
    nbytes: int
    algo: str  # normalized: RING, COLLNET_CHAIN, ... or SYMMETRIC / COPY_ENGINE / OTHER
    proto: str

    @property
    def collnet(self) -> bool:
        return self.algo in COLLNET_ALGOS


@dataclass
class NcclLog:
    """What one process's NCCL log says."""

    lines: int = 0
    net_plugin: str | None = None  # 'reduction-server (v12)'
    collnet_plugin: str | None = None
    networks: list[str] = field(default_factory=list)  # 'Using network X', once per communicator
    collnet_channels: int = 0  # 'CollNet xx/x : r [send|receive] via COLLNET/...' lines
    collnet_connected: bool = False
    collnet_disabled: list[str] = field(default_factory=list)
    tuning: list[TuningChoice] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    plugin_lines: list[str] = field(default_factory=list)

    def allreduce_choices(self) -> list[TuningChoice]:
        return [t for t in self.tuning if t.func in ("AllReduce", "")]

    def collnet_bytes(self) -> int:
        """Bytes of the all-reduces the tuner put on CollNet."""
        return sum(t.nbytes for t in self.allreduce_choices() if t.collnet)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tuning"] = summarize_tuning(self.tuning)
        out["plugin_lines"] = self.plugin_lines[:20]
        out["warnings"] = self.warnings[:20]
        return out


def summarize_tuning(choices: Iterable[TuningChoice]) -> list[dict[str, Any]]:
    """Distinct (func, bytes, algo, proto) with a count, in first-seen order."""
    seen: dict[tuple, int] = {}
    for t in choices:
        key = (t.func, t.nbytes, t.algo, t.proto)
        seen[key] = seen.get(key, 0) + 1
    return [{"func": k[0], "bytes": k[1], "algo": k[2], "proto": k[3], "count": n} for k, n in seen.items()]


def _tuning(body: str) -> TuningChoice | None:
    m = _TUNING.match(body)
    if not m:
        return None
    func = m.group("func") or ""
    if m.group("algo") is not None:
        return TuningChoice(
            func, int(m.group("bytes")), normalize_algo(m.group("algo")), normalize_proto(m.group("proto"))
        )
    special = (m.group("special") or "").strip(" []").upper().replace(" ", "_") or "OTHER"
    return TuningChoice(func, int(m.group("bytes")), special, "")


def _apply(log: NcclLog, level: str, body: str) -> None:
    plugin = _PLUGIN.search(body)
    if plugin:
        log.plugin_lines.append(plugin.group(1))
    if level == "WARN":
        log.warnings.append(body)
        return
    loaded = _LOADED.search(body)
    if loaded:
        text = f"{loaded.group(2)} (v{loaded.group(3)})"
        if loaded.group(1) == "net":
            log.net_plugin = text
        else:
            log.collnet_plugin = text
        return
    using = _USING.match(body)
    if using:
        log.networks.append(using.group(1))
        return
    if _COLLNET_CHANNEL.match(body):
        log.collnet_channels += 1
        return
    if _CONNECTED.match(body):
        log.collnet_connected = True
        return
    if _THRESHOLD.search(body):
        log.collnet_disabled.append(body)
        return
    choice = _tuning(body)
    if choice is not None:
        log.tuning.append(choice)


def parse_lines(lines: Iterable[str]) -> NcclLog:
    """Parse NCCL_DEBUG=INFO output (other lines are ignored)."""
    log = NcclLog()
    for raw in lines:
        m = _PREFIX.search(raw.rstrip("\n"))
        if not m:
            continue
        log.lines += 1
        level, body = m.group(1), m.group(2)
        if level == "WARN":
            # 'NCCL WARN' follows '[dev] file.cc:123' on NCCL's WARN lines; keep the message only.
            body = body.strip()
        _apply(log, level, body)
    return log


def parse_file(path: str) -> NcclLog:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return parse_lines(fh)
    except FileNotFoundError:
        return NcclLog()
