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
Timings are reported, never asserted.
"""

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
    for name in ("scalar", "avx2", "avx512"):
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


# --------------------------------------------------------------------- report
def _ratio(case, base):
    if case in RESULTS and base in RESULTS:
        return f"{RESULTS[case] / RESULTS[base]:7.2f}x"
    return "      -"


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
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
