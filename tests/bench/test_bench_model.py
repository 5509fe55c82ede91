"""`reduction-server bench --model`: model parameter lists, DDP's bucket plan, step replay, CLI.

The bucket plan is checked against hand-written tables and, where torch is installed, against
torch's own ``dist._compute_bucket_assignment_by_size`` (what DDP's rebuild_buckets calls) on
the full-size models. The end-to-end run is loopback, W=2 R=1, a model scaled down; nothing is timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from paths import ROOT

from reducer.bench import models
from reducer.bench.buckets import MIB, plan_buckets, release_times
from reducer.bench.data import count_wrong_tiled, fill_input, make_input, reference


# ------------------------------------------------------------------ models
@pytest.mark.parametrize(
    "name,tensors,params",
    [
        ("resnet50", 161, 25_557_032),  # "25.6M"
        ("bert-base", 199, 109_482_240),  # "110M"
        ("gpt2-medium", 292, 354_823_168),  # "355M"
    ],
)
def test_model_parameter_totals(name, tensors, params):
    shapes = models.parameters(name)
    assert len(shapes) == tensors
    assert models.total_parameters(shapes) == params
    assert len({n for n, _ in shapes}) == tensors  # names are unique, as named_parameters() gives them


def test_model_shapes_follow_the_architectures():
    r = dict(models.parameters("resnet50"))
    assert r["conv1.weight"] == (64, 3, 7, 7)
    assert r["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert "layer1.1.downsample.0.weight" not in r  # only a stage's first block projects
    assert r["layer4.2.conv3.weight"] == (2048, 512, 1, 1) and r["fc.weight"] == (1000, 2048)
    names = [n for n, _ in models.parameters("resnet50")]
    assert names[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"] and names[-1] == "fc.bias"
    b = dict(models.parameters("bert-base"))
    assert b["embeddings.word_embeddings.weight"] == (30522, 768)
    assert b["encoder.layer.11.intermediate.dense.weight"] == (3072, 768)
    assert b["encoder.layer.11.output.dense.weight"] == (768, 3072)
    g = models.parameters("gpt2-medium")
    gd = dict(g)
    assert g[0] == ("transformer.wte.weight", (50257, 1024)) and g[-1] == ("transformer.ln_f.bias", (1024,))
    assert gd["transformer.h.23.attn.c_attn.weight"] == (1024, 3072)  # Conv1D: (in, out)
    assert gd["transformer.h.0.mlp.c_proj.weight"] == (4096, 1024)
    assert not any(n.startswith("lm_head") for n, _ in g)  # tied to wte


def test_model_scale_and_errors():
    full = models.parameters("bert-base")
    small = models.parameters("bert-base", 0.001)
    assert [n for n, _ in small] == [n for n, _ in full]
    for (_, s), (_, f) in zip(small, full):
        assert s == (max(1, round(models.numel(f) * 0.001)),)
    with pytest.raises(KeyError, match="unknown model"):
        models.parameters("resnet18")
    with pytest.raises(ValueError, match="scale"):
        models.parameters("resnet50", 0)


# ------------------------------------------------------------------ DDP's buckets
# (parameter element counts in registration order, element size, cap bytes, first-bucket bytes,
#  expected buckets as parameter indices in all-reduce order)
PLANS = [
    # reverse order; the parameter that crosses a limit stays in its bucket; the rest is the last bucket
    ([10, 300, 5, 200, 100, 50], 4, 1000, 400, [[5, 4], [3, 2, 1], [0]]),
    # a limit reached exactly closes the bucket
    ([25, 25, 25, 25], 4, 200, 100, [[3], [2, 1], [0]]),
    # first bucket as large as the others: one limit
    ([25, 25, 25, 25], 4, 200, 200, [[3, 2], [1, 0]]),
    # a parameter larger than the cap is a bucket alone
    ([1, 1000, 1], 4, 100, 100, [[2, 1], [0]]),
    ([1, 1, 1000], 4, 100, 8, [[2], [1, 0]]),
    # everything fits in the first bucket
    ([3, 4, 5], 2, 1000, 1000, [[2, 1, 0]]),
    # element size counts: 2-byte elements fit twice as many
    ([100, 100, 100, 100], 2, 400, 200, [[3], [2, 1], [0]]),
    ([], 4, 100, 10, []),
]


@pytest.mark.parametrize("counts,esize,cap,first,expected", PLANS)
def test_bucket_plan_table(counts, esize, cap, first, expected):
    plan = plan_buckets(counts, esize, cap, first)
    assert [list(b.params) for b in plan] == expected
    off = 0
    for b in plan:  # buckets laid out one after another in the flat buffer, in all-reduce order
        assert b.offset == off and b.count == sum(counts[i] for i in b.params)
        off += b.count
    assert off == sum(counts)


@pytest.mark.parametrize("name", list(models.MODELS))
@pytest.mark.parametrize("cap_mb", [25, 64])
def test_bucket_plan_matches_torch_ddp(name, cap_mb):
    """The same buckets as DDP's rebuild: compute_bucket_assignment_by_size over the parameters in
    gradient-ready order (reverse registration order), limits [first_bucket_bytes_cap, bucket_bytes_cap]."""
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    shapes = models.parameters(name)
    counts = [models.numel(s) for _, s in shapes]
    ready = list(reversed(range(len(shapes))))
    tensors = [torch.empty(shapes[i][1], device="meta") for i in ready]
    cap = cap_mb * MIB
    want, limits = dist._compute_bucket_assignment_by_size(tensors, [dist._DEFAULT_FIRST_BUCKET_BYTES, cap], [], ready)
    got = plan_buckets(counts, 4, cap, MIB)
    assert [list(b.params) for b in got] == [list(w) for w in want]
    assert len(got) >= 2 and got[0].count * 4 >= MIB and limits[0] == MIB


def test_ddp_buckets_of_resnet50_at_25_mib():
    plan = plan_buckets([models.numel(s) for _, s in models.parameters("resnet50")], 4, 25 * MIB)
    # first bucket: fc.bias, fc.weight (8.2 MB) passes the 1 MiB first-bucket limit at once
    assert plan[0].params == (160, 159)
    assert [round(b.count * 4 / 1e6, 1) for b in plan] == [8.2, 31.5, 26.3, 26.6, 9.7]  # (as torch, above)


def test_release_times_share_of_backward():
    plan = plan_buckets([10, 30, 20, 40], 4, 160, 80)  # buckets [3], [2, 1], [0]: 40, 50, 10 elements
    assert [b.count for b in plan] == [40, 50, 10]
    assert release_times(plan, 2.0) == pytest.approx([0.8, 1.8, 2.0])
    assert release_times(plan, 0.0) == [0.0, 0.0, 0.0]


def test_step_once_releases_buckets_in_order_not_before_their_time():
    from reducer.bench.rank import _Algo, step_once

    class Recorder(_Algo):
        def __init__(self):
            self.started, self.finished = [], None

        def start_bucket(self, bucket):
            self.started.append((bucket, time.perf_counter()))
            return f"handle-{bucket}"

        def finish_step(self, pending):
            self.finished = list(pending)

    algo = Recorder()
    t0 = time.perf_counter()
    step_once(algo, ["b0", "b1", "b2"], [0.0, 0.02, 0.05])
    assert [b for b, _ in algo.started] == ["b0", "b1", "b2"]
    for (_, t), at in zip(algo.started, [0.0, 0.02, 0.05]):
        assert t - t0 >= at  # a bucket never starts before its gradients are ready (sleep is a lower bound)
    assert algo.finished == ["handle-b0", "handle-b1", "handle-b2"]


# ------------------------------------------------------------------ tiled inputs and checks
def test_fill_input_and_tiled_check(monkeypatch):
    import reducer.bench.data as data

    monkeypatch.setattr(data, "TILE", data.PERIOD * 3)  # several tiles, and a partial one
    n = data.PERIOD * 7 + 100
    for rank in range(3):
        buf = np.empty(n, np.float32)
        fill_input(buf, rank)
        np.testing.assert_array_equal(buf, make_input(rank, n, "float32"))
    expected, _ = reference(3, n, "float32", "avg")
    out = expected.copy()
    assert count_wrong_tiled(out, 3, "avg", 1e-6) == 0
    out[data.PERIOD * 5 + 7] += 0.25
    out[-1] -= 0.5
    assert count_wrong_tiled(out, 3, "avg", 1e-6) == 2


# ------------------------------------------------------------------ CLI end to end
def _bench(args, timeout=300):
    cmd = [sys.executable, "-m", "reducer.cli.main", "bench", "--no-progress"] + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_bench_model_end_to_end(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    jp, pp = tmp_path / "steps.json", tmp_path / "steps.png"
    res = _bench(
        [
            "--model",
            "resnet50",
            "--scale",
            "0.005",
            "--workers",
            "2",
            "--reducers",
            "1",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--bucket-cap-mb",
            "25,64",
            "--compute-ms",
            "0,gloo",
            "--json",
            str(jp),
            "--plot",
            str(pp),
        ]
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "resnet50: one DDP training step" in res.stdout and "it hides" in res.stdout
    rows = json.load(open(jp))
    algos = ["rs", "rs+bf16", "ring", "gloo"]
    scaled = [models.numel(s) for _, s in models.parameters("resnet50", 0.005)]
    for cap in (25.0, 64.0):
        plan = plan_buckets(scaled, 4, int(cap * MIB * 0.005), int(MIB * 0.005))
        mine = [r for r in rows if r["bucket_cap_mb"] == cap]
        gloo0 = next(r for r in mine if r["algo"] == "gloo" and r["compute_ms"] == 0)
        derived = {r["compute_ms"] for r in mine if r["compute_from"] == "gloo"}
        assert len(derived) == 1 and derived.pop() == pytest.approx(gloo0["step_us"] / 1e3)  # gloo's comm time
        for algo in algos:
            got = sorted((r for r in mine if r["algo"] == algo), key=lambda r: r["compute_ms"])
            assert [r["compute_from"] for r in got] == ["given", "gloo"], algo
            for r in got:
                assert r["wrong"] == 0, r
                assert r["model"] == "resnet50" and r["mode"] == "step" and r["workers"] == 2
                assert r["reducers"] == (1 if algo.startswith("rs") else 0)
                assert r["buckets"] == len(plan) and r["bucket_bytes"] == [b.count * 4 for b in plan]
                assert r["count"] == sum(scaled) and r["size"] == 4 * sum(scaled)
                assert len(r["samples_us"]) == 2 and all(len(s) == 2 for s in r["samples_us"])
                assert r["step_us"] == pytest.approx(max(float(np.median(s)) for s in r["samples_us"]))
                assert r["exposed_us"] == pytest.approx(max(0.0, r["step_us"] - r["compute_ms"] * 1e3))
                assert r["steps_per_s"] == pytest.approx(1e6 / r["step_us"])
                g = next(x for x in mine if x["algo"] == "gloo" and x["compute_ms"] == r["compute_ms"])
                assert r["speedup_vs_gloo"] == pytest.approx(g["step_us"] / r["step_us"])
                assert r["comm_us"] == pytest.approx(got[0]["step_us"])
                for key in ("load_average_1m", "background_cpu_percent", "first_bucket_bytes", "label"):
                    assert key in r
            assert got[0]["exposed_fraction"] is None
            assert got[1]["exposed_fraction"] == pytest.approx(got[1]["exposed_us"] / got[0]["step_us"])
            assert got[1]["hidden_fraction"] == pytest.approx(max(0.0, 1 - got[1]["exposed_fraction"]))
    assert len(rows) == 2 * 2 * len(algos)
    assert pp.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "resnet50", "--dtype", "float64"], "must be float32"),
        (["--model", "resnet50", "--compute-ms", "0,gloo", "--algos", "rs"], "needs the gloo algorithm"),
        (["--model", "resnet50", "--compute-ms", "fast"], "bad --compute-ms"),
        (["--model", "resnet50", "--compute-ms", "-1"], ">= 0 ms"),
        (["--model", "resnet50", "--bucket-cap-mb", "0"], "must be > 0"),
        (["--model", "resnet50", "--scale", "2"], "--scale"),
        (["--model", "resnet50", "--algos", "rs,nccl"], "unknown algorithm"),
    ],
)
def test_bench_model_bad_arguments(args, message):
    res = _bench(args + ["--workers", "2", "--reducers", "1"], timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr


def test_bench_model_unknown_model_is_refused():
    res = _bench(["--model", "resnet18"], timeout=60)
    assert res.returncode == 2 and "invalid choice" in res.stderr
