"""Deployment helpers: the reducer planner, the Vertex AI job spec, the examples and manifests.

Pure Python: nothing here needs the C++ extension or a network.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import child_env_in_tree
from paths import ROOT

from reducer.cli.main import main
from reducer.deploy import bandwidth, planner, vertex
from reducer.deploy.planner import REDUCER_CORE_GBPS, plan_reducers
from reducer.errors import ConfigError

VERTEX_EXAMPLE = ROOT / "examples" / "vertex" / "custom_job.yaml"
SUBMIT = ROOT / "examples" / "vertex" / "submit.py"
K8S_MANIFEST = ROOT / "examples" / "kubernetes" / "reduction-server.yaml"


def _sdk_or_skip() -> Any:
    try:
        from google.cloud.aiplatform_v1.types import CustomJobSpec
    except ImportError:
        pytest.skip("google-cloud-aiplatform is not installed (pip install google-cloud-aiplatform)")
    return CustomJobSpec


# -- planner ---------------------------------------------------------------------------------


@pytest.mark.parametrize("workers, gbps, reducers", [(5, 100, 16), (8, 100, 25), (1, 32, 1), (1, 33, 2)])
def test_plan_matches_vertex_examples(workers: int, gbps: float, reducers: int) -> None:
    plan = plan_reducers(workers, gbps)
    assert plan.reducer_machine == "n1-highcpu-16"
    assert plan.reducer_gbps == 32
    assert plan.reducers == reducers
    assert plan.reducers_total_gbps >= plan.workers_total_gbps
    assert (plan.reducers - 1) * plan.reducer_gbps < plan.workers_total_gbps


def test_plan_reducer_gbps_and_tier1() -> None:
    assert plan_reducers(8, 100, reducer_gbps=50).reducers == 16
    assert plan_reducers(8, 100, reducer_gbps=50).reducer_machine is None
    tier1 = plan_reducers(8, 100, reducer_machine="n2-highcpu-32", tier1=True)
    assert (tier1.reducer_gbps, tier1.reducers) == (50, 16)
    assert plan_reducers(8, 100, reducer_machine="n2-highcpu-32").reducers == 25
    assert plan_reducers(3, 10, reducer_machine="n1-highcpu-8").reducers == 2
    # With an explicit bandwidth the machine name is only a label, known or not.
    assert plan_reducers(4, 100, reducer_machine="c3-highcpu-44", reducer_gbps=50).reducers == 8


def test_plan_table_has_required_machines() -> None:
    expected = {
        "n1-highcpu-8": 16,
        "n1-highcpu-16": 32,
        "n1-highcpu-32": 32,
        "n2-highcpu-8": 16,
        "n2-highcpu-16": 32,
        "n2-highcpu-32": 32,
    }
    for name, gbps in expected.items():
        assert planner.REDUCER_MACHINES[name].egress_gbps == gbps


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(reducer_machine="m5.large"), "known: .*n1-highcpu-16"),
        (dict(reducer_machine="n1-highcpu-32", tier1=True), "Tier_1 .*n2-highcpu-32"),
        (dict(reducer_machine="n2-highcpu-16", tier1=True), "Tier_1"),
        (dict(reducer_gbps=0), "reducer_gbps"),
    ],
)
def test_plan_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        plan_reducers(4, 100, **kwargs)


@pytest.mark.parametrize("workers, gbps", [(0, 100), (-1, 100), (2.5, 100), (4, 0), (4, float("nan"))])
def test_plan_rejects_bad_inputs(workers: Any, gbps: Any) -> None:
    with pytest.raises(ConfigError):
        plan_reducers(workers, gbps)


def test_plan_cli(capsys: pytest.CaptureFixture) -> None:
    assert main(["plan", "--workers", "5", "--worker-gbps", "100"]) == 0
    out = capsys.readouterr().out
    assert "16 x n1-highcpu-16" in out
    assert "500 Gbps" in out and "512 Gbps" in out
    for name in planner.REDUCER_MACHINES:
        assert name in out
    # the sizing alone (the prediction, a SimGrid run of ~1-3 s, is tested once above and in test_simulate)
    assert main(["plan", "--workers", "8", "--worker-gbps", "100", "--predict-size", "0"]) == 0
    assert "25 x n1-highcpu-16" in capsys.readouterr().out
    assert main(["plan", "--workers", "8", "--worker-gbps", "100", "--reducer-gbps", "100", "--predict-size", "0"]) == 0
    assert "8 x custom" in capsys.readouterr().out


def test_plan_cli_unknown_machine(capsys: pytest.CaptureFixture) -> None:
    assert main(["plan", "--workers", "2", "--worker-gbps", "100", "--reducer-machine", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown reducer machine type 'nope'" in err and "n2-highcpu-32" in err


# -- Vertex AI job spec --------------------------------------------------------------------------

BASE = [
    "vertex-job",
    "--machine-type",
    "a2-highgpu-8g",
    "--accelerator-type",
    "NVIDIA_TESLA_A100",
    "--accelerator-count",
    "8",
    "--image",
    "gcr.io/p/worker:1",
    "--reducer-image",
    "gcr.io/p/reducer:1",
]


def _vertex_job(capsys: pytest.CaptureFixture, *extra: str) -> dict[str, Any]:
    assert main(BASE + list(extra)) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_vertex_job_layout(capsys: pytest.CaptureFixture) -> None:
    spec = _vertex_job(capsys, "--workers", "4", "--args", "python", "train.py", "--lr", "0.1")
    pools = spec["workerPoolSpecs"]
    assert list(spec) == ["workerPoolSpecs"] and len(pools) == 3
    gpu = {"machineType": "a2-highgpu-8g", "acceleratorType": "NVIDIA_TESLA_A100", "acceleratorCount": 8}
    container = {"imageUri": "gcr.io/p/worker:1", "args": ["python", "train.py", "--lr", "0.1"]}
    assert pools[0] == {"machineSpec": gpu, "replicaCount": 1, "containerSpec": container}
    assert pools[1] == {"machineSpec": gpu, "replicaCount": 3, "containerSpec": container}
    # 4 x 100 Gbps = 400 Gbps -> ceil(400 / 32) = 13 n1-highcpu-16
    assert pools[2] == {
        "machineSpec": {"machineType": "n1-highcpu-16"},
        "replicaCount": 13,
        "containerSpec": {"imageUri": "gcr.io/p/reducer:1"},
    }


def test_vertex_job_single_worker_keeps_pool_indices(capsys: pytest.CaptureFixture) -> None:
    pools = _vertex_job(capsys, "--workers", "1", "--reducers", "2")["workerPoolSpecs"]
    assert pools[1] == {}
    assert pools[0]["replicaCount"] == 1 and "args" not in pools[0]["containerSpec"]
    assert pools[2]["replicaCount"] == 2


def test_vertex_job_worker_bandwidth(capsys: pytest.CaptureFixture) -> None:
    # 8 x a2-megagpu-16g -> the documented 25 n1-highcpu-16
    job = vertex.build_custom_job(8, "a2-megagpu-16g", "w", "r", "NVIDIA_TESLA_A100", 16)
    assert job.reducers == 25 and job.plan is not None and job.plan.workers_total_gbps == 800
    assert job.spec["workerPoolSpecs"][1]["replicaCount"] == 7
    assert job.worker_bandwidth is not None and "a2-megagpu-16g" in job.worker_bandwidth.reason
    # Unknown machine: needs --worker-gbps.
    argv = ["vertex-job", "--workers", "2", "--machine-type", "c3-standard-44", "--image", "w", "--reducer-image", "r"]
    assert main(argv) == 2
    assert "--worker-gbps" in capsys.readouterr().err
    assert main(argv + ["--worker-gbps", "50", "--reducer-machine", "c3-highcpu-44", "--reducer-gbps", "23"]) == 0
    spec = yaml.safe_load(capsys.readouterr().out)
    assert spec["workerPoolSpecs"][2] == {
        "machineSpec": {"machineType": "c3-highcpu-44"},
        "replicaCount": 5,
        "containerSpec": {"imageUri": "r"},
    }
    assert main(argv + ["--worker-gbps", "50", "--reducer-machine", "n2-highcpu-32"]) == 0
    spec = yaml.safe_load(capsys.readouterr().out)
    assert spec["workerPoolSpecs"][2]["replicaCount"] == 4  # 100 / 32
    assert "acceleratorType" not in spec["workerPoolSpecs"][0]["machineSpec"]


# -- worker bandwidth: machine family x GPU model x GPU count ----------------------------------


@pytest.mark.parametrize(
    "machine, gpu, count, gbps",
    [
        ("n1-highmem-96", "NVIDIA_TESLA_V100", 8, 100),  # the Vertex AI doc's example worker
        ("n1-standard-32", "NVIDIA_TESLA_V100", 4, 50),
        ("n1-standard-16", "NVIDIA_TESLA_V100", 2, 32),
        ("n1-standard-8", "NVIDIA_TESLA_V100", 1, 16),  # min(2 x 8 vCPUs, 32)
        ("n1-standard-64", "NVIDIA_TESLA_V100", 8, 100),
        ("n1-highcpu-32", "NVIDIA_TESLA_V100", 8, 64),  # min(2 x 32 vCPUs, 100)
        ("n1-standard-4", "NVIDIA_TESLA_T4", 1, 10),  # <= 5 vCPUs: 10 Gbps
        ("n1-standard-48", "NVIDIA_TESLA_T4", 2, 50),
        ("n1-highmem-96", "NVIDIA_TESLA_T4", 4, 100),
        ("n1-standard-16", "NVIDIA_TESLA_P100", 1, 32),  # P100/P4 keep the N1 cap
        ("n1-standard-96", "NVIDIA_TESLA_P4", 4, 32),
        ("n1-standard-4", "NVIDIA_TESLA_P4", 1, 8),
        ("n1-standard-16", None, 1, 32),  # no GPU: 2 Gbps per vCPU, at most 32
        ("n1-standard-4", None, 1, 8),
        ("n2-highcpu-8", None, 1, 16),
        ("a2-highgpu-8g", "NVIDIA_TESLA_A100", 8, 100),
        ("a2-highgpu-1g", None, 1, 24),  # the machine type alone is enough
        ("a2-ultragpu-4g", "NVIDIA_A100_80GB", 4, 50),
        ("a2-megagpu-16g", "NVIDIA_TESLA_A100", 16, 100),
        ("a3-highgpu-8g", "NVIDIA_H100_80GB", 8, 200),
        ("g2-standard-48", "NVIDIA_L4", 4, 50),
        ("g2-standard-4", "NVIDIA_L4", 1, 10),
    ],
)
def test_worker_bandwidth_table(machine: str, gpu: Any, count: int, gbps: float) -> None:
    bw = bandwidth.worker_bandwidth(machine, gpu, count)
    assert bw.gbps == gbps
    assert machine in bw.reason and bandwidth.SOURCE in bw.reason
    if gpu:
        assert gpu in bw.reason


@pytest.mark.parametrize(
    "machine, gpu, count, match",
    [
        ("n1-standard-16", "NVIDIA_TESLA_V100", 3, "--worker-gbps"),  # no such GPU count
        ("n1-standard-16", "NVIDIA_L4", 1, "--worker-gbps"),  # not an N1 GPU
        ("n1-standard-16", "NVIDIA_TESLA_K80", 1, "--worker-gbps"),  # no rule in the table
        ("c3-standard-44", None, 1, "--worker-gbps"),
        ("a3-megagpu-8g", "NVIDIA_H100_MEGA_80GB", 8, "--worker-gbps"),
        ("custom-8-30720", None, 1, "--worker-gbps"),
        ("n1-highmem-96", "NVIDIA_TESLA_V100", 1, "at most 12 vCPUs"),  # Compute Engine refuses it too
        ("n2-standard-16", "NVIDIA_TESLA_T4", 1, "N1"),
        ("a2-highgpu-8g", "NVIDIA_TESLA_A100", 4, "comes with 8 x NVIDIA_TESLA_A100"),
        ("g2-standard-48", "NVIDIA_TESLA_T4", 4, "comes with 4 x NVIDIA_L4"),
    ],
)
def test_worker_bandwidth_refuses_to_guess(machine: str, gpu: Any, count: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        bandwidth.worker_bandwidth(machine, gpu, count)


def test_vertex_job_doc_example_sizes_16_reducers(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The Vertex AI doc's example: 5 x n1-highmem-96 + 8 V100 (100 Gbps each) -> 16 x n1-highcpu-16."""
    argv = [
        "vertex-job",
        "--workers",
        "5",
        "--machine-type",
        "n1-highmem-96",
        "--accelerator-type",
        "NVIDIA_TESLA_V100",
        "--accelerator-count",
        "8",
        "--image",
        "w",
        "--reducer-image",
        "r",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    spec = yaml.safe_load(captured.out)
    assert spec["workerPoolSpecs"][2]["replicaCount"] == 16
    header = [line for line in captured.out.splitlines() if line.startswith("#")]
    assert any("Worker bandwidth assumed: 100 Gbps" in h and "NVIDIA_TESLA_V100" in h for h in header)
    assert "worker bandwidth assumed: 100 Gbps" in captured.err
    out = tmp_path / "job.yaml"
    assert main(argv + ["--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "16 reducers" in printed and "worker bandwidth assumed: 100 Gbps" in printed
    # An explicit figure wins, and says so.
    assert main(argv + ["--worker-gbps", "32"]) == 0
    captured = capsys.readouterr()
    assert yaml.safe_load(captured.out)["workerPoolSpecs"][2]["replicaCount"] == 5
    assert "32 Gbps: given with --worker-gbps" in captured.err
    # A combination the table does not know: refused, asking for --worker-gbps.
    bad = list(argv)
    bad[bad.index("--accelerator-count") + 1] = "3"
    assert main(bad) == 2
    assert "--worker-gbps" in capsys.readouterr().err


# -- reducer CPU: the slower of NIC and cores ---------------------------------------------------


def test_plan_core_limit() -> None:
    # The measured figure makes an n1-highcpu-16 (8 reducer threads) NIC-bound.
    default = plan_reducers(5, 100)
    assert default.reducer_threads == 8 and default.limited_by == "NIC" and default.reducers == 16
    assert default.reducer_cores_gbps == pytest.approx(8 * REDUCER_CORE_GBPS)
    # Slow cores: 8 threads x 2 Gbps = 16 Gbps per reducer -> ceil(500 / 16) = 32 reducers.
    slow = plan_reducers(5, 100, core_gbps=2)
    assert (slow.reducer_gbps, slow.reducers, slow.limited_by) == (16, 32, "cores")
    assert slow.reducer_nic_gbps == 32
    # More threads lift the CPU limit up to the NIC.
    assert plan_reducers(5, 100, core_gbps=2, reducer_threads=16).reducers == 16
    assert plan_reducers(5, 100, core_gbps=2, reducer_threads=12).reducers == 21  # 24 Gbps each
    # n1-highcpu-8: 8 vCPUs -> 8 threads; its 16 Gbps NIC binds first.
    small = plan_reducers(4, 32, reducer_machine="n1-highcpu-8", core_gbps=3)
    assert (small.reducer_threads, small.reducer_gbps, small.reducers) == (8, 16, 8)
    # A custom reducer (only --reducer-gbps): its CPU is unknown unless the threads are given.
    custom = plan_reducers(4, 100, reducer_gbps=50, core_gbps=1)
    assert custom.reducer_threads is None and custom.reducer_gbps == 50 and custom.reducers == 8
    custom = plan_reducers(4, 100, reducer_gbps=50, core_gbps=10, reducer_threads=2)
    assert (custom.reducer_gbps, custom.reducers, custom.limited_by) == (20, 20, "cores")


@pytest.mark.parametrize(
    "kwargs", [dict(core_gbps=0), dict(core_gbps=float("inf")), dict(reducer_threads=0), dict(reducer_threads=1.5)]
)
def test_plan_core_args_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        plan_reducers(4, 100, **kwargs)


def test_plan_cli_core_limit(capsys: pytest.CaptureFixture) -> None:
    assert (
        main(["plan", "--workers", "5", "--worker-gbps", "100", "--reducer-core-gbps", "2", "--predict-size", "0"]) == 0
    )
    out = capsys.readouterr().out
    assert "32 x n1-highcpu-16" in out and "cores-bound" in out and "8 threads x 2 Gbps = 16 Gbps" in out
    assert main(["plan", "--workers", "5", "--worker-gbps", "100", "--predict-size", "0"]) == 0
    assert "NIC-bound" in capsys.readouterr().out
    assert main(BASE + ["--workers", "4", "--reducer-core-gbps", "2"]) == 0  # 400 / 16 = 25
    assert yaml.safe_load(capsys.readouterr().out)["workerPoolSpecs"][2]["replicaCount"] == 25


def test_core_figure_is_documented() -> None:
    """docs/performance.md records the measured figure the planner uses."""
    text = (ROOT / "docs" / "performance.md").read_text()
    assert f"{REDUCER_CORE_GBPS / 8:.2f} GB/s" in text and "bench_reducer_cpu.py" in text


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--workers", "0"], "--workers"),
        (["--workers", "2", "--reducers", "0"], "--reducers"),
        (["--workers", "2", "--accelerator-count", "0"], "--accelerator-count"),
        (["--workers", "2", "--reducer-machine", "x9-huge"], "unknown reducer machine"),
    ],
)
def test_vertex_job_errors(capsys: pytest.CaptureFixture, extra: list[str], match: str) -> None:
    assert main(BASE + extra) == 2
    assert match in capsys.readouterr().err


def test_vertex_job_json_to_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "job.json"
    assert main(BASE + ["--workers", "2", "--format", "json", "--output", str(out), "--display-name", "my job"]) == 0
    printed = capsys.readouterr().out
    assert "gcloud ai custom-jobs create" in printed and "'my job'" in printed and str(out) in printed
    spec = json.loads(out.read_text())
    assert [p["replicaCount"] for p in spec["workerPoolSpecs"]] == [1, 1, 7]


def test_vertex_spec_parses_with_sdk(capsys: pytest.CaptureFixture) -> None:
    CustomJobSpec = _sdk_or_skip()
    for workers in ("1", "3"):
        text = _vertex_job_text(capsys, "--workers", workers, "--args", "python", "x.py")
        parsed = CustomJobSpec.from_json(json.dumps(yaml.safe_load(text)))
        pools = parsed.worker_pool_specs
        assert len(pools) == 3
        assert pools[0].machine_spec.accelerator_type.name == "NVIDIA_TESLA_A100"
        assert pools[0].machine_spec.accelerator_count == 8
        assert list(pools[0].container_spec.args) == ["python", "x.py"]
        assert pools[1].replica_count == int(workers) - 1
        assert pools[2].machine_spec.machine_type == "n1-highcpu-16"
        assert pools[2].container_spec.image_uri == "gcr.io/p/reducer:1"
    assert vertex.to_sdk_spec(vertex.build_custom_job(2, "n1-standard-8", "w", "r").spec)


def _vertex_job_text(capsys: pytest.CaptureFixture, *extra: str) -> str:
    assert main(BASE + list(extra)) == 0
    return capsys.readouterr().out


def test_vertex_example_is_current(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """examples/vertex/custom_job.yaml equals what its "Generated by" command writes today."""
    text = VERTEX_EXAMPLE.read_text()
    command = next(line.split("Generated by:", 1)[1] for line in text.splitlines() if "Generated by:" in line)
    argv = shlex.split(command)
    assert argv[:2] == ["reduction-server", "vertex-job"]
    argv = argv[1:]
    argv[argv.index("--output") + 1] = str(tmp_path / "regen.yaml")
    assert main(argv) == 0
    capsys.readouterr()
    assert yaml.safe_load((tmp_path / "regen.yaml").read_text()) == yaml.safe_load(text)


def test_vertex_example_parses_with_sdk() -> None:
    CustomJobSpec = _sdk_or_skip()
    spec = CustomJobSpec.from_json(json.dumps(yaml.safe_load(VERTEX_EXAMPLE.read_text())))
    assert [p.replica_count for p in spec.worker_pool_specs] == [1, 3, 13]


def test_submit_example_help_and_dry_run() -> None:
    env = child_env_in_tree()
    help_run = subprocess.run(
        [sys.executable, str(SUBMIT), "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert help_run.returncode == 0 and "--project" in help_run.stdout
    _sdk_or_skip()
    dry = subprocess.run(
        [sys.executable, str(SUBMIT), "--project", "p", "--region", "us-central1", "--bucket", "gs://b", "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    assert "[1, 3, 13]" in dry.stdout and "NVIDIA_TESLA_A100" in dry.stdout


# -- Kubernetes manifests ------------------------------------------------------------------------


def _manifests() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(K8S_MANIFEST.read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert sorted(by_kind) == ["Job", "Service", "StatefulSet"]
    return by_kind


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of env values."""
    for name, val in env.items():
        value = value.replace(f"$({name})", val)
    return value


def test_kubernetes_cluster_matches_objects() -> None:
    k = _manifests()
    svc, sts, job = k["Service"], k["StatefulSet"], k["Job"]
    port = 2222
    domain = svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None"
    assert [p["port"] for p in svc["spec"]["ports"]] == [port]
    # The Service selects both the reducer and the worker pods.
    for obj in (sts, job):
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items()
    assert sts["spec"]["selector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()

    # Stable names: StatefulSet pods <sts>-<i>.<serviceName>, Indexed Job pods <job>-<i>.<subdomain>.
    assert sts["spec"]["serviceName"] == domain
    assert job["spec"]["template"]["spec"]["subdomain"] == domain
    assert job["spec"]["completionMode"] == "Indexed"
    workers = job["spec"]["completions"]
    assert job["spec"]["parallelism"] == workers == 2
    reducers = sts["spec"]["replicas"]
    assert reducers == 2
    hosts_w = [f"{job['metadata']['name']}-{i}.{domain}:{port}" for i in range(workers)]
    hosts_r = [f"{sts['metadata']['name']}-{i}.{domain}:{port}" for i in range(reducers)]
    expected = {"workerpool0": hosts_w[:1], "workerpool1": hosts_w[1:], "workerpool2": hosts_r}

    (reducer_c,) = sts["spec"]["template"]["spec"]["containers"]
    (worker_c,) = job["spec"]["template"]["spec"]["containers"]
    for c in (reducer_c, worker_c):
        assert json.loads(_env(c)["RS_CLUSTER"]) == expected
        assert c["ports"][0]["containerPort"] == port
        assert _env(c)["RS_JOB_ID"] == _env(reducer_c)["RS_JOB_ID"]
    assert [p["containerPort"] for p in worker_c["ports"]] == [port]
    assert reducer_c["command"] == ["reduction-server", "serve"]
    assert worker_c["args"] == ["python", "examples/allreduce_numpy.py"]

    # Control plane and metrics: the ports `serve` uses with this environment are the ones declared
    # and probed (native gRPC probes; tests/control/test_control.py asks a real control plane the services).
    from reducer.control.lifecycle import resolve_side_ports

    env = {k: v for k, v in _env(reducer_c).items() if isinstance(v, str)}
    with pytest.MonkeyPatch.context() as mp:
        for name in ("RS_CONTROL_PORT", "RS_METRICS_PORT"):
            mp.delenv(name, raising=False)
            if name in env:
                mp.setenv(name, env[name])
        side = resolve_side_ports(None, None, port)
    ports = {p["name"]: p["containerPort"] for p in reducer_c["ports"]}
    assert ports == {"rs": port, "control": side.control, "metrics": side.metrics}
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(side.metrics)
    ready, live = reducer_c["readinessProbe"]["grpc"], reducer_c["livenessProbe"]["grpc"]
    assert ready == {"port": side.control, "service": ""}
    assert live == {"port": side.control, "service": "liveness"}


def _reducer_cluster_spec(index: int) -> dict[str, Any]:
    (c,) = _manifests()["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    env = _env(c)
    assert env["POD_INDEX"] == {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
    values = {"POD_INDEX": str(index), "RS_CLUSTER": env["RS_CLUSTER"]}
    return json.loads(_expand(env["CLUSTER_SPEC"], values))


def _worker_cluster_spec(index: int) -> dict[str, Any]:
    (c,) = _manifests()["Job"]["spec"]["template"]["spec"]["containers"]
    probe = [sys.executable, "-c", "import os; print(os.environ['CLUSTER_SPEC'])"]
    env = {"PATH": os.environ.get("PATH", ""), "JOB_COMPLETION_INDEX": str(index), "RS_CLUSTER": _env(c)["RS_CLUSTER"]}
    # The container's own wrapper, with the training command replaced by a probe.
    run = subprocess.run(c["command"] + probe, env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs /bin/sh")
def test_kubernetes_per_pod_cluster_spec() -> None:
    cluster = json.loads(_env(_manifests()["Job"]["spec"]["template"]["spec"]["containers"][0])["RS_CLUSTER"])
    tasks = [_worker_cluster_spec(i) for i in range(2)] + [_reducer_cluster_spec(i) for i in range(2)]
    assert [t["task"] for t in tasks] == [
        {"type": "workerpool0", "index": 0, "trial": ""},
        {"type": "workerpool1", "index": 0, "trial": ""},
        {"type": "workerpool2", "index": 0, "trial": ""},
        {"type": "workerpool2", "index": 1, "trial": ""},
    ]
    for t in tasks:
        assert t["cluster"] == cluster and t["environment"] == "cloud" and t["job"] == {}

    try:
        from reducer import cluster as discovery
    except ImportError as exc:  # pragma: no cover - only while the package is incomplete
        pytest.skip(f"reducer.cluster unavailable: {exc}")
    infos = [discovery.discover({"CLUSTER_SPEC": json.dumps(t), "RS_JOB_ID": "rs-demo"}) for t in tasks]
    assert [(i.role, i.node_rank) for i in infos] == [("worker", 0), ("worker", 1), ("reducer", 0), ("reducer", 1)]
    assert infos[0].world_size == 2
    assert infos[0].reducers == cluster["workerpool2"]
    assert infos[2].bind_port == 2222
