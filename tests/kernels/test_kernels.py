"""Reduction kernels (csrc/kernels) against numpy references, on every ISA this CPU has.

The reference reduces in rank order: float32/float64 in their own dtype (the kernels
must be bit-identical), float16/bfloat16 in float32 then ONE rounding (numpy
astype / ml_dtypes), integers with numpy's wrapping arithmetic and truncating avg.
"""

import zlib

import ml_dtypes
import numpy as np
import pytest

from reducer import _core

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "float16": np.dtype(np.float16),
    "bfloat16": BF16,
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
}
FLOATS = ("float32", "float64", "float16", "bfloat16")
OPS = ("sum", "avg", "min", "max")
ISAS = ("scalar", "avx2", "avx512", "avx512bf16")
SIZES = (0, 1, 7, 31, 33, 1023, 100_003)


@pytest.fixture(params=ISAS)
def isa(request):
    if not _core.kernels_set_isa(request.param):
        pytest.skip(f"CPU lacks {request.param}")
    assert _core.kernels_isa() == request.param
    yield request.param
    assert _core.kernels_set_isa("auto")


def available_isas():
    out = []
    try:
        for name in ISAS:
            if _core.kernels_set_isa(name):
                out.append(name)
    finally:
        _core.kernels_set_isa("auto")
    return out


# ----------------------------------------------------------------- references
def acc_dtype(dt):
    return np.dtype(np.float32) if dt in (np.dtype(np.float16), BF16) else dt


def reference(dtype, op, inputs):
    dt = DTYPES[dtype]
    adt = acc_dtype(dt)
    with np.errstate(all="ignore"):
        acc = inputs[0].astype(adt)
        for x in inputs[1:]:
            x = x.astype(adt)
            if op in ("sum", "avg"):
                acc = np.add(acc, x)  # integer add wraps like the kernels
            elif op == "min":
                acc = np.minimum(acc, x)
            else:
                acc = np.maximum(acc, x)
        if op == "avg":
            c = len(inputs)
            if dt.kind == "f" or dt == BF16:
                acc = acc / adt.type(c)
            else:  # C++ truncating division of the wrapped sum
                q = acc // c
                q[(acc % c != 0) & (acc < 0)] += 1
                acc = q
        return acc.astype(dt)


def assert_same(dtype, op, got, want):
    dt = DTYPES[dtype]
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype not in FLOATS:
        np.testing.assert_array_equal(got, want)
        return
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    gn, wn = np.isnan(g), np.isnan(w)
    assert np.array_equal(gn, wn), f"NaN mismatch at {np.flatnonzero(gn != wn)[:10]}"
    if op in ("min", "max"):  # value equality: numpy's own sign of min(-0., 0.) varies by code path
        bad = np.flatnonzero(~gn & (g != w))
    else:  # bit-identical
        ui = np.dtype(f"u{dt.itemsize}")
        bad = np.flatnonzero(~gn & (got.view(ui) != want.view(ui)))
    assert bad.size == 0, f"{bad.size} mismatches, first at {bad[:5]}: got {got[bad[:5]]} want {want[bad[:5]]}"


def bits_canon_nan(a):
    """Raw bits, with every NaN replaced by one pattern (payloads are not specified)."""
    dt = a.dtype
    u = a.view(np.dtype(f"u{dt.itemsize}")).copy()
    if dt.kind == "f" or dt == BF16:
        u[np.isnan(a.astype(np.float64))] = np.iinfo(u.dtype).max
    return u


# ----------------------------------------------------------------- data
def make_inputs(rng, dtype, n, k, specials=True, misalign=True):
    """k arrays of n elements; odd-numbered ones start one element off alignment."""
    dt = DTYPES[dtype]
    out = []
    for r in range(k):
        if dt.kind == "i":
            info = np.iinfo(dt)
            if r % 2:
                v = rng.integers(info.min, info.max, size=n, dtype=dt, endpoint=True)  # wraps
            else:
                v = rng.integers(-1000, 1000, size=n, dtype=dt)
            if n and specials:
                v[rng.integers(0, n, size=max(1, n // 50))] = info.min
                v[rng.integers(0, n, size=max(1, n // 50))] = info.max
        else:
            scale = {"float16": 100.0, "bfloat16": 1e4, "float32": 1e6, "float64": 1e12}[dtype]
            v = rng.standard_normal(n) * scale * np.exp2(rng.integers(-8, 8, size=n))
            if n and specials:
                big = {"float16": 6e4, "bfloat16": 3e38, "float32": 3e38, "float64": 1.7e308}[dtype]
                m = max(1, n // 64)
                v[rng.integers(0, n, size=m)] = big  # overflows to inf when summed
                v[rng.integers(0, n, size=m)] = -big
                v[rng.integers(0, n, size=m)] = np.nan
                v[rng.integers(0, n, size=m)] = np.inf
                v[rng.integers(0, n, size=m)] = -np.inf
                v[rng.integers(0, n, size=m)] = -0.0
            with np.errstate(all="ignore"):
                v = v.astype(dt)
        if misalign and r % 2:
            buf = np.empty(n + 1, dt)[1:]
            buf[...] = v
            v = buf
        out.append(v)
    return out


def buf(a):
    """numpy cannot export bfloat16 through the buffer protocol: pass its bits."""
    return a.view(np.uint16) if a.dtype == BF16 else a


def run_reduce(dtype, op, inputs, misalign_out=False):
    n = inputs[0].size
    out = np.empty(n + 1, DTYPES[dtype])[1:] if misalign_out else np.empty(n, DTYPES[dtype])
    _core.kernels_reduce(dtype, op, [buf(x) for x in inputs], buf(out))
    return out


# ----------------------------------------------------------------- tests
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_reduce_matches_reference(isa, dtype, op):
    rng = np.random.default_rng(zlib.crc32(f"{dtype}/{op}".encode()))
    for n in SIZES:
        for k in range(1, 6):
            inputs = make_inputs(rng, dtype, n, k, specials=(k % 2 == 0))
            got = run_reduce(dtype, op, inputs, misalign_out=(k == 3))
            assert_same(dtype, op, got, reference(dtype, op, inputs))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_isas_bit_identical(dtype, op):
    isas = available_isas()
    rng = np.random.default_rng(7)
    for n in (33, 1023, 100_003):
        inputs = make_inputs(rng, dtype, n, 4)
        results = {}
        try:
            for name in isas:
                assert _core.kernels_set_isa(name)
                results[name] = bits_canon_nan(run_reduce(dtype, op, inputs))
        finally:
            _core.kernels_set_isa("auto")
        for name in isas[1:]:
            np.testing.assert_array_equal(results[name], results[isas[0]], err_msg=f"{name} vs {isas[0]}")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_accumulate_unaligned_acc(isa, dtype, op):
    """kernels_accumulate on an accumulator that is not vector-aligned."""
    rng = np.random.default_rng(11)
    dt = DTYPES[dtype]
    adt = acc_dtype(dt)
    for n in (1, 17, 1023, 4099):
        a, x = make_inputs(rng, dtype, n, 2, misalign=False)
        for off in (0, 1, 3):
            acc = np.empty(n + off, adt)[off:]
            acc[...] = a.astype(adt)
            _core.kernels_accumulate(dtype, op, acc, buf(x))
            with np.errstate(all="ignore"):
                xa = x.astype(adt)
                want = {"sum": np.add, "avg": np.add, "min": np.minimum, "max": np.maximum}[op](a.astype(adt), xa)
            same = acc.view(f"u{adt.itemsize}") == want.view(f"u{adt.itemsize}")
            if adt.kind == "f":
                same |= np.isnan(acc) & np.isnan(want)
                if op in ("min", "max"):
                    same |= acc == want
            assert same.all(), (n, off, np.flatnonzero(~same)[:5])


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_specials(isa, dtype):
    dt = DTYPES[dtype]
    nan, inf = np.nan, np.inf
    a = [1.0, nan, 1.0, inf, inf, -inf, nan, -0.0, -0.0, 0.0, 2.0, -3.0, inf, nan, 5.0, 0.5, 7.0]
    b = [nan, 1.0, inf, -inf, inf, 1.0, nan, -0.0, 0.0, -0.0, -2.0, 3.0, nan, inf, -5.0, 0.25, 8.0]
    xs = [np.array(a, dt), np.array(b, dt)]
    for op in OPS:
        got = run_reduce(dtype, op, xs)
        assert_same(dtype, op, got, reference(dtype, op, xs))
        nan_at = [0, 1, 3, 6, 12, 13] if op in ("sum", "avg") else [0, 1, 6, 12, 13]
        assert np.isnan(got.astype(np.float64)[nan_at]).all()
    # sums of -0.0: bit-exact sign
    z = run_reduce(dtype, "sum", [np.array([-0.0], dt), np.array([-0.0], dt)])
    assert np.signbit(z.astype(np.float64))[0]


@pytest.mark.parametrize("dtype", FLOATS)
def test_overflow_to_inf(isa, dtype):
    dt = DTYPES[dtype]
    big = float((ml_dtypes.finfo if dt == BF16 else np.finfo)(dt).max)
    x = np.full(40, big, dt)
    got = run_reduce(dtype, "sum", [x, x]).astype(np.float64)
    assert np.isposinf(got).all()
    got = run_reduce(dtype, "sum", [-x, -x]).astype(np.float64)
    assert np.isneginf(got).all()
    # avg of two max values: the float32 accumulator of float16/bfloat16 does not overflow
    got = run_reduce(dtype, "avg", [x, x]).astype(np.float64)
    if dtype in ("float16",):
        assert (got == big).all()
    else:
        assert np.isposinf(got).all()


def test_half_rounding_is_single_and_nearest_even(isa):
    # float16: 2048 + 1 (tie) -> 2048 (even); 2048 + 1 + 1 accumulated in float32 = 2050 exactly.
    f = np.float16
    one = np.ones(37, f)
    assert (run_reduce("float16", "sum", [np.full(37, 2048, f), one]) == 2048).all()
    assert (run_reduce("float16", "sum", [np.full(37, 2048, f), one, one]) == 2050).all()
    assert (run_reduce("float16", "sum", [np.full(37, 2050, f), one]) == 2052).all()  # tie -> even
    # 65504 + 16 = 65520 is the first value that rounds to inf
    assert np.isposinf(
        run_reduce("float16", "sum", [np.full(37, 65504, f), np.full(37, 16, f)]).astype(np.float32)
    ).all()
    assert (run_reduce("float16", "sum", [np.full(37, 65504, f), np.full(37, 8, f)]) == 65504).all()
    # bfloat16: 256 + 1 is a tie -> 256; 257 + 1 exactly 258 -> kept
    b = ml_dtypes.bfloat16
    ob = np.ones(37, b)
    assert (run_reduce("bfloat16", "sum", [np.full(37, 256, b), ob]).astype(np.float32) == 256).all()
    assert (run_reduce("bfloat16", "sum", [np.full(37, 256, b), ob, ob]).astype(np.float32) == 258).all()
    # subnormals survive the round trip
    tiny16 = np.full(37, np.finfo(np.float16).smallest_subnormal, f)
    assert (run_reduce("float16", "sum", [tiny16, tiny16]) == 2 * tiny16).all()
    tinyb = np.full(37, ml_dtypes.finfo(b).smallest_subnormal, b)
    assert (run_reduce("bfloat16", "sum", [tinyb, tinyb]).astype(np.float32) == 2 * tinyb.astype(np.float32)).all()


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_int_avg_truncates_toward_zero(isa, dtype):
    dt = DTYPES[dtype]
    info = np.iinfo(dt)
    a = np.array([-7, 7, -1, 1, -5, 5, 0, -6, 6, info.min, info.max, info.min, -3] * 5, dt)
    b = np.array([0, 0, 0, 0, -1, 1, -1, 0, 0, 0, 0, info.min, 0] * 5, dt)
    got = run_reduce(dtype, "avg", [a, b])
    want = np.array([-3, 3, 0, 0, -3, 3, 0, -3, 3, info.min // 2, info.max // 2, 0, -1] * 5, dt)
    np.testing.assert_array_equal(got, want)  # info.min + info.min wraps to 0


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float16"])
def test_avg_many_contributors(isa, dtype):
    rng = np.random.default_rng(3)
    for k in (6, 7, 13, 32, 37):
        inputs = make_inputs(rng, dtype, 67, k, specials=False)
        assert_same(dtype, "avg", run_reduce(dtype, "avg", inputs), reference(dtype, "avg", inputs))


def test_int64_avg_exact_division():
    """The int64 average divides by multiplication: check it on extreme values."""
    info = np.iinfo(np.int64)
    vals = np.array(
        [info.min, info.max, info.min + 1, info.max - 1, -1, 1, 0, 2**62, -(2**62), 3 * 2**61 + 12345], np.int64
    )
    for k in (2, 3, 5, 7, 9):
        xs = [vals] + [np.zeros_like(vals)] * (k - 1)
        got = run_reduce("int64", "avg", xs)
        want = np.array([(abs(int(v)) // k) * (1 if v >= 0 else -1) for v in vals], np.int64)
        np.testing.assert_array_equal(got, want)


def test_dtype_aliases_and_errors():
    x = np.arange(10, dtype=np.float32)
    canonical = {
        "float32": ("f32", "fp32", "float"),
        "float64": ("f64", "double"),
        "float16": ("fp16", "f16", "half"),
        "bfloat16": ("bf16",),
        "int32": ("i32", "int"),
        "int64": ("i64", "long"),
    }
    for name, aliases in canonical.items():
        dt = DTYPES[name]
        xs = [np.arange(10).astype(dt)] * 2
        want = run_reduce(name, "sum", xs)
        for alias in aliases:
            out = np.empty(10, dt)
            _core.kernels_reduce(alias, "sum", [buf(x) for x in xs], buf(out))
            np.testing.assert_array_equal(out.view(f"u{dt.itemsize}"), want.view(f"u{dt.itemsize}"))
    with pytest.raises(ValueError):
        _core.kernels_reduce("float8", "sum", [x], np.empty_like(x))
    with pytest.raises(ValueError):
        _core.kernels_reduce("float32", "prod", [x], np.empty_like(x))
    with pytest.raises(ValueError):
        _core.kernels_reduce("float32", "sum", [x[:5]], np.empty_like(x))


def test_isa_selection():
    assert _core.kernels_set_isa("auto")
    best = _core.kernels_isa()
    assert best in ISAS
    assert _core.kernels_set_isa("scalar") and _core.kernels_isa() == "scalar"
    assert not _core.kernels_set_isa("sse9")
    assert _core.kernels_isa() == "scalar"
    assert _core.kernels_set_isa("auto") and _core.kernels_isa() == best
    assert available_isas()[-1] == best
