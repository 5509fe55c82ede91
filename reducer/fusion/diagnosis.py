"""Fingerprints of the tensors given to allreduce_async, and the diagnosis of a mismatch.

Each entry gets a *descriptor*: one int64 per field of FIELDS (size, dtypes, op, shape, name),
and a 62-bit hash of it. A data round's 64-bit frame tag hashes the descriptors of its entries
(``round_tag``), so the reducers fail a round whose entries differ between workers with a
MismatchError on every worker.

The reducer can only say "tags differ". ``Diagnosis`` then names the tensor: on a separate
connection (group ``<group>/fusion-check``), fixed-size int64 arrays are reduced with op min;
each carries ``[v, -v]`` so one round gives the min and the max over the workers. First a head
(the first entry not completed everywhere, the count, the thresholds), then the descriptor hashes
window by window from that entry, then the fields of the first entry whose min != max; FIELDS
says how each field's min and max read in the message. Every array has the same size and every
decision to continue is taken from reduced (identical) values, so the check itself cannot
mismatch; the client it runs on bounds it by the communicator's timeout.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..dtypes import OPS, SUPPORTED, dtype_code, op_code
from ..errors import MismatchError, PeerLostError, ReductionError

log = logging.getLogger(__name__)

__all__ = [
    "FIELDS",
    "Field",
    "Described",
    "Fingerprint",
    "fingerprint",
    "round_tag",
    "History",
    "Diagnosis",
    "DIAG_TAG",
]

DIAG_TAG = 0x3147414944535352  # b"RSDIAG1"
DIAG_WINDOW = 512  # entry hashes per diagnostic round
DIAG_MAX_WINDOWS = 16  # at most 8192 entries are compared
HISTORY = 8192  # fingerprints of completed entries kept for the diagnosis
_MASK62 = (1 << 62) - 1  # hashes fit in int64 and can be negated
_SLOTS = 2 + DIAG_WINDOW  # int64 values per diagnostic array (before the [v, -v] doubling)


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def h62(data: bytes) -> int:
    """A non-zero hash that fits in int64 and can be negated (0 means "absent")."""
    return (_h64(data) & _MASK62) | 1


# ---------------------------------------------------------------------- the field table
class Described(NamedTuple):
    """What the fingerprint reads of a submitted tensor."""

    nbytes: int  # bytes on the wire
    src: str  # wire name of the caller's dtype
    wire: str  # wire name of what is sent (differs under compression)
    op: str
    numel: int
    shape: tuple[int, ...]
    name: str | None


def _range(label: str, a: int, b: int) -> str:
    return f"{label} ({a} to {b})"


def _named(names: Sequence[str]) -> Callable[[str, int, int], str]:
    def explain(label: str, a: int, b: int) -> str:
        def name(code: int) -> str:
            return names[code] if 0 <= code < len(names) else str(code)

        return f"{label} ({name(a)} / {name(b)})"

    return explain


def _opaque(label: str, a: int, b: int) -> str:
    return label


def _optional(label: str, a: int, b: int) -> str:
    return f"{label} (given on some workers only)" if a == 0 or b == 0 else label


@dataclass(frozen=True)
class Field:
    label: str  # how the message names it
    value: Callable[[Described], int]  # an int64 (hashes are non-zero; 0 = absent)
    explain: Callable[[str, int, int], str]  # the difference, from the min and max over the workers


FIELDS: tuple[Field, ...] = (
    Field("size in bytes", lambda d: d.nbytes, _range),
    Field("dtype", lambda d: dtype_code(d.src), _named(SUPPORTED)),
    Field("wire dtype (compression)", lambda d: dtype_code(d.wire), _named(SUPPORTED)),
    Field("op", lambda d: op_code(d.op), _named(OPS)),
    Field("number of elements", lambda d: d.numel, _range),
    Field("number of dimensions", lambda d: len(d.shape), _range),
    Field("shape", lambda d: h62(repr(d.shape).encode()), _opaque),
    Field("name", lambda d: h62(d.name.encode("utf-8", "surrogatepass")) if d.name else 0, _optional),
)


def differences(lo: Iterable[int], hi: Iterable[int]) -> str:
    """The fields whose min and max over the workers differ, as a phrase (lo, hi: one value per FIELDS entry,
    e.g. the reduced int64 arrays)."""
    diffs = [f.explain(f.label, int(a), int(b)) for f, a, b in zip(FIELDS, lo, hi) if int(a) != int(b)]
    return ", ".join(diffs) or "description"


# ---------------------------------------------------------------------- fingerprints
class Fingerprint(NamedTuple):
    dhash: int  # hash of the descriptor (non-zero)
    fields: tuple[int, ...]  # the descriptor: one value per FIELDS entry


@functools.lru_cache(maxsize=1 << 16)
def fingerprint(d: Described) -> Fingerprint:
    """The descriptor and its hash (pure: cached, as a training loop submits the same tensors every step)."""
    fields = tuple(int(f.value(d)) for f in FIELDS)
    return Fingerprint(h62(np.array(fields, np.int64).tobytes()), fields)


def round_tag(kind: int, wire: str, op: str, nbytes: int, entries: Iterable[tuple[int, int]]) -> int:
    """The frame tag of a data round: a hash of its kind, dtype, op, size and (index, dhash) of
    each entry. Odd, so never 0 (0 means "no tag" to the reducers)."""
    pairs = list(entries)
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{kind}:{wire}:{op}:{len(pairs)}:{nbytes}".encode())
    h.update(np.array(pairs, np.int64).tobytes())
    return int.from_bytes(h.digest(), "little") | 1


class History:
    """Fingerprints and descriptions (as this worker words them) by submission index: every pending
    entry and up to HISTORY completed ones before. A description may be given as a function that
    words it: it is only called if the diagnosis needs it (submission stays cheap)."""

    def __init__(self) -> None:
        self._items: deque[tuple[Fingerprint, str | Callable[[], str]]] = deque()
        self._lo = 0  # index of _items[0]

    def add(self, fp: Fingerprint, text: str | Callable[[], str], lowest_pending: Callable[[], int]) -> None:
        """Record the next entry; now and then forget old completed entries."""
        self._items.append((fp, text))
        count = self._lo + len(self._items)
        if len(self._items) > 2 * HISTORY and not count & 1023:
            keep_from = max(self._lo, lowest_pending() - HISTORY)
            while self._lo < keep_from:
                self._items.popleft()
                self._lo += 1

    def get(self, index: int) -> tuple[Fingerprint, str] | None:
        i = index - self._lo
        if not 0 <= i < len(self._items):
            return None
        fp, text = self._items[i]
        return fp, text if isinstance(text, str) else text()

    def __len__(self) -> int:
        return len(self._items)


# ---------------------------------------------------------------------- diagnosis
class Diagnosis:
    """Turns a failed fused round into the most useful error: names the first differing tensor.

    make_client: a fresh C++ client on the ``/fusion-check`` group; lock: the engine's lock, held
    while reading `history` and `count` (the number of entries submitted so far).
    """

    def __init__(
        self,
        make_client: Callable[[], Any],
        *,
        rank: int,
        threshold: int,
        lock: threading.Condition,
        history: History,
        count: Callable[[], int],
    ) -> None:
        self._make_client = make_client
        self.rank = rank
        self.threshold = threshold
        self._lock = lock
        self._history = history
        self._count = count

    def explain(self, err: BaseException, base: int) -> BaseException:
        """The error to report for `err`; `base` is the first entry this worker has not completed."""
        if not isinstance(err, (MismatchError, PeerLostError)):
            return err
        t0 = time.monotonic()
        try:
            found = self._find(base)
        except ReductionError as exc:
            log.warning("fusion fingerprint check failed: %s", exc)
            if isinstance(err, MismatchError):
                return MismatchError(f"{err} [the fusion fingerprint check could not name the differing tensor: {exc}]")
            return err
        finally:
            log.debug("fusion fingerprint check took %.3f s", time.monotonic() - t0)
        if found is None:
            if isinstance(err, MismatchError):
                return MismatchError(
                    f"{err} [fusion fingerprint check: the tensors every worker has submitted match; "
                    "the workers may have cut their buffers differently]"
                )
            return err
        return MismatchError(f"{found}. The reducer reported: {err}")

    def _find(self, base: int) -> str | None:
        client = self._make_client()

        def exchange(*values: int, tail: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
            """min and max over the workers of [values..., tail...] (zero-padded to a fixed size)."""
            v = np.zeros(_SLOTS, np.int64)
            v[: len(values)] = values
            v[len(values) : len(values) + len(tail)] = tail
            buf = np.concatenate([v, -v])
            client.allreduce(buf, "int64", "min", DIAG_TAG)
            return buf[:_SLOTS], -buf[_SLOTS:]

        try:
            with self._lock:
                count = self._count()
            lo, hi = exchange(base, count, self.threshold)
            start = int(lo[0])  # the first entry some worker has not completed
            if lo[2] != hi[2]:
                return (
                    f"the workers use different fusion thresholds ({int(lo[2])} to {int(hi[2])} bytes; this "
                    f"worker: {self.threshold}), so they cut their fused buffers at different places: set "
                    "fusion_threshold / RS_FUSION_THRESHOLD to the same value on every worker"
                )
            for w in range(DIAG_MAX_WINDOWS):
                s = start + w * DIAG_WINDOW
                with self._lock:
                    count = self._count()
                    hashes = [self._hash(s + j, count) for j in range(DIAG_WINDOW)]
                mn, mx = exchange(s, count, tail=hashes)
                for j in range(DIAG_WINDOW):
                    a, b = int(mn[2 + j]), int(mx[2 + j])
                    if a == 0:  # some worker has not submitted this one (yet)
                        return None
                    if a != b:
                        return self._describe(exchange, s + j)
            return None
        finally:
            try:
                client.close()
            except Exception:  # pragma: no cover
                pass

    def _hash(self, index: int, count: int) -> int:
        rec = self._history.get(index) if index < count else None
        return rec[0].dhash if rec is not None else 0

    def _describe(self, exchange: Callable[..., tuple[np.ndarray, np.ndarray]], index: int) -> str:
        with self._lock:
            rec = self._history.get(index)
        assert rec is not None
        fp, text = rec
        mn, mx = exchange(*fp.fields)
        return (
            f"workers submitted different tensors to allreduce_async: the first difference is at "
            f"tensor #{index} (0-based submission order); on rank {self.rank} it is {text}; "
            f"the workers differ in its {differences(mn, mx)}"
        )
