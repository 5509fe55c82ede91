"""DDP's gradient buckets for a parameter list, and when each is released in a backward pass.

PyTorch DDP (after its first iteration, when it rebuilds its buckets in gradient-ready order,
``Reducer::rebuild_buckets`` -> ``compute_bucket_assignment_by_size``) fills buckets with the
parameters in the order their gradients become ready, approximated here, as DDP's own initial
assignment does, by reverse registration order. A parameter is added to the open bucket; when
the bucket's size reaches or passes its limit (the parameter that crosses the limit stays in
it), the bucket is closed and the next one opens. The first bucket's limit is
``first_bucket_bytes_cap`` (``dist._DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB), every later one's
``bucket_cap_mb`` MiB; what is left at the end is the last bucket. Bucket k is all-reduced as
soon as its last gradient is ready: in a backward pass of ``compute`` seconds whose work is
spread over the parameters in proportion to their size, that is ``compute x (bytes of buckets
0..k) / (all bytes)`` after the backward pass started.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIB = 1 << 20
DEFAULT_FIRST_BUCKET_BYTES = MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


@dataclass(frozen=True)
class Bucket:
    params: tuple[int, ...]  # parameter indices (registration order), in the order they fill the bucket
    offset: int  # first element in the flat gradient buffer (buckets laid out in bucket order)
    count: int  # elements


def plan_buckets(
    counts: Sequence[int],
    element_size: int,
    bucket_cap_bytes: int,
    first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES,
) -> list[Bucket]:
    """DDP's buckets for parameters of `counts` elements each (registration order), in the order
    they are all-reduced."""
    if bucket_cap_bytes < 1 or first_bucket_bytes < 1:
        raise ValueError("bucket limits must be at least 1 byte")
    buckets: list[Bucket] = []
    params: list[int] = []
    nbytes = elements = offset = 0
    for i in reversed(range(len(counts))):
        params.append(i)
        nbytes += counts[i] * element_size
        elements += counts[i]
        if nbytes >= (first_bucket_bytes if not buckets else bucket_cap_bytes):
            buckets.append(Bucket(tuple(params), offset, elements))
            offset += elements
            params, nbytes, elements = [], 0, 0
    if params:
        buckets.append(Bucket(tuple(params), offset, elements))
    return buckets


def release_times(buckets: Sequence[Bucket], compute_s: float) -> list[float]:
    """Seconds after the backward pass starts at which each bucket's last gradient is ready."""
    total = sum(b.count for b in buckets)
    out, done = [], 0
    for b in buckets:
        done += b.count
        out.append(compute_s * done / total if total else 0.0)
    return out
