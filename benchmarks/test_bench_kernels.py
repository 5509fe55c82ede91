"""Throughput of the reduction kernels against a memory-copy ceiling, numpy and torch.

    python -m pytest benchmarks/test_bench_kernels.py --benchmark-only -q -s

Every case processes one 64 MiB contribution (the INPUT bytes; GB/s = 1e9 bytes/s):
  copy         np.copyto(dst, src) of 64 MiB: the memory-copy ceiling
  kernel/*     _core.kernels_accumulate(dtype, op, acc, x): acc op= x, acc in the
               accumulator type (float32 for float16/bfloat16, so it moves 2x the bytes of x)
  numpy/*      np.add(a, b, out=a) in the dtype
  torch/*      a.add_(b) in the dtype, torch.set_num_threads(1) like the kernels (skipped without torch);
               torch/<16-bit>+acc32 is acc32.add_(x16): the kernels' semantics and bytes moved
The table at the end gives GB/s and the ratios to the baselines measured in the same run.
Targets: float32 sum >= 0.9 x copy; float16/bfloat16 sum >= 5 x numpy float16 add.

Conversions (the compressed all-reduce's client side), 16 Mi elements (64 MiB of float32: a whole
buffer, memory-bound), 256 Ki and 64 Ki elements (1 MiB and 256 KiB of float32: chunk sizes, in
cache), GB/s of INPUT bytes (narrow reads float32, widen reads 16-bit):
  convert/narrow|widen/<wire>/<isa>/<size>   _core.kernels_narrow / kernels_widen
  astype/narrow|widen/<wire>/<size>          np.copyto(dst, src, casting="unsafe"): numpy's
                                             float16 cast and ml_dtypes' bfloat16 cast, the same
                                             code as astype without allocating the result
Target: >= 8 GB/s per core for both wire types and both directions.
Timings are reported, never asserted.
"""

import os

import ml_dtypes
import numpy as np
import pytest

from reducer import _core

try:
    import torch
except ImportError:  # optional baseline
    torch = None

NBYTES = 64 << 20
ROUNDS = 12
RESULTS = {}  # case -> GB/s of input bytes (median)


def _isas():
    out = []
    for name in ("scalar", "avx2", "avx512", "avx512bf16"):
        if _core.kernels_set_isa(name):
            out.append(name)
    _core.kernels_set_isa("auto")
    return out


ISAS = _isas()
BEST = ISAS[-1]


def run(benchmark, case, fn, rounds=ROUNDS):
    benchmark.group = "kernels"
    benchmark.extra_info["GB/s"] = None
    benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=1)
    gbs = NBYTES / benchmark.stats.stats.median / 1e9
    benchmark.extra_info["GB/s"] = round(gbs, 2)
    RESULTS[case] = gbs


def arrays(dtype, acc_dtype=None):
    n = NBYTES // np.dtype(dtype).itemsize
    rng = np.random.default_rng(0)
    x = (rng.random(n, dtype=np.float32) + 0.5).astype(dtype)  # normal numbers: no denormal stalls
    acc = np.ones(n, acc_dtype or dtype)
    return acc, x


def bits(a):
    return a.view(np.uint16) if a.dtype == np.dtype(ml_dtypes.bfloat16) else a


# --------------------------------------------------------------------- baselines
def test_copy(benchmark):
    dst, src = arrays(np.float32)
    run(benchmark, "copy", lambda: np.copyto(dst, src))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_numpy_add(benchmark, dtype):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    a, b = arrays(dt)
    rounds = ROUNDS if dtype == "float32" else 3  # numpy float16/bfloat16 are slow
    run(benchmark, f"numpy/{dtype}", lambda: np.add(a, b, out=a), rounds)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_add(benchmark, dtype):
    if torch is None:
        pytest.skip("torch not installed")
    torch.set_num_threads(1)
    dt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    n = NBYTES // torch.tensor([], dtype=dt).element_size()
    a = torch.ones(n, dtype=dt)
    b = torch.rand(n, dtype=torch.float32).add_(0.5).to(dt)
    run(benchmark, f"torch/{dtype}", lambda: a.add_(b))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_add_into_float32(benchmark, dtype):
    """The kernels' own semantics in torch: float32 accumulator += float16/bfloat16 input."""
    if torch is None:
        pytest.skip("torch not installed")
    torch.set_num_threads(1)
    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    n = NBYTES // 2
    acc = torch.ones(n, dtype=torch.float32)
    b = torch.rand(n, dtype=torch.float32).add_(0.5).to(dt)
    run(benchmark, f"torch/{dtype}+acc32", lambda: acc.add_(b))


# --------------------------------------------------------------------- kernels
KERNEL_CASES = [
    ("float32", "sum"),
    ("float32", "max"),
    ("float64", "sum"),
    ("int32", "sum"),
    ("float16", "sum"),
    ("bfloat16", "sum"),
    ("float16", "max"),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype,op", KERNEL_CASES)
def test_kernel_accumulate(benchmark, dtype, op, isa):
    if isa != BEST and op != "sum":
        pytest.skip("lower ISAs: sum only")
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    acc_dt = np.float32 if dtype in ("float16", "bfloat16") else dt
    acc, x = arrays(dt, acc_dt)
    xb = bits(x)
    assert _core.kernels_set_isa(isa)
    try:
        run(benchmark, f"kernel/{dtype}/{op}/{isa}", lambda: _core.kernels_accumulate(dtype, op, acc, xb))
    finally:
        _core.kernels_set_isa("auto")


# --------------------------------------------------------------------- conversions
CONV = {}  # case -> GB/s of input bytes (median)
CONV_BEST = {}  # case -> GB/s of the fastest round (less sensitive to other load on the machine)
WIRE_DTYPES = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
CONV_ELEMS = {"64MiB": 16 << 20, "1MiB": 256 << 10, "256KiB": 64 << 10}  # named by their float32 bytes


def run_conv(benchmark, case, fn, in_bytes, rounds):
    benchmark.group = "convert"
    benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=1)
    gbs = in_bytes / benchmark.stats.stats.median / 1e9
    benchmark.extra_info["GB/s"] = round(gbs, 2)
    CONV[case] = gbs
    CONV_BEST[case] = in_bytes / benchmark.stats.stats.min / 1e9


def conv_arrays(n):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(n) * 100).astype(np.float32)  # normal numbers, both signs
    return x, np.empty(n, np.uint16), np.empty(n, np.float32)


def _repeat(fn, n):
    """Run a 1 MiB conversion often enough per timing that the timer's resolution does not matter."""
    reps = max(1, (16 << 20) // n)

    def many():
        for _ in range(reps):
            fn()

    return many, reps


@pytest.mark.parametrize("size", list(CONV_ELEMS))
@pytest.mark.parametrize("direction", ["narrow", "widen"])
@pytest.mark.parametrize("wire", list(WIRE_DTYPES))
def test_astype_baseline(benchmark, wire, direction, size):
    n = CONV_ELEMS[size]
    x, w16, f = conv_arrays(n)
    wt = WIRE_DTYPES[wire]
    if direction == "narrow":
        dst, src = w16.view(wt), x
    else:
        w16.view(wt)[...] = x
        dst, src = f, w16.view(wt)
    fn, reps = _repeat(lambda: np.copyto(dst, src, casting="unsafe"), n)
    run_conv(benchmark, f"astype/{direction}/{wire}/{size}", fn, reps * src.nbytes, rounds=3)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("size", list(CONV_ELEMS))
@pytest.mark.parametrize("direction", ["narrow", "widen"])
@pytest.mark.parametrize("wire", list(WIRE_DTYPES))
def test_kernel_convert(benchmark, wire, direction, size, isa):
    n = CONV_ELEMS[size]
    x, w16, f = conv_arrays(n)
    _core.kernels_narrow(wire, w16, x)
    if direction == "narrow":
        one, in_bytes = (lambda: _core.kernels_narrow(wire, w16, x)), x.nbytes
    else:
        one, in_bytes = (lambda: _core.kernels_widen(wire, f, w16)), w16.nbytes
    fn, reps = _repeat(one, n)
    assert _core.kernels_set_isa(isa)
    try:
        run_conv(benchmark, f"convert/{direction}/{wire}/{isa}/{size}", fn, reps * in_bytes, rounds=ROUNDS)
    finally:
        _core.kernels_set_isa("auto")


def conversion_report():
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    lines = [
        "",
        f"conversions, GB/s of input bytes, 1 thread (best ISA here: {BEST}); target >= 8; load average {load}",
        "(GB/s: median round; best: fastest round; /copy: to the 64 MiB np.copyto of the same run,",
        " the memory ceiling of the 64 MiB cases)",
        f"{'case':40s} {'GB/s':>8s} {'best':>8s} {'/astype':>8s} {'/copy':>8s}",
    ]
    for case, gbs in CONV.items():
        parts = case.split("/")
        base = f"astype/{parts[1]}/{parts[2]}/{parts[-1]}"
        ratio = f"{gbs / CONV[base]:7.2f}x" if case.startswith("convert/") and base in CONV else "      -"
        copy = f"{gbs / RESULTS['copy']:7.2f}x" if "copy" in RESULTS and parts[-1] == "64MiB" else "      -"
        lines.append(f"{case:40s} {gbs:8.2f} {CONV_BEST[case]:8.2f} {ratio} {copy}")
    lines.append("targets:")
    for wire in WIRE_DTYPES:
        for direction in ("narrow", "widen"):
            for size in CONV_ELEMS:
                case = f"convert/{direction}/{wire}/{BEST}/{size}"
                if case in CONV:
                    verdict = "met" if CONV[case] >= 8 else "MISSED"
                    lines.append(
                        f"  {case} = {CONV[case]:.2f} GB/s, best {CONV_BEST[case]:.2f} (target >= 8): {verdict}"
                    )
    return lines


# --------------------------------------------------------------------- report
def _ratio(case, base):
    if case in RESULTS and base in RESULTS:
        return f"{RESULTS[case] / RESULTS[base]:7.2f}x"
    return "      -"


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if CONV:
        print("\n".join(conversion_report()))
    if not RESULTS:
        return
    lines = [
        "",
        f"kernels throughput, GB/s of input bytes (64 MiB per call, best ISA here: {BEST})",
        f"{'case':32s} {'GB/s':>8s} {'/copy':>8s} {'/np f16':>8s} {'/torch':>8s} {'/t acc32':>8s}",
    ]
    for case, gbs in RESULTS.items():
        parts = case.split("/")
        torch_base = f"torch/{parts[1].split('+')[0]}" if len(parts) > 1 else ""
        lines.append(
            f"{case:32s} {gbs:8.2f} {_ratio(case, 'copy')} {_ratio(case, 'numpy/float16')} {_ratio(case, torch_base)}"
            f" {_ratio(case, torch_base.split('+')[0] + '+acc32')}"
        )

    def verdict(case, base, need):
        if case not in RESULTS or base not in RESULTS:
            return f"  {case} vs {base}: not measured"
        r = RESULTS[case] / RESULTS[base]
        return f"  {case} / {base} = {r:.2f} (target >= {need}): {'met' if r >= need else 'MISSED'}"

    lines.append("targets:")
    lines.append(verdict(f"kernel/float32/sum/{BEST}", "copy", 0.9))
    lines.append(verdict(f"kernel/float16/sum/{BEST}", "numpy/float16", 5))
    lines.append(verdict(f"kernel/bfloat16/sum/{BEST}", "numpy/float16", 5))
    print("\n".join(lines))
