"""The pure helpers of benchmarks/bench_failover.py and the link bound it shares with the bench
(nothing timed here: the benchmark itself needs root and network namespaces)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import bench_failover as bf
from reducer.bench import report


def test_inputs_are_reproducible_and_differ_by_rank():
    a = bf.random_input(0, 1000)
    assert a.dtype == np.float32
    assert bf.count_bits_differ(a, bf.random_input(0, 1000)) == 0
    assert bf.count_bits_differ(a, bf.random_input(1, 1000)) > 900


@pytest.mark.parametrize("world", [2, 4, 7])
def test_a_float32_fold_is_within_the_float64_tolerance_and_a_wrong_value_is_not(world):
    n = 50_000
    ref, tol = bf.float64_reference(world, n)
    fold = bf.random_input(0, n)
    for r in range(1, world):
        fold = fold + bf.random_input(r, n)  # float32, rank order, as the reducers fold
    assert fold.dtype == np.float32
    assert bf.count_off(fold, ref, tol) == 0
    exact = np.stack([bf.random_input(r, n).astype(np.float64) for r in range(world)]).sum(0)
    np.testing.assert_array_equal(ref, exact)
    bad = fold.copy()
    bad[123] += 1e-3 * max(1.0, abs(float(bad[123])))  # far more than world x eps32 x sum|x|
    bad[4567] = bf.random_input(0, n)[4567]  # one rank's input instead of the sum
    assert bf.count_off(bad, ref, tol) == 2


def test_bits_differ_counts_elements_and_sees_negative_zero():
    a = np.array([0.0, 1.0, 2.0, np.nan], np.float32)
    b = a.copy()
    assert bf.count_bits_differ(a, b) == 0  # NaN: same bits, same value here
    b[0] = -0.0
    b[2] = np.nextafter(np.float32(2.0), np.float32(3.0))
    assert bf.count_bits_differ(a, b) == 2
    with pytest.raises(ValueError):
        bf.count_bits_differ(a, a.astype(np.float64))


def test_slowest_is_the_largest_median():
    assert bf.slowest([[1.0, 5.0, 2.0], [3.0, 3.0, 9.0], [0.5]]) == 3.0


def test_verdicts_against_the_issue_targets():
    v = bf.verdicts(normal_s=1.0, failover_s=1.6, following_s=1.05, bound_s=1.0)
    assert v["failover_ok"] and v["following_ok"]
    assert v["failover_ratio"] == pytest.approx(1.6) and v["following_ratio"] == pytest.approx(1.05)
    v = bf.verdicts(normal_s=1.0, failover_s=1.61, following_s=1.06, bound_s=1.0)
    assert not v["failover_ok"] and not v["following_ok"]


def test_rs_link_bound():
    gbps = 1.0
    rate = report.TCP_PAYLOAD_FRACTION * gbps * 1e9 / 8
    s = 64 << 20
    assert report.rs_bound_seconds(s, 4, 4, gbps) == pytest.approx(s / rate)
    assert report.rs_bound_seconds(s, 4, 3, gbps) == pytest.approx(s * 4 / 3 / rate)
    assert report.rs_bound_seconds(s, 2, 8, gbps) == pytest.approx(s / rate)  # R > W: a worker link is the limit
    assert report.rs_bound_seconds(s, 4, 2, gbps, wire=0.5) == pytest.approx(s / rate)
    assert report.link_seconds(rate, gbps) == pytest.approx(1.0)
