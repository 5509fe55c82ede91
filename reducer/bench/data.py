"""Benchmark inputs and their exact reference results.

Rank r's input is a period-251 pattern of small integers, shifted by 37 x r elements:
    x_r[i] = p[(i + 37 r) % 251],   p[j] = (j % 9) - 4   (values -4 .. 4)
Every partial sum of such values is an exactly representable integer in every dtype
(also float16 / bfloat16 for up to 64 ranks), so sum, min and max must come back
bit-exact whatever the summation order; avg is compared with a tolerance of two
units in the last place of the dtype (integers: exact, truncating division). The
rank shift makes a chunk placed at the wrong offset or taken from the wrong rank
visible; the period (251, prime) is coprime to every segment/chunk stride used.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..dtypes import numpy_dtype, wire_name

PERIOD = 251
SHIFT = 37


def _period(rank: int) -> np.ndarray:
    j = (np.arange(PERIOD) + SHIFT * rank) % PERIOD
    return ((j % 9) - 4).astype(np.float64)


def make_input(rank: int, count: int, dtype: str) -> np.ndarray:
    """This rank's input of `count` elements (a fresh array)."""
    return np.resize(_period(rank), count).astype(numpy_dtype(dtype))


def reference(world: int, count: int, dtype: str, op: str, wire: str | None = None) -> tuple[np.ndarray, float]:
    """(expected result in `dtype`, relative tolerance: 0 = exact).

    wire: the 16-bit type the values travelled as (compression, a bfloat16 copy): sums, min and
    max of the inputs stay exact in it; avg is allowed `world` units of its last place (a copy
    divided before a 16-bit ring sum rounds at every step)."""
    dt = numpy_dtype(dtype)
    stack = np.stack([_period(r) for r in range(world)])
    if op == "sum":
        ref = stack.sum(0)
    elif op == "min":
        ref = stack.min(0)
    elif op == "max":
        ref = stack.max(0)
    elif op == "avg":
        ref = stack.sum(0) / world
        if dt.kind in "iu":
            ref = np.trunc(ref)
    else:
        raise ValueError(f"unknown op {op!r}")
    tol = 0.0
    if op == "avg" and dt.kind not in "iu":
        tol = 2.0 * _eps(dt) if wire is None else max(2, world) * _eps(numpy_dtype(wire))
    return np.resize(ref, count).astype(dt), tol


def _eps(dt: np.dtype) -> float:
    try:
        return float(np.finfo(dt).eps)
    except ValueError:  # ml_dtypes.bfloat16
        return float(ml_dtypes.finfo(dt).eps)


def count_wrong(out: np.ndarray, expected: np.ndarray, tol: float, block: int = 1 << 22) -> int:
    """Elements of `out` that differ from `expected` (beyond tol x max(1, |expected|))."""
    if out.size != expected.size:
        raise ValueError("size mismatch")
    if tol == 0.0:
        if out.dtype.itemsize == 2 and out.dtype.kind not in "iu":
            # 16-bit floats (and ml_dtypes.bfloat16): compare bit patterns, exact values only
            return int(np.count_nonzero(out.view(np.uint16) != expected.view(np.uint16)))
        return int(np.count_nonzero(out != expected))
    wrong = 0
    for s in range(0, out.size, block):
        o = out[s : s + block].astype(np.float64)
        e = expected[s : s + block].astype(np.float64)
        wrong += int(np.count_nonzero(np.abs(o - e) > tol * np.maximum(1.0, np.abs(e))))
    return wrong


# A multiple of the period (so every tile starts at phase 0) of about a million elements: whole
# models' gradient buffers are filled and checked tile by tile, without a second full-size copy.
TILE = PERIOD * 4096


def fill_input(out: np.ndarray, rank: int) -> None:
    """Write rank's input (make_input) into `out` in place."""
    tile = make_input(rank, min(TILE, out.size), wire_name(out.dtype))
    for s in range(0, out.size, TILE):
        n = min(TILE, out.size - s)
        out[s : s + n] = tile[:n]


def count_wrong_tiled(out: np.ndarray, world: int, op: str, tol: float) -> int:
    """count_wrong against reference(world, out.size, ..., op), a tile at a time."""
    expected, _ = reference(world, min(TILE, out.size), wire_name(out.dtype), op)
    return sum(
        count_wrong(out[s : s + TILE], expected[: min(TILE, out.size - s)], tol) for s in range(0, out.size, TILE)
    )


def step_tolerance(wire: str, world: int) -> float:
    """Relative tolerance of an averaged gradient sent as `wire`: every input (divided by the
    world size first, as DDP's gloo path and the 16-bit hooks do) and every partial sum may be
    rounded to the wire type. With the inputs above, a misplaced chunk is off by >= 1/world."""
    return max(2, world) * _eps(numpy_dtype(wire))
