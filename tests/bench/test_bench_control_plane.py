"""`reduction-server bench --control-plane`: option parsing, the A/B pass order and report, and a
loopback run whose poller really reaches every reducer's GetStats and /metrics (no timing asserted)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np
import pytest
from paths import ROOT

from reducer.bench import control_ab, report
from reducer.bench.poller import merge_counts
from reducer.errors import ConfigError


def _parse(argv):
    from reducer.cli import bench

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return bench.config_from_args(p.parse_args(argv))


def test_cli_options_reach_the_config():
    cfg = _parse(["--control-plane", "ab", "--poll-interval-ms", "50", "--ab-passes", "3", "--sizes", "1M"])
    assert (cfg.control_plane, cfg.poll_interval, cfg.ab_passes) == ("ab", 0.05, 3)
    cfg = _parse([])
    assert (cfg.control_plane, cfg.poll_interval, cfg.ab_passes) == ("off", 0.1, 2)
    with pytest.raises(SystemExit):
        _parse(["--control-plane", "maybe"])


def test_pass_order_alternates_a_b_b_a():
    assert control_ab.pass_order(["rs", "ring"], "ab", 2) == ["rs", "rs+cp", "rs+cp", "rs", "ring"]
    assert control_ab.pass_order(["ring", "rs"], "ab", 3) == ["ring", "rs", "rs+cp", "rs+cp", "rs", "rs", "rs+cp"]
    assert control_ab.pass_order(["rs", "ring"], "on", 2) == ["rs", "ring"]
    assert control_ab.pass_order(["rs", "ring"], "off", 2) == ["rs", "ring"]


def test_which_reducers_run_the_control_plane():
    assert control_ab.with_control_plane("rs+cp", "ab")
    assert not control_ab.with_control_plane("rs", "ab")
    assert control_ab.with_control_plane("rs", "on") and control_ab.with_control_plane("rs+bf16", "on")
    assert not control_ab.with_control_plane("ring", "on")
    assert not control_ab.with_control_plane("rs", "off")


def test_rs_cp_measures_rs_with_the_same_settings():
    from reducer.bench.options import BenchConfig, wire_dtype

    assert control_ab.base_algo("rs+cp") == "rs" and control_ab.base_algo("ring") == "ring"
    cfg = BenchConfig(compression="bf16")
    assert wire_dtype("rs+cp", cfg) == wire_dtype("rs", cfg) == "bfloat16"
    assert wire_dtype("ring", cfg) is None


@pytest.mark.parametrize(
    "mode, algos, model, passes, interval, message",
    [
        ("ab", ["ring"], None, 2, 0.1, "include rs"),
        ("ab", ["rs"], "resnet50", 2, 0.1, "not with --model"),
        ("ab", ["rs"], None, 0, 0.1, "--ab-passes"),
        ("on", ["rs"], None, 2, 0.0, "--poll-interval-ms"),
        ("sometimes", ["rs"], None, 2, 0.1, "bad --control-plane"),
    ],
)
def test_check_refuses_what_cannot_run(mode, algos, model, passes, interval, message):
    with pytest.raises(ConfigError, match=message):
        control_ab.check(mode, algos, model, passes, interval)


def _row(algo, size, samples):
    return report.make_row(algo, size, size // 4, "float32", "sum", 2, 2, samples, 0, wall_s=1.0, cpu_percent=None)


def test_merge_passes_pools_each_ranks_samples():
    a1 = _row("rs", 1 << 20, [[10.0, 12.0, 11.0], [20.0, 21.0, 22.0]])
    a2 = _row("rs", 1 << 20, [[30.0, 31.0, 32.0], [1.0, 2.0, 3.0]])
    ring = _row("ring", 1 << 20, [[5.0], [6.0]])
    merged = report.merge_passes([a1, ring, a2])
    assert [r["algo"] for r in merged] == ["rs", "ring"]
    rs = merged[0]
    pooled = [[10.0, 12.0, 11.0, 30.0, 31.0, 32.0], [20.0, 21.0, 22.0, 1.0, 2.0, 3.0]]
    assert rs["samples_us"] == pooled
    assert rs["time_us"] == max(float(np.median(s)) for s in pooled)
    assert rs["pass_time_us"] == [a1["time_us"], a2["time_us"]] == [21.0, 31.0]
    assert rs["algbw"] == pytest.approx((1 << 20) / (rs["time_us"] * 1e-6) / 1e9)
    assert rs["wall_s"] == 2.0
    assert merged[1]["pass_time_us"] == [6.0] and merged[1]["samples_us"] == [[5.0], [6.0]]
    # per-iteration variance over the pooled iterations (slowest rank per iteration), not one pass's
    slowest = np.max(np.array(pooled), axis=0)
    st = rs["iter_us"]
    assert st["median"] == float(np.median(slowest)) and st["max"] == 32.0 and st["min"] == 20.0
    assert (st["p10"], st["p90"]) == (
        pytest.approx(float(np.percentile(slowest, 10))),
        pytest.approx(float(np.percentile(slowest, 90))),
    )


def test_ab_table_gives_on_over_off_per_size_and_the_spread():
    rows = []
    for size, off, on in ((1 << 20, 1000.0, 1010.0), (4 << 20, 4000.0, 3960.0), (64 << 10, 100.0, 300.0)):
        r_off = _row("rs", size, [[off], [off]])
        r_off["pass_time_us"] = [off, off * 1.02]
        r_on = _row("rs+cp", size, [[on], [on]])
        r_on["pass_time_us"] = [on]
        rows += [r_off, r_on]
    rows[-1]["polls"] = {
        "get_stats": 40,
        "scrapes": 40,
        "errors": 0,
        "late": 0,
        "rounds_seen": 7,
        "metrics_bytes": 123456,
        "seconds": 2.0,
        "cpu_s": 0.1,
        "first_error": "",
    }
    res = control_ab.ratios(rows)
    assert res["per_size"] == {64 << 10: 3.0, 1 << 20: pytest.approx(1.01), 4 << 20: pytest.approx(0.99)}
    assert res["geomean_sizes"] == 2  # below 1 MiB is left out of the mean
    assert res["geomean"] == pytest.approx((1.01 * 0.99) ** 0.5)
    text = control_ab.format_table(rows, 0.1, {"rs": 40.0, "rs+cp": 42.0}, {"rs": 10.0, "rs+cp": 10.4}, 2)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith(str(1 << 20)))
    assert line.split()[1:] == ["1000.0", "1010.0", "1.010", "2.0%", "-"]
    assert "40 GetStats and 40 /metrics scrapes" in text and "saw 7 rounds" in text and "rs 40%, rs+cp 42%" in text
    # 0.4 s more reducer CPU per pass for (40 + 40) / 2 passes = 40 requests per pass: 10 ms each
    assert control_ab.cpu_per_request_ms({"rs": 10.0, "rs+cp": 10.4}, rows[-1]["polls"], 2) == pytest.approx(10.0)
    assert "off 10.0 s, on 10.4 s: 10.00 ms per GetStats or scrape" in text
    assert control_ab.cpu_per_request_ms({"rs": 10.0}, rows[-1]["polls"], 2) is None


def test_merge_counts_sums_and_keeps_the_first_error():
    a = {"get_stats": 3, "scrapes": 3, "errors": 0, "rounds_seen": 5, "seconds": 1.5, "first_error": ""}
    b = {"get_stats": 4, "scrapes": 2, "errors": 2, "rounds_seen": 9, "seconds": 1.0, "first_error": "GET x: boom"}
    assert merge_counts([a, b]) == {
        "get_stats": 7,
        "scrapes": 5,
        "errors": 2,
        "rounds_seen": 9,
        "seconds": 2.5,
        "first_error": "GET x: boom",
    }


def test_loopback_ab_run_polls_every_reducer(tmp_path):
    pytest.importorskip("grpc")
    pytest.importorskip("prometheus_client")
    jp = tmp_path / "cp.json"
    cmd = [
        sys.executable,
        "-m",
        "reducer.cli.main",
        "bench",
        "--no-progress",
        "--workers",
        "2",
        "--reducers",
        "2",
        "--sizes",
        "64K,1M",
        "--iters",
        "3",
        "--iters-bytes",
        "0",
        "--warmup",
        "1",
        "--warmup-bytes",
        "0",
        "--algos",
        "rs",
        "--control-plane",
        "ab",
        "--poll-interval-ms",
        "20",
        "--json",
        str(jp),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "# Control plane A/B" in res.stdout and "# rs+cp: " in res.stdout
    rows = json.load(open(jp))
    assert sorted((r["algo"], r["size"]) for r in rows) == [
        ("rs", 65536),
        ("rs", 1 << 20),
        ("rs+cp", 65536),
        ("rs+cp", 1 << 20),
    ]
    for r in rows:
        assert r["wrong"] == 0
        assert len(r["pass_time_us"]) == 2  # A B B A: two passes of each variant
        assert all(len(s) == 2 * 3 for s in r["samples_us"])  # both passes' timed iterations
    for r in rows:
        assert r["reducer_cpu_s"] >= 0  # CPU seconds in 10 ms ticks: a short pass may show none
    for r in (r for r in rows if r["algo"] == "rs"):
        assert r["control_plane"] == "off" and "polls" not in r
    for r in (r for r in rows if r["algo"] == "rs+cp"):
        polls = r["polls"]
        assert r["control_plane"] == "on"
        assert polls["errors"] == 0, polls["first_error"]
        # at least a first and a last cycle in each of the 2 passes, each cycle reaching both reducers
        assert polls["get_stats"] >= 2 * 2 * 2 and polls["scrapes"] >= 2 * 2 * 2
        assert polls["get_stats"] == polls["scrapes"] == 2 * polls["cycles"]
        assert polls["rounds_seen"] > 0  # GetStats reported the reducers' real rounds
        assert polls["metrics_bytes"] > 0
