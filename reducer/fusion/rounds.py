"""What the fusion engine moves: submitted *entries*, the *rounds* cut from them, and their segments.

Plain data and pure functions, no threads and no locks: an ``Entry`` is written once by the
caller's thread before it is published (under the engine lock, reducer.fusion.lifecycle) and only
read afterwards; a ``Round`` is built by the fusion thread and then belongs to exactly one thread
at a time (fusion thread -> network or probe thread -> fusion thread), handed over through queues
guarded by the engine lock.

A round's segments are the entries' own memory (the caller's CPU arrays, or the pinned buffer a
device array was staged into): no packing copy, no unpacking copy, no cast. Compression (float32
sent as bfloat16/float16) is the transport's: a compressed round passes its float32 segments with
``compression=`` and the client narrows and widens them chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..dtypes import wire_name
from ..errors import ReductionError
from ..frameworks import Staged
from .diagnosis import Described, Fingerprint, fingerprint, round_tag
from .handle import Handle
from .planner import Cut

__all__ = [
    "PROBE",
    "PROBE_TAG",
    "CLIENT_ROUND_BYTES",
    "Entry",
    "new_entry",
    "Round",
    "describe",
    "probe_round",
    "round_of",
    "prepare",
    "split",
    "segments",
    "client_failure",
]

PROBE_TAG = 0x3145424F52505352  # b"RSPROBE1", little-endian
PROBE = 2  # a round kind besides the planner's FUSED and ALONE: the agreement probe
# A round larger than this on the wire goes to the client as several consecutive rounds of at most
# this many wire bytes (same cut on every worker; a compressed round's float32 segments hold twice
# as many bytes). The client plans chunks from a round's shard size on the wire (about shard/64,
# up to chunk_bytes): measured on loopback (docs/worker-library.md), 64 MiB rounds moved 8-13%
# slower than the same bytes as per-tensor rounds, and 8 MiB pieces as fast or faster.
CLIENT_ROUND_BYTES = 8 << 20

Segments = list[tuple[int, int]]  # (address, length) pieces of memory, in order


class Entry:
    """One submitted tensor. host: its memory (flat), of dtype src; wire / wire_dt: what travels
    (differs from src only for float32 under compression, narrowed by the transport); nbytes:
    bytes on the wire; staged: the reducer.frameworks staging hooks; handle: its Handle."""

    __slots__ = (
        "index",
        "host",
        "wire",
        "wire_dt",
        "op",
        "nbytes",
        "name",
        "shape",
        "src",
        "staged",
        "handle",
        "t",
        "fp",
    )

    index: int
    host: np.ndarray
    wire: str
    wire_dt: np.dtype
    op: str
    nbytes: int
    name: str | None
    shape: tuple[int, ...]
    src: str
    staged: Staged
    handle: Handle
    t: float
    fp: Fingerprint

    def describe(self) -> str:
        return describe(self.index, self.name, self.src, self.shape, self.op, self.wire)


def new_entry(staged: Staged, op: str, name: str | None, compression: np.dtype | None) -> Entry:
    """The entry of a staged array (not numbered yet): float32 travels as `compression` if given."""
    host = staged.host
    src = wire_name(host.dtype)
    wire_dt = host.dtype
    if compression is not None and host.dtype == np.float32:
        wire_dt = compression
    e = Entry()
    e.host = host.reshape(-1)
    e.src = src
    e.wire = wire_name(wire_dt)
    e.wire_dt = wire_dt
    e.op = op
    e.nbytes = int(e.host.size) * wire_dt.itemsize
    e.name = name
    e.shape = staged.shape
    e.staged = staged
    e.fp = fingerprint(Described(e.nbytes, src, e.wire, op, int(e.host.size), e.shape, name))
    return e


def describe(index: int, name: str | None, src: str, shape: tuple[int, ...], op: str, wire: str) -> str:
    """How errors name a submitted tensor."""
    dims = "x".join(str(d) for d in shape) or "scalar"
    text = f"tensor #{index}"
    if name:
        text += f" {name!r}"
    text += f" ({src}[{dims}], op {op}"
    if wire != src:
        text += f", sent as {wire}"
    return text + ")"


class Round:
    """One round in the agreed sequence: a probe, or a planner cut (FUSED or ALONE) of entries."""

    __slots__ = (
        "kind",
        "entries",
        "src",
        "wire",
        "compression",
        "op",
        "nbytes",
        "tag",
        "pieces",
        "next_piece",
        "values",
    )

    def __init__(self, kind: int, entries: list[Entry], src: str, wire: str, op: str, nbytes: int) -> None:
        self.kind = kind
        self.entries = entries
        self.src = src  # the dtype of the segments' memory (the client's dtype argument)
        self.wire = wire  # the dtype on the wire
        # the client's compression argument: the 16-bit wire dtype of a float32 round, or ""
        self.compression = wire if wire != src else ""
        self.op = op
        self.nbytes = nbytes  # on the wire
        self.tag = 0
        # the client rounds this round is sent as: (address, length) segments, CLIENT_ROUND_BYTES at most
        # each on the wire
        self.pieces: list[Segments] = []
        self.next_piece = 0  # pieces started so far (network thread)
        self.values: np.ndarray | None = None  # the probe's two int64


def probe_round(values: np.ndarray) -> Round:
    """The 16-byte agreement probe (int64, op min) over `values`."""
    rnd = Round(PROBE, [], "int64", "int64", "min", 16)
    rnd.tag = PROBE_TAG
    rnd.values = values
    return rnd


def round_of(cut: Cut[Entry]) -> Round:
    """The data round of a planner cut, tagged with its entries' fingerprints."""
    entries = cut.entries  # one planner key: the same (src, wire, op) for all of them
    e0 = entries[0]
    rnd = Round(cut.kind, entries, e0.src, e0.wire, e0.op, cut.nbytes)
    rnd.tag = round_tag(cut.kind, rnd.wire, rnd.op, rnd.nbytes, ((e.index, e.fp.dhash) for e in entries))
    return rnd


def prepare(rnd: Round) -> None:
    """The round's segments: the entries' own memory (float32 bytes for a compressed round: the
    client narrows them), cut into client rounds of at most CLIENT_ROUND_BYTES on the wire."""
    pieces: Segments = []
    for e in rnd.entries:
        e.staged.before_read()  # a device array's copy to the host has landed
        if e.nbytes:
            pieces.append((int(e.host.ctypes.data), int(e.host.nbytes)))
    e0 = rnd.entries[0]
    widen = e0.host.dtype.itemsize // e0.wire_dt.itemsize  # host bytes per wire byte: 2 compressed, else 1
    rnd.pieces = split(segments(pieces), CLIENT_ROUND_BYTES * widen)


def split(segs: Segments, limit: int) -> list[Segments]:
    """Segments cut into consecutive client rounds of at most `limit` bytes (a multiple of 8, so
    every cut falls between elements). Deterministic: the same round gives the same pieces."""
    out: list[Segments] = [[]]
    room = limit
    for ptr, n in segs:
        while n:
            if room == 0:
                out.append([])
                room = limit
            take = min(n, room)
            out[-1].append((ptr, take))
            ptr, n, room = ptr + take, n - take, room - take
    return out if out[0] else []


def segments(pieces: Iterable[tuple[int, int]]) -> Segments:
    """(address, length) pieces in order, empty ones dropped and adjacent ones merged."""
    out: Segments = []
    for ptr, n in pieces:
        if n == 0:
            continue
        if out and out[-1][0] + out[-1][1] == ptr:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((ptr, n))
    return out


def client_failure(exc: BaseException) -> BaseException:
    """The error to report for a round the client failed (typed: the client's ReductionError subclasses)."""
    if not isinstance(exc, ReductionError):
        return ReductionError(f"all-reduce failed: {exc!r}")
    return exc
