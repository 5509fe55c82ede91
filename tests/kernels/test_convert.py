"""float32 <-> float16/bfloat16 conversion kernels (csrc/kernels narrow/widen), on every ISA.

narrow must be bit-identical to numpy `astype(np.float16)` / ml_dtypes `astype(bfloat16)` for
every non-NaN float32 (round to nearest even, overflow -> inf, subnormals rounded), keep NaN a
NaN of the same sign (bfloat16: exactly 0x7fc0 | sign, as ml_dtypes), and give the same bits on
every ISA; widen must be exact. Also the result definition of the compressed all-reduce,
`compressed_allreduce_reference`, checked against the kernels' own pipeline.
"""

import ml_dtypes
import numpy as np
import pytest
from test_kernels import BF16, available_isas, isa  # noqa: F401  (isa: fixture, every ISA here)

from reducer import _core

WIRES = {"float16": np.dtype(np.float16), "bfloat16": BF16}
SIZES = (0, 1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 1023, 100_003)


def f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def narrow(wire, x, out_offset=0):
    out = np.empty(x.size + out_offset, np.uint16)[out_offset:]
    _core.kernels_narrow(wire, out, x)
    return out


def widen(wire, bits, out_offset=0):
    out = np.empty(bits.size + out_offset, np.float32)[out_offset:]
    _core.kernels_widen(wire, out, bits)
    return out


def astype_bits(wire, x):
    with np.errstate(all="ignore"):
        return x.astype(WIRES[wire]).view(np.uint16)


def assert_narrow_ok(wire, x, got):
    """Bit-exact with astype for non-NaN inputs; NaN -> NaN of the same sign (bfloat16: 0x7fc0|sign)."""
    want = astype_bits(wire, x)
    nan = np.isnan(x)
    bad = np.flatnonzero(~nan & (got != want))
    assert bad.size == 0, (
        f"{bad.size} mismatches, first inputs {x.view(np.uint32)[bad[:5]]}: got {got[bad[:5]]} want {want[bad[:5]]}"
    )
    sign = (x.view(np.uint32)[nan] >> 16) & 0x8000
    if wire == "bfloat16":
        np.testing.assert_array_equal(got[nan], sign | 0x7FC0)
    else:
        g = got[nan]
        assert np.all((g & 0x7C00) == 0x7C00) and np.all(g & 0x0200), "float16 NaN must be a quiet NaN"
        np.testing.assert_array_equal(g & 0x8000, sign)


def boundary_values():
    """Every float32 whose top 16 bits take any value and whose low 16 bits sit on or next to a
    bfloat16 rounding boundary (0, tie - 1, tie, tie + 1, max): all exponents, subnormals, inf, NaN,
    every bfloat16 tie in both parities; with the float16 edge cases added explicitly."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lo = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    bits = (hi[:, None] | lo[None, :]).ravel()
    half = np.array(
        [
            65504.0,
            65519.996,
            65520.0,
            65536.0,
            1e6,
            2.0**-14,
            2.0**-24,
            2.0**-25,
            3 * 2.0**-25,
            2.0**-26,
            1.5 * 2.0**-24,
            2.0**-24 * 1.0000001,
            1 + 2.0**-11,
            1 + 3 * 2.0**-11,
            2.0**-14 - 2.0**-25,
            6.0e-8,
            5.96e-8,
            2.98e-8,
            2.99e-8,
            1e-45,
            3.4028235e38,
        ],
        dtype=np.float32,
    )
    x = np.concatenate([f32(bits), half, -half])
    return x


# ---------------------------------------------------------------------- narrow
@pytest.mark.parametrize("wire", list(WIRES))
def test_narrow_boundaries_match_astype(isa, wire):  # noqa: F811
    x = boundary_values()
    assert_narrow_ok(wire, x, narrow(wire, x))


@pytest.mark.parametrize("wire", list(WIRES))
def test_narrow_edge_cases(isa, wire):  # noqa: F811
    if wire == "bfloat16":
        cases = {
            0x3F808000: 0x3F80,  # 1 + 2^-8: tie, to even (down)
            0x3F818000: 0x3F82,  # tie, to even (up)
            0x3F808001: 0x3F81,  # just above the tie
            0x00008000: 0x0000,  # subnormal tie, to even (zero)
            0x00018000: 0x0002,  # subnormal tie, to even (up)
            0x007FFFFF: 0x0080,  # largest subnormal rounds to the smallest normal
            0x00000001: 0x0000,
            0x80000001: 0x8000,
            0x7F7F7FFF: 0x7F7F,  # rounds down to the largest finite bfloat16
            0x7F7F8000: 0x7F80,  # tie above the largest finite: to even = inf
            0x7F7FFFFF: 0x7F80,  # float32 max -> inf
            0xFF7FFFFF: 0xFF80,
            0x7F800000: 0x7F80,
            0xFF800000: 0xFF80,
            0x7F800001: 0x7FC0,  # signalling NaN -> the quiet NaN
            0xFFC00000: 0xFFC0,
            0x7FFFFFFF: 0x7FC0,
            0x80000000: 0x8000,
        }
    else:
        cases = {
            0x477FE000: 0x7BFF,  # 65504 = max finite
            0x477FEFFF: 0x7BFF,  # just below 65520: max finite
            0x477FF000: 0x7C00,  # 65520: the tie above max rounds to inf
            0x7F7FFFFF: 0x7C00,
            0xFF7FFFFF: 0xFC00,
            0x33800000: 0x0001,  # 2^-24: smallest subnormal
            0x33000000: 0x0000,  # 2^-25: tie, to even (zero)
            0x33C00000: 0x0002,  # 3 * 2^-25: tie, to even (up)
            0x33400000: 0x0001,  # 0.75 * 2^-24: rounds up to the smallest subnormal
            0x33000001: 0x0001,  # just above the tie
            0x38800000: 0x0400,  # 2^-14: smallest normal
            0x387FE000: 0x0400,  # tie between the largest subnormal and the smallest normal
            0x3F801000: 0x3C00,  # 1 + 2^-11: tie, to even (down)
            0x3F803000: 0x3C02,  # 1 + 3 * 2^-11: tie, to even (up)
            0x00000001: 0x0000,  # float32 subnormal -> 0
            0x80000001: 0x8000,
            0x7F800000: 0x7C00,
            0xFF800000: 0xFC00,
            0x80000000: 0x8000,
        }
    x = f32(list(cases))
    got = narrow(wire, x)
    want = np.array(list(cases.values()), np.uint16)
    np.testing.assert_array_equal(got, want, err_msg=f"inputs {[hex(c) for c in cases]}")
    assert_narrow_ok(wire, x, got)


@pytest.mark.parametrize("wire", list(WIRES))
def test_narrow_sizes_and_misalignment(isa, wire):  # noqa: F811
    rng = np.random.default_rng(1 if wire == "float16" else 2)
    for n in SIZES:
        raw = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)  # every exponent, NaNs
        scaled = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 20, size=n))).astype(np.float32)
        for values in (f32(raw), scaled):
            for in_off in (0, 1, 3):
                x = np.empty(n + in_off, np.float32)[in_off:]
                x[...] = values
                for out_off in (0, 1):
                    out = np.full(n + out_off + 1, 0xABCD, np.uint16)
                    got = out[out_off : out_off + n]
                    _core.kernels_narrow(wire, got, x)
                    assert_narrow_ok(wire, x, got)
                    assert out[-1] == 0xABCD and (out_off == 0 or out[0] == 0xABCD), "wrote out of bounds"


# ---------------------------------------------------------------------- widen
@pytest.mark.parametrize("wire", list(WIRES))
def test_widen_every_value_exact(isa, wire):  # noqa: F811
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for off in (0, 1, 5):
        src = np.empty(bits.size + off, np.uint16)[off:]
        src[...] = bits
        got = widen(wire, src, out_offset=(off % 2))
        want = bits.view(WIRES[wire]).astype(np.float32)
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
        np.testing.assert_array_equal(got.view(np.uint32)[nan] >> 31, want.view(np.uint32)[nan] >> 31)
        if wire == "bfloat16":  # a pure shift, NaN payloads included
            np.testing.assert_array_equal(got.view(np.uint32), bits.astype(np.uint32) << 16)


@pytest.mark.parametrize("wire", list(WIRES))
def test_widen_sizes_and_round_trip(isa, wire):  # noqa: F811
    rng = np.random.default_rng(3)
    for n in SIZES:
        x = (rng.standard_normal(n) * 100).astype(np.float32)
        w = narrow(wire, x)
        out = np.full(n + 2, -7.0, np.float32)
        _core.kernels_widen(wire, out[1 : n + 1], w)
        assert out[0] == -7.0 and out[-1] == -7.0, "wrote out of bounds"
        np.testing.assert_array_equal(out[1 : n + 1], x.astype(WIRES[wire]).astype(np.float32))


# ---------------------------------------------------------------------- every ISA, same bits
@pytest.mark.parametrize("wire", list(WIRES))
def test_all_isas_same_bits_nan_included(wire):
    x = boundary_values()
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    results = {}
    try:
        for name in available_isas():
            assert _core.kernels_set_isa(name)
            results[name] = (narrow(wire, x), widen(wire, bits).view(np.uint32))
    finally:
        _core.kernels_set_isa("auto")
    first = next(iter(results))
    for name, (n_bits, w_bits) in results.items():
        np.testing.assert_array_equal(n_bits, results[first][0], err_msg=f"narrow {name} vs {first}")
        np.testing.assert_array_equal(w_bits, results[first][1], err_msg=f"widen {name} vs {first}")


def test_argument_errors():
    x = np.ones(8, np.float32)
    for wire in ("float32", "int32", "float8"):
        with pytest.raises(ValueError):
            _core.kernels_narrow(wire, np.empty(8, np.uint16), x)
    with pytest.raises(ValueError):
        _core.kernels_narrow("bf16", np.empty(7, np.uint16), x)
    with pytest.raises(ValueError):
        _core.kernels_widen("fp16", np.empty(8, np.float32), np.empty(9, np.uint16))
    with pytest.raises(ValueError):
        _core.kernels_widen("float16", np.empty(3, np.uint8)[:3], np.empty(1, np.uint16))
    ro = np.empty(8, np.uint16)
    ro.setflags(write=False)
    with pytest.raises((ValueError, BufferError, TypeError)):
        _core.kernels_narrow("float16", ro, x)
    # Aliases of the dtype names work, and an empty conversion is fine.
    _core.kernels_narrow("half", np.empty(0, np.uint16), np.empty(0, np.float32))
    _core.kernels_widen("bf16", np.empty(0, np.float32), np.empty(0, np.uint16))


# ---------------------------------------------------------------------- compressed all-reduce
def compressed_allreduce_reference(inputs, wire, op="sum"):
    """The result of an all-reduce of float32 `inputs` (rank order) compressed to `wire` on the
    wire: each input rounded once to the wire type, summed in float32 in rank order (avg: then
    divided by the count in float32), rounded once to the wire type, widened back to float32.
    Every worker must get exactly these bits (NaN: any NaN)."""
    wt = WIRES[wire]
    with np.errstate(all="ignore"):
        acc = inputs[0].astype(wt).astype(np.float32)
        for x in inputs[1:]:
            acc = acc + x.astype(wt).astype(np.float32)
        if op == "avg":
            acc = acc / np.float32(len(inputs))
        return acc.astype(wt).astype(np.float32)


def assert_same_float32(got, want):
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("wire", list(WIRES))
def test_compressed_allreduce_definition(isa, wire, op):  # noqa: F811
    """narrow on every worker -> the reducer's 16-bit kernels_reduce -> widen == the reference."""
    rng = np.random.default_rng(5)
    big = 6e4 if wire == "float16" else 3e38
    for n in (1, 33, 1023, 50_001):
        for world in (1, 2, 3, 5):
            inputs = []
            for _ in range(world):
                x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 12, size=n))).astype(np.float32)
                if n > 8:
                    x[rng.integers(0, n, size=3)] = np.float32(big)  # sums overflow to inf
                    x[rng.integers(0, n, size=1)] = np.nan
                    x[rng.integers(0, n, size=2)] = np.float32(1e-41)  # float32 subnormal
                inputs.append(x)
            on_wire = [narrow(wire, x) for x in inputs]
            reduced = np.empty(n, np.uint16)
            _core.kernels_reduce(wire, op, on_wire, reduced)
            got = widen(wire, reduced)
            assert_same_float32(got, compressed_allreduce_reference(inputs, wire, op))


def test_reference_is_not_a_float32_all_reduce():
    """The definition rounds each input first: it differs from rounding a float32 sum once."""
    x = [np.array([1.0 + 0.4 * 2.0**-7], np.float32)] * 3  # each rounds down to 1.0 in bfloat16
    got = compressed_allreduce_reference(x, "bfloat16")
    assert got[0] == 3.0
    once = (x[0] + x[1] + x[2]).astype(ml_dtypes.bfloat16).astype(np.float32)  # 3 + 0.6 ulp: up
    assert once[0] == 3.0 + 2.0**-6
