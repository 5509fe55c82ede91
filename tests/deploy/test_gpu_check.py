"""The GPU check (reducer.gpucheck, scripts/gpu-check.sh) on a machine without a GPU: its NCCL log
parser on NCCL's own line formats, its verdicts, the no-GPU exit, and its phases with the worker
running over gloo on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import child_env_in_tree
from paths import ROOT

from reducer.gpucheck import verdict as V
from reducer.gpucheck.environment import parse_exports, probe
from reducer.gpucheck.nccl_log import normalize_algo, parse_lines
from reducer.gpucheck.phases import parse_reducer_stats, run_phase, worker_command

# Lines as NCCL 2.28 prints them (formats from src/plugin/net/net_v11.cc, src/init.cc,
# src/transport/coll_net.cc, src/enqueue.cc), for the plugin run where CollNet is chosen.
COLLNET_228 = """\
gpu1:4711:4711 [0] NCCL INFO NCCL_COLLNET_ENABLE set by environment to 1.
gpu1:4711:4711 [0] NCCL INFO NET/Plugin: Loaded net plugin reduction-server (v11)
gpu1:4711:4711 [0] NCCL INFO NET/Plugin: Loaded collnet plugin reduction-server (v11)
gpu1:4711:4711 [0] NCCL INFO NET/reduction-server: net plugin v11 loaded: TCP on eth0 (10.0.0.2), 2 socket(s)
gpu1:4711:4711 [0] NCCL INFO NET/reduction-server: CollNet: 2 reducer(s) from CLUSTER_SPEC: 127.0.0.1:1, 127.0.0.1:2
gpu1:4711:4711 [0] NCCL INFO Successfully loaded external network plugin /tmp/p/libnccl-net.so
gpu1:4711:4711 [0] NCCL INFO Using network reduction-server
gpu1:4711:4730 [0] NCCL INFO CollNet 00/0 : 0 [receive] via COLLNET/reduction-server/0
gpu1:4711:4730 [0] NCCL INFO CollNet 00/0 : 0 [send] via COLLNET/reduction-server/0
gpu1:4711:4730 [0] NCCL INFO rank 0 Connected CollNet
gpu1:4711:4711 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f recvbuff 0x7f count 1024 datatype 7 op 0 root 0 comm 0x55 [nranks=2] stream 0x56
gpu1:4711:4711 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}
gpu1:4711:4711 [0] NCCL INFO AllReduce: 268435456 Bytes -> Algo COLLNET_CHAIN proto SIMPLE channel{Lo..Hi}={0..1}
gpu1:4711:4711 [0] NCCL INFO AllReduce: 67108864 Bytes -> Algo COLLNET_CHAIN proto SIMPLE channel{Lo..Hi}={0..1}
gpu1:4711:4711 [0] NCCL INFO AllGather [Symmetric]: 4096 Bytes -> Kernel AllGather_ST nchannels 2 nthreads 512 nWorks 1
"""  # noqa: E501 (NCCL's log lines as NCCL writes them)

# The same run if NCCL's tuner keeps the ring for every size.
RING_ONLY = """\
gpu1:4711:4711 [0] NCCL INFO NET/Plugin: Loaded net plugin reduction-server (v11)
gpu1:4711:4711 [0] NCCL INFO NET/Plugin: Loaded collnet plugin reduction-server (v11)
gpu1:4711:4711 [0] NCCL INFO Using network reduction-server
gpu1:4711:4730 [0] NCCL INFO rank 0 Connected CollNet
gpu1:4711:4711 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}
gpu1:4711:4711 [0] NCCL INFO AllReduce: 268435456 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..3}
"""

# No plugin found (NCCL falls back to its socket net); then an init error.
NO_PLUGIN = """\
gpu1:4711:4711 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.
gpu1:4711:4711 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>
gpu1:4711:4711 [0] NCCL INFO Using network Socket
gpu1:4711:4711 [0] NCCL INFO Communicator has 1 nodes which is less than CollNet node threshold 2, disabling CollNet
gpu1:4711:4711 [0] init.cc:1500 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000
gpu1:4711:4711 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}
"""

# NCCL 2.22-2.23 print the enum numbers; 2.21 not even the function name.
NUMERIC_223 = "h:1:1 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo 3 proto 2 time 41.250000\n"
NUMERIC_221 = "h:1:1 [0] NCCL INFO 1048576 Bytes -> Algo 2 proto 2 time 41.250000\n"


def _log(text: str):
    return parse_lines(text.splitlines(True))


def test_parser_collnet_chosen() -> None:
    lg = _log(COLLNET_228)
    assert lg.net_plugin == "reduction-server (v11)" and lg.collnet_plugin == "reduction-server (v11)"
    assert lg.networks == ["reduction-server"]
    assert lg.collnet_channels == 2 and lg.collnet_connected
    algos = [(t.func, t.nbytes, t.algo, t.proto) for t in lg.tuning]
    assert algos == [
        ("AllReduce", 4096, "RING", "LL"),
        ("AllReduce", 268435456, "COLLNET_CHAIN", "SIMPLE"),
        ("AllReduce", 67108864, "COLLNET_CHAIN", "SIMPLE"),
        ("AllGather", 4096, "SYMMETRIC", ""),
    ]
    assert lg.collnet_bytes() == 268435456 + 67108864
    assert lg.plugin_lines[0].startswith("net plugin v11 loaded")


def test_parser_numeric_and_old_formats() -> None:
    (t,) = _log(NUMERIC_223).tuning
    assert (t.func, t.nbytes, t.algo, t.proto, t.collnet) == ("AllReduce", 1048576, "COLLNET_CHAIN", "SIMPLE", True)
    (t,) = _log(NUMERIC_221).tuning
    assert (t.func, t.algo, t.collnet) == ("", "COLLNET_DIRECT", True)
    assert _log(NUMERIC_221).collnet_bytes() == 1048576
    assert normalize_algo("CollNetChain") == normalize_algo("COLLNET_CHAIN") == normalize_algo("3") == "COLLNET_CHAIN"
    assert normalize_algo("Ring") == "RING" and normalize_algo("9") == "ALGO_9"
    old = _log("h:1:1 [0] NCCL INFO NET/Plugin: Loaded coll plugin reduction-server (v8)\n")
    assert old.collnet_plugin == "reduction-server (v8)"


def test_parser_no_plugin_and_errors() -> None:
    lg = _log(NO_PLUGIN)
    assert lg.net_plugin is None and lg.collnet_plugin is None
    assert lg.networks == ["Socket"]
    assert lg.collnet_disabled and "node threshold" in lg.collnet_disabled[0]
    assert lg.warnings == ["Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000"]
    assert [t.algo for t in lg.tuning] == ["RING"] and lg.collnet_bytes() == 0
    assert _log("no nccl here\nTraceback (most recent call last):\n").lines == 0


def test_check_collnet() -> None:
    ok = V.check_collnet([_log(COLLNET_228), _log(COLLNET_228)])
    assert ok.ok is True and "2 of 3 AllReduce on COLLNET_CHAIN via reduction-server" in ok.detail
    assert ok.data["collnet_bytes"] == 268435456 + 67108864
    ring = V.check_collnet([_log(RING_ONLY), _log(RING_ONLY)])
    assert ring.ok is False and "chose RING for every AllReduce, never CollNet" in ring.detail
    none = V.check_collnet([_log(NO_PLUGIN), _log(NO_PLUGIN)])
    assert none.ok is False
    for part in (
        "net plugin 'reduction-server' not loaded",
        "'Using network Socket'",
        "node threshold",
        "no CollNet connection",
    ):
        assert part in none.detail
    socket_only = _log(COLLNET_228.replace("Using network reduction-server", "Using network Socket"))
    assert V.check_collnet([socket_only, _log(COLLNET_228)]).ok is False
    assert V.check_collnet([_log(""), _log("")]).ok is False
    no_tuning = "\n".join(ln for ln in COLLNET_228.splitlines() if "Bytes ->" not in ln)
    assert "TUNING" in V.check_collnet([_log(no_tuning)]).detail


def test_check_reducer_bytes() -> None:
    stats = [
        {"bytes_received": 300, "bytes_sent": 300, "rounds_completed": 3},
        {"bytes_received": 0, "bytes_sent": 0, "rounds_completed": 0},
    ]
    c = V.check_reducer_bytes(stats, collnet_bytes=150)
    assert c.ok is True and "reducer(s) [1] received nothing" in c.detail
    assert V.check_reducer_bytes(stats, collnet_bytes=151).ok is False
    assert V.check_reducer_bytes(stats, collnet_bytes=0).ok is False
    assert V.check_reducer_bytes([{}, stats[0]], collnet_bytes=1).ok is False
    assert V.check_reducer_bytes([], collnet_bytes=1).ok is False


def _sums(rank: int, sizes, bad=None):
    rows = []
    for dt in ("float32", "bfloat16", "float16"):
        for s in sizes:
            rows.append(
                {
                    "dtype": dt,
                    "bytes": s,
                    "count": s // (4 if dt == "float32" else 2),
                    "mismatches": 1 if (dt, s) == bad else 0,
                }
            )
    return {"rank": rank, "sums": rows, "teardown": "ok"}


def test_check_sums() -> None:
    sizes = [4096, 1 << 20]
    dts = ["float32", "bfloat16", "float16"]
    assert V.check_sums([_sums(0, sizes), _sums(1, sizes)], sizes, dts).ok is True
    bad = V.check_sums([_sums(0, sizes), _sums(1, sizes, bad=("bfloat16", 4096))], sizes, dts)
    assert bad.ok is False and "rank 1: bfloat16 4096 B: 1 wrong" in bad.detail
    missing = V.check_sums([_sums(0, sizes[:1]), _sums(1, sizes)], sizes, dts)
    assert missing.ok is False and "rank 0: float32 1048576 B not run" in missing.detail
    assert V.check_sums([], sizes, dts).ok is False


def test_check_ddp() -> None:
    a = [{"rank": 0, "ddp": {"losses": [1.0, 0.5]}}, {"rank": 1, "ddp": {"losses": [2.0, 0.25]}}]
    same = V.check_ddp(a, json.loads(json.dumps(a)))
    assert same.ok is True and same.data["bitwise_equal"] and "bitwise equal" in same.detail
    close = [{"rank": 0, "ddp": {"losses": [1.0 + 1e-9, 0.5]}}, a[1]]
    c = V.check_ddp(a, close)
    assert c.ok is True and not c.data["bitwise_equal"]
    far = [{"rank": 0, "ddp": {"losses": [1.0, 0.5001]}}, a[1]]
    assert V.check_ddp(a, far).ok is False
    assert V.check_ddp(a, a[:1]).ok is False
    assert V.check_ddp(a, [a[0], {"rank": 1, "ddp": {"losses": [2.0]}}]).ok is False
    assert V.check_ddp([], a).ok is False


def test_check_teardown_and_plain_network() -> None:
    done = [{"rank": 0, "teardown": "ok"}, {"rank": 1, "teardown": "ok"}]
    assert V.check_teardown("t", 0, done).ok is True
    crashed = V.check_teardown("t", 139, [done[0], {"rank": 1, "teardown": "pending"}])
    assert crashed.ok is False and "exit status 139" in crashed.detail and "rank 1: teardown pending" in crashed.detail
    assert V.check_teardown("t", 0, done[:1]).ok is False
    assert "did not run: skipped" in V.check_teardown("t", None, [], why="skipped").detail
    assert V.check_plain_network(_log(NO_PLUGIN)).ok is True
    assert V.check_plain_network(_log(COLLNET_228)).ok is False
    assert V.check_plain_network(_log("")).ok is False


def test_summary_and_verdict_line() -> None:
    good = [V.Check("a", True, "fine"), V.Check("diag", None, "info")]
    s = V.summarize(good, {"gpu": "H200"}, {"p": {"status": 0}}, warnings=["w1"])
    assert s["verdict"] == "PASS" and s["reasons"] == []
    line = V.verdict_line(s)
    assert line == "GPU CHECK PASS: a (skipped: diag) [warnings: w1]"
    bad = V.summarize(good + [V.Check("b", False, "broken")], {}, {})
    assert bad["verdict"] == "FAIL" and V.verdict_line(bad) == "GPU CHECK FAIL: b: broken"
    assert V.summarize([V.Check("diag", None, "x")], {}, {})["verdict"] == "FAIL"
    back = json.loads(V.to_json(bad))
    assert back["checks"]["b"] == {"name": "b", "ok": False, "detail": "broken", "data": {}}


def test_parse_reducer_stats_and_exports() -> None:
    lines = [
        "[reducer 0] 2026-11-26 00:39:38,823 INFO reducer.serve: stopped after 1 rounds (1.1 MB received, 1.1 MB sent)",
        "[reducer 0] 2026-11-26 00:39:38,824 DEBUG reducer.serve: final stats: bytes_received=1051840, "
        "bytes_sent=1051934, rounds_completed=1, draining=True, round_latency_seconds={'bounds': [0.5], "
        "'counts': [0, 0], 'sum': 0.0}, limits={'group_slots': 4, 'max_connections': 4096}",
        "[reducer 1] 2026-11-26 00:39:38,926 INFO reducer.serve: stopped after 2 rounds (2.5 MB received, 2.0 MB sent)",
        "[worker 0.0] final stats: bytes_received=5",
    ]
    got = parse_reducer_stats(lines, 3)
    assert got[0] == {"bytes_received": 1051840, "bytes_sent": 1051934, "rounds_completed": 1}
    assert got[1] == {"rounds_completed": 2, "bytes_received": 2500000, "bytes_sent": 2000000, "approximate": 1}
    assert got[2] == {}
    env = parse_exports(
        [
            "# NCCL plugin library: /x",
            "export NCCL_NET_PLUGIN=/x/libnccl-net.so",
            "export NCCL_COLLNET_ENABLE=1",
            "# optional: ...",
        ]
    )
    assert env == {"NCCL_NET_PLUGIN": "/x/libnccl-net.so", "NCCL_COLLNET_ENABLE": "1"}


def test_shell_script_syntax() -> None:
    script = ROOT / "scripts" / "gpu-check.sh"
    assert os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)


def _env(**extra: str) -> dict:
    env = child_env_in_tree()
    env.update(extra)
    return env


def test_no_gpu_exits_3_with_the_reason(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--quick"],
        capture_output=True,
        text=True,
        timeout=180,
        env=_env(OUT=str(tmp_path)),
    )
    assert proc.returncode == 3, proc.stderr
    assert "no CUDA GPU visible to PyTorch" in proc.stderr
    assert "needs a CUDA GPU and PyTorch with NCCL" in proc.stderr
    assert not list(tmp_path.iterdir())  # nothing written: nothing was checked


def test_probe_without_torch(tmp_path: Path) -> None:
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no torch in this image')\n")
    found = probe(env=_env(PYTHONPATH=str(tmp_path)))
    assert not found.ok and "PyTorch cannot be imported (ImportError: no torch in this image)" in found.reason
    proc = subprocess.run(
        [sys.executable, "-m", "reducer.gpucheck"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}"),
    )
    assert proc.returncode == 3 and "PyTorch cannot be imported" in proc.stderr


def test_worker_phases_on_cpu(tmp_path: Path) -> None:
    """The GPU phases' code path with the worker over gloo: launcher, reducers' stats, result files."""
    pytest.importorskip("torch")
    sizes = [4096, 65536 + 4]
    work = str(tmp_path)
    cmd = worker_command(
        "sums", os.path.join(work, "sums"), 90, ["--sizes", ",".join(map(str, sizes)), "--device", "cpu"]
    )
    res = run_phase("sums", work, cmd, _env(), reducers=2, timeout=150)
    assert res.status == 0, Path(res.run_dir, "launch.log").read_text()[-3000:]
    check = V.check_sums(res.results, sizes, ["float32", "bfloat16", "float16"])
    assert check.ok is True, check.detail
    assert V.check_teardown("t", res.status, res.results).ok is True
    assert len(res.reducer_stats) == 2 and all("bytes_received" in s for s in res.reducer_stats)
    # A worker that dies at teardown is a failed teardown, with its status.
    crash = textwrap.dedent("""
        import json, os, sys
        rank = int(os.environ["RANK"])
        path = os.path.join(sys.argv[1], f"result-rank{rank}.json")
        json.dump({"rank": rank, "teardown": "pending"}, open(path, "w"))
        os.abort() if rank == 1 else None
    """)
    bad = run_phase(
        "crash", work, [sys.executable, "-c", crash, os.path.join(work, "crash")], _env(), reducers=1, timeout=60
    )
    c = V.check_teardown("t", bad.status, bad.results)
    assert c.ok is False and bad.status == 128 + 6 and "rank 1: teardown pending" in c.detail


def test_pattern_sums_are_exact_in_half_types() -> None:
    torch = pytest.importorskip("torch")
    import numpy as np

    from reducer.gpucheck.worker import expected_sum, pattern

    n = 1 << 16
    want = expected_sum(n, 2)
    assert set(np.unique(pattern(n, 0))) <= set(range(-8, 9)) and np.abs(want).max() <= 16
    assert len(set(pattern(n, 0)[:4096].tolist())) == 17  # every value appears: a shifted chunk shows
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        a = torch.from_numpy(pattern(n, 0).astype(np.float32)).to(dt)
        b = torch.from_numpy(pattern(n, 1).astype(np.float32)).to(dt)
        assert np.array_equal((a + b).float().numpy().astype(np.float64), want)


def test_build_checks_from_phases() -> None:
    """The checks the entry point builds from its four phases: all pass on good phases (two DDP
    runs each with ranks 0 and 1), and a crash in one DDP run fails that run's teardown only."""
    from reducer.gpucheck.main import build_checks
    from reducer.gpucheck.phases import PhaseResult

    sizes = [268435456, 67108864]
    dts = ["float32", "bfloat16", "float16"]
    done = [{"rank": 0, "teardown": "ok"}, {"rank": 1, "teardown": "ok"}]
    ddp = [dict(r, ddp={"losses": [1.0 + r["rank"], 0.5]}) for r in done]
    stats = [{"bytes_received": 2 * (268435456 + 67108864), "bytes_sent": 1, "rounds_completed": 1}, {}]
    stats[1] = dict(stats[0], bytes_received=7)

    def phases(plain_status: int = 0):
        return {
            "collnet-sums": PhaseResult(
                "s", "", 0, "", [_sums(0, sizes), _sums(1, sizes)], [_log(COLLNET_228), _log(COLLNET_228)], stats
            ),
            "no-reducers": PhaseResult("n", "", 0, "", done, [_log(COLLNET_228)] * 2, [{}]),
            "collnet-ddp": PhaseResult("d", "", 0, "", ddp, [_log(COLLNET_228)] * 2, stats),
            "plain-ddp": PhaseResult(
                "p",
                "",
                plain_status,
                "",
                ddp if not plain_status else [ddp[0], dict(ddp[1], teardown="pending")],
                [_log(NO_PLUGIN)] * 2,
                [{}],
            ),
        }

    checks = build_checks(phases(), sizes, dts)
    assert [c.name for c in checks if not c.ok] == []
    assert V.summarize(checks, {}, {})["verdict"] == "PASS"
    bad = {c.name: c.ok for c in build_checks(phases(plain_status=139), sizes, dts)}
    assert [n for n, ok in bad.items() if not ok] == ["teardown_ddp_without_plugin"]
