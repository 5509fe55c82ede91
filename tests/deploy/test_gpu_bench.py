"""The GPU check's benchmark phase (--bench; reducer.gpucheck.bench / bench_report) on a machine
without a GPU: its arguments, the iteration plan, nccl-tests' bandwidth math, the rows / table /
verdict / limits from synthetic worker results and NCCL logs, and the three variants' phases end
to end with the worker's bench loop over gloo on the CPU (real reducers, real launcher)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from paths import ROOT

from reducer.gpucheck import bench
from reducer.gpucheck import bench_report as B
from reducer.gpucheck.main import parse_args
from reducer.gpucheck.nccl_log import parse_lines

MiB = 1 << 20


def test_arguments() -> None:
    args = parse_args(["--bench"])
    assert args.bench and bench.parse_sizes(args.bench_sizes) == [MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1 << 30]
    assert (args.bench_iters, args.bench_warmup, args.bench_reducers, args.bench_reducer_threads) == (20, 5, 2, 4)
    assert args.worker_device == "cuda" and not parse_args([]).bench
    for bad in ("", "1,x", "0", "4096,-8"):
        with pytest.raises(SystemExit):
            parse_args(["--bench", "--bench-sizes", bad])
    plan = type("P", (), {"plugin_env": {"NCCL_NET_PLUGIN": "/p.so"}, "plain_env": {"NCCL_NET_PLUGIN": "none"}})()
    got = bench.variants(plan, parse_args(["--bench"]))
    assert [(n, r) for n, _, r in got] == [("collnet", 2), ("socket", 1), ("plugin-p2p", 1)]
    envs = {n: e for n, e, _ in got}
    assert envs["collnet"]["NCCL_COLLNET_ENABLE"] == "1" and envs["plugin-p2p"]["NCCL_COLLNET_ENABLE"] == "0"
    assert envs["socket"] == {"NCCL_NET_PLUGIN": "none", "NCCL_NET": "Socket"}
    with pytest.raises(ValueError, match="unknown ring"):
        bench.variants(plan, parse_args(["--bench", "--bench-variants", "collnet,ring"]))


def test_iteration_plan_and_bandwidths() -> None:
    two_gib = 2 << 30
    assert B.iteration_plan(1 << 30, 5, 20, two_gib) == (1, 3)  # at least 3 timed calls
    assert B.iteration_plan(256 * MiB, 5, 20, two_gib) == (2, 8)
    assert B.iteration_plan(64 * MiB, 5, 20, two_gib) == (5, 20)  # capped by --bench-iters/--bench-warmup
    assert B.iteration_plan(MiB, 0, 2, two_gib) == (0, 2)
    assert B.bus_factor(2) == 1.0 and B.bus_factor(4) == 1.5 and B.bus_factor(8) == 1.75
    alg, bus = B.bandwidths(1_000_000_000, 0.5, 4)
    assert (alg, bus) == (2.0, 3.0)
    assert B.bandwidths(10, 0.0, 2) == (0.0, 0.0)


def _ranks(sizes_times: dict[int, tuple[float, list[float]]], wrong: int = 0, skip: int = 0) -> list[dict]:
    """Two ranks' result files: rank 1 a little slower than rank 0."""
    out = []
    for rank in (0, 1):
        rows: list[dict] = []
        for size, (first, times) in sizes_times.items():
            if size == skip:
                rows.append({"bytes": size, "skipped": "over 1/8 of the GPU's memory"})
                continue
            k = 1.0 + 0.1 * rank
            rows.append(
                {
                    "bytes": size,
                    "first_seconds": first,
                    "warmup": 1,
                    "times": [t * k for t in times],
                    "loop_seconds": times[0],
                    "wrong": wrong if rank == 1 else 0,
                }
            )
        out.append({"rank": rank, "bench": rows})
    return out


def _log(algo: str, sizes: list[int], network: str):
    pre = "h:1:1 [0] NCCL INFO"
    text = [f"{pre} Using network {network}\n"]
    for s in sizes:
        text += [f"{pre} AllReduce: {s} Bytes -> Algo {algo} proto SIMPLE channel{{Lo..Hi}}={{0..1}}\n"] * 3
    text.append(f"{pre} AllReduce: {sizes[0]} Bytes -> Algo RING proto LL channel{{Lo..Hi}}={{0..0}}\n")
    return parse_lines(text)


SIZES = [MiB, 64 * MiB, 256 * MiB]


def _rows(collnet_256: float, p2p_256: float = 0.1, collnet_algo: str = "COLLNET_CHAIN") -> list[dict]:
    coll = {MiB: (0.01, [0.002, 0.001, 0.003]), 64 * MiB: (0.2, [0.05] * 3), 256 * MiB: (0.4, [collnet_256] * 3)}
    sock = {MiB: (0.005, [0.001] * 3), 64 * MiB: (0.06, [0.06] * 3), 256 * MiB: (0.12, [0.1] * 3)}
    p2p = {MiB: (0.005, [0.001] * 3), 64 * MiB: (0.06, [0.06] * 3), 256 * MiB: (0.12, [p2p_256] * 3)}
    return (
        B.variant_rows("collnet", _ranks(coll), _log(collnet_algo, SIZES, "reduction-server"))
        + B.variant_rows("socket", _ranks(sock), _log("RING", SIZES, "Socket"))
        + B.variant_rows("plugin-p2p", _ranks(p2p), _log("RING", SIZES, "reduction-server"))
    )


def test_rows_table_and_target_met() -> None:
    rows = _rows(collnet_256=0.08)
    assert [(r["variant"], r["bytes"]) for r in rows] == [(v, s) for v in B.VARIANTS for s in SIZES]
    c1 = rows[0]
    # the slowest rank's median (rank 1: x1.1), nccl-tests' busbw (= algbw at n = 2)
    assert c1["seconds"] == pytest.approx(0.0022) and c1["busbw"] == c1["algbw"] == round(MiB / 0.0022 / 1e9, 4)
    assert (c1["algo"], c1["network"], c1["iters"], c1["ranks"], c1["wrong"]) == (
        "COLLNET_CHAIN",
        "reduction-server",
        3,
        2,
        0,
    )
    coll256 = rows[2]
    assert coll256["first_seconds"] == 0.4 and coll256["first_busbw"] == round(256 * MiB / 0.4 / 1e9, 4)
    table = B.format_table(rows)
    assert "collnet      256 MiB    0.4000    0.08800" in table and "COLLNET_CHAIN" in table
    assert table.splitlines()[-1].split()[-1] == f"{0.11 / 0.088:.2f}x"  # collnet/socket busbw at 256 MiB
    note = B.first_call_note(rows)
    assert note.startswith("first call vs steady state at 256 MiB: collnet first 0.400 s, median 0.0880 s (4.5x)")
    verdict = B.target(rows, B.limits(rows, {}, 2))
    assert verdict["met"] is True and verdict["line"].startswith("GPU BENCH TARGET MET")
    assert "64 MiB 1.20x, 256 MiB 1.25x" in verdict["line"]
    json.dumps(rows)  # the JSON rows: variant, bytes, seconds, algbw, busbw (and more)
    assert {"variant", "bytes", "seconds", "algbw", "busbw"} <= set(c1)


def test_target_missed_and_its_limits() -> None:
    probes = {"loopback_Bps": 4e9, "sum_Bps": 10e9}
    rows = _rows(collnet_256=0.2)  # 256 MiB: 0.22 s vs socket's 0.11 s
    lim = B.limits(rows, probes, reducers=2)
    # each head moves 256 MiB / 0.22 s = 1.22 GB/s (31% of the loopback stream); each reducer adds
    # 128 MiB / 0.22 s = 0.61 GB/s (6% of the sum kernel): loopback ranks first
    assert lim[0].startswith("loopback TCP: each head sends and receives 1.22 GB/s, 31% of one loopback")
    assert lim[1].startswith("the reducers' CPU sum rate: each of 2 reducer(s) adds 0.61 GB/s of input, 6%")
    assert lim[-1].startswith("not measured separately") and lim[-1].endswith("calls of NCCL's chunks)")
    # 2 reducers, each 10 rounds of a 64 KiB shard from each of the 2 heads: calls of 128 KiB
    stats = [{"bytes_received": 10 * 2 * 65536, "rounds_completed": 10}] * 2
    assert B.call_bytes(stats) == 131072 and B.call_bytes([{}, {"rounds_completed": 0}]) is None
    tail = B.limits(rows, probes, 2, reducer_stats=stats)[-1]
    assert tail.endswith("calls of about 128 KiB each by the reducers' counters)")
    v = B.target(rows, lim)
    assert v["met"] is False and "< NCCL Socket's at 256 MiB (collnet/socket: 64 MiB 1.20x, 256 MiB 0.50x)" in v["line"]
    assert v["line"].endswith("limited by: " + lim[0])
    # the plugin's own p2p net far below Socket's: its transport comes before the CPU rates
    slow = B.limits(_rows(collnet_256=0.2, p2p_256=0.3), probes, reducers=2)
    assert slow[0].startswith("the plugin's own transport: its p2p net (no reducers) gets 0.81 GB/s busbw at 256 MiB")
    # the tuner kept a ring for the collnet variant: that first
    ring = B.limits(_rows(collnet_256=0.2, collnet_algo="RING"), probes, reducers=2)
    assert ring[0] == "NCCL's tuner put the collnet variant's 256 MiB all-reduce on RING, not CollNet"


def test_target_incomplete_wrong_and_skipped() -> None:
    small = B.variant_rows("collnet", _ranks({MiB: (0.01, [0.001])}), None) + B.variant_rows(
        "socket", _ranks({MiB: (0.01, [0.001])}), None
    )
    assert small[0]["algo"] == "" and small[0]["network"] == ""
    assert B.target(small, [])["line"].startswith("GPU BENCH INCOMPLETE: no size >= 64 MiB")
    wrong = B.variant_rows("collnet", _ranks({64 * MiB: (0.1, [0.05])}, wrong=5), None)
    assert wrong[0]["wrong"] == 5 and B.target(wrong, [])["line"] == "GPU BENCH FAIL: wrong sums in collnet 64 MiB"
    skipped = B.variant_rows("socket", _ranks({MiB: (0.1, [0.05]), 1 << 30: (0, [])}, skip=1 << 30), None)
    assert skipped[1] == {"variant": "socket", "bytes": 1 << 30, "skipped": "over 1/8 of the GPU's memory"}
    assert "1 GiB skipped: over 1/8" in B.format_table(skipped)
    assert B.limits([], {}, 2) == [] and B.first_call_note([]).endswith("256 MiB not measured")


def test_cpu_probes() -> None:
    rate = bench.loopback_rate(16 * MiB)
    assert rate is not None and rate > 1e6
    sums = bench.sum_rate(4 * MiB, repeat=1)
    assert sums is not None and sums > 1e6


def test_bench_end_to_end_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """`python -m reducer.gpucheck --bench` as the GPU machine runs it (the plugin installed, the
    three variants as phases: launcher, reducers, two workers' bench loop, here over gloo on the
    CPU with the GPU probe stood in), its output and files: exact sums, every size measured in
    every variant, table, JSON rows, the two verdict lines, exit 0."""
    pytest.importorskip("torch")
    from reducer.gpucheck import main as gpu_main
    from reducer.gpucheck.environment import Probe

    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setattr(gpu_main, "probe", lambda: Probe(True, "", {"gpu": "none (gloo on the CPU)", "nccl": ""}))
    monkeypatch.setattr(bench, "PROBE_BYTES", 8 * MiB)
    monkeypatch.setattr(bench, "SUM_PROBE_BYTES", 4 * MiB)
    sizes = [4096, 262144 + 4]
    argv = ["--bench", "--bench-sizes", ",".join(map(str, sizes)), "--bench-iters", "4", "--bench-warmup", "1"]
    argv += ["--bench-reducer-threads", "1", "--bench-phase-limit", "120", "--worker-device", "cpu"]
    status = gpu_main.main(argv + ["--work-dir", str(tmp_path / "work")])
    printed = capsys.readouterr().out.splitlines()
    summary = json.loads((out / "gpu-bench.json").read_text())
    assert status == 0, summary["reasons"]
    assert summary["verdict"] == "PASS" and (out / "gpu-bench-logs.tar.gz").is_file()
    rows = summary["bench"]["rows"]
    assert [(r["variant"], r["bytes"]) for r in rows] == [(v, s) for v in B.VARIANTS for s in sizes]
    for r in rows:
        assert r["wrong"] == 0 and r["ranks"] == 2 and r["iters"] == 4 and r["warmup"] == 1 and r["seconds"] > 0
    assert set(summary["phases"]) == {f"bench-{v}" for v in B.VARIANTS}
    assert summary["bench"]["probes"]["loopback_Bps"] > 0 and summary["bench"]["settings"]["reducer_threads"] == 1
    assert printed[0].startswith("# variant") and any(ln.startswith("  plugin-p2p") for ln in printed)
    assert any(ln.startswith("# limit: ") for ln in printed)
    assert printed[-2] == "GPU CHECK PASS: bench_collnet, bench_socket, bench_plugin-p2p"
    assert printed[-1].startswith("GPU BENCH INCOMPLETE: no size >= 64 MiB")  # nothing that large here


def test_bench_variant_that_did_not_run() -> None:
    """A phase that left no results (stopped, crashed) fails its variant's check, and the target
    cannot be judged."""
    from reducer.gpucheck.phases import PhaseResult

    class FakePlan:
        plugin_env: dict = {}
        plain_env: dict = {}

        def __init__(self) -> None:
            self.phases: dict = {}

        def run(
            self, name: str, task: str, env: dict, reducers: int, limit: float, extra: list, threads
        ) -> PhaseResult:
            assert task == "bench" and "--sizes" in extra and limit == 150.0
            res = PhaseResult(name, "", status=143, error="stopped after the phase timeout of 150s")
            self.phases[name] = res
            return res

    args = parse_args(["--bench", "--bench-variants", "collnet,socket"])
    summary = bench.run_bench(FakePlan(), args, {})
    assert summary["verdict"] == "FAIL"
    assert summary["reasons"][0] == (
        "bench_collnet: 0 of 6 sizes measured, exit status 143 (stopped after the phase timeout of 150s)"
    )
    assert summary["bench"]["rows"] == [] and summary["bench"]["verdict"].startswith("GPU BENCH INCOMPLETE")


def test_worker_cuda_timer_and_memory_cap_with_a_stub() -> None:
    """The worker's CUDA-only branches (events resolved after one synchronize; the size cap from
    the GPU's total memory, the same on both ranks) with a stand-in for torch.cuda."""
    from types import SimpleNamespace

    from reducer.gpucheck.worker import _CallTimer, _memory_cap

    class Event:
        made = 0

        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            Event.made += 1
            self.ms, self.recorded = 10.0 * Event.made, False

        def record(self) -> None:
            self.recorded = True

        def elapsed_time(self, end: Event) -> float:
            assert self.recorded and end.recorded and syncs
            return end.ms - self.ms

    syncs: list[int] = []
    cuda = SimpleNamespace(Event=Event, synchronize=lambda: syncs.append(1), mem_get_info=lambda dev: (5, 8 << 30))
    torch, dev = SimpleNamespace(cuda=cuda), SimpleNamespace(type="cuda")
    timer = _CallTimer(torch, dev)
    for _ in range(3):
        timer.mark()
        timer.mark()
    assert not syncs and timer.seconds() == [0.01, 0.01, 0.01] and syncs == [1]
    assert _memory_cap(torch, dev) == 1 << 30 and _memory_cap(torch, SimpleNamespace(type="cpu")) == 0


def test_plugin_vs_library_on_loopback_runs(tmp_path: Path) -> None:
    """`benchmarks/bench_nccl_plugin.py --loopback` (the CPU side of the same question): the plugin's
    CollNet stream and the worker library's Communicator at each size in one run, exact sums, the
    ratio and the CPU columns present (numbers are not judged here: benchmarks prove speed)."""
    import subprocess
    import sys

    out = tmp_path / "loop.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_nccl_plugin", "--loopback", "--sizes", "256K,1M"]
        + ["--iters", "1", "--warmup", "1", "--timeout", "120", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["size"] for r in rows] == [256 << 10, 1 << 20]
    for r in rows:
        assert r["plugin"]["wrong"] == 0 and r["rs"]["wrong"] == 0
        assert (
            r["plugin"]["time_us"] > 0 and r["rs"]["time_us"] > 0 and r["rs"]["worker_cpu_s"] >= 0
        )  # CPU in 10 ms ticks
    table = [ln for ln in proc.stdout.splitlines() if ln.startswith("  ")]
    assert len(table) == 2 and all(ln.split()[3].endswith("x") for ln in table)
