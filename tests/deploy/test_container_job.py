"""A job of real containers: the images built by scripts/build-images.sh, run as Vertex AI runs them.

Opt-in (it builds two images: minutes): `pytest -m containers tests/deploy/test_container_job.py`, or
RS_CONTAINER_TESTS=1; .ci/run runs it as a step of its own. It skips, with the reason, when no
container engine can build and run images here (scripts/build-images.sh exit status 3).

On one container network (internal: no route out), configured only by CLUSTER_SPEC as Vertex AI
sets it (pool 0 the primary worker, pool 1 the workers, pool 2 the reducers, `host:2222`):

1. two reducer containers (the image's ENTRYPOINT, `reduction-server serve`);
2. job 1: two worker containers run the worker image's CMD (examples/allreduce_numpy.py, which
   checks every element exactly); `reduction-server status --json` from a third container
   reaches both reducers' control planes at data port + 1 (2223, in EXPOSE);
3. job 2: two worker containers run tests/container_worker.py: all-reduces of int64 / float32 /
   float64 arrays, then the test SIGKILLs reducer 1's container, then more all-reduces, which
   fail over to reducer 0. Every result must equal the test's own reference bit for bit (two
   addends: the float64 sum rounded once is exact), and each client must count one failover;
4. the survivor stops on SIGTERM (`podman stop`) with exit status 0 after draining.

Beside the job: the build leaves no untagged image (its build stages are removed), and
`reduction-server status` on this host reaches reducer containers through mapped ports
(`-p 127.0.0.1:H:2223`): the one started with RS_ADVERTISE_ADDRESS reports that address, which a
worker on this host reduces through; the other is flagged as showing its own view.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import container_worker
import numpy as np
import pytest
from conftest import child_env
from paths import ROOT

BUILD = ROOT / "scripts" / "build-images.sh"
TAG = "test"
REDUCER_IMAGE = f"reduction-server/reducer:{TAG}"
WORKER_IMAGE = f"reduction-server/worker:{TAG}"
STAND_IN_LABEL = "io.reduction-server.stand-in"
PORT = 2222

pytestmark = [pytest.mark.containers, pytest.mark.timeout(2400)]


def _opted_in(config: pytest.Config) -> bool:
    if os.environ.get("RS_CONTAINER_TESTS", "").lower() in ("1", "true", "yes"):
        return True
    return "containers" in (config.getoption("markexpr", "") or "")


class Engine:
    """The engine command line (with this machine's flags) that scripts/build-images.sh uses."""

    def __init__(self, command: list[str], run_flags: list[str]) -> None:
        self.command = command
        self.run_flags = run_flags

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.command + list(args), capture_output=True, text=True, timeout=timeout)
        if check:
            self.check(proc)
        return proc

    @staticmethod
    def check(proc: subprocess.CompletedProcess) -> None:
        """AssertionError with the command and the engine's words unless it succeeded."""
        if proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(proc.args)[:300]} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )

    def run_cmd(self, name: str, network: str, cluster_spec: str, *rest: str) -> list[str]:
        """`run` of a container named and resolvable as `name`, its only setting CLUSTER_SPEC."""
        return self.command + [
            "run",
            "--name",
            name,
            "--hostname",
            name,
            "--network",
            network,
            *self.run_flags,
            "-e",
            f"CLUSTER_SPEC={cluster_spec}",
            *rest,
        ]

    def logs(self, name: str) -> str:
        proc = self("logs", name, check=False)
        return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def engine(request: pytest.FixtureRequest) -> Engine:
    if not _opted_in(request.config):
        pytest.skip(
            "the container job is opt-in (it builds two images): run "
            "`pytest -m containers tests/deploy/test_container_job.py` or set RS_CONTAINER_TESTS=1"
        )
    proc = subprocess.run(["bash", str(BUILD), "--print-engine"], capture_output=True, text=True, timeout=120)
    if proc.returncode == 3:
        pytest.skip(f"no container engine works here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    command, flags = (proc.stdout.splitlines() + [""])[:2]
    return Engine(command.split(), flags.split())


@pytest.fixture(scope="module")
def images(engine: Engine) -> dict[str, Any]:
    """Builds both images (tag `test`); says whether the worker's base is the Debian stand-in, and
    which untagged images the build left (`untagged_left`)."""
    log = ROOT / "build" / "images" / "build-images.log"  # build/ is ignored by git and .dockerignore
    log.parent.mkdir(parents=True, exist_ok=True)
    untagged_before = _untagged(engine)
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.run(
            ["bash", str(BUILD), "--tag", TAG], stdout=out, stderr=subprocess.STDOUT, timeout=2000, cwd=str(ROOT)
        )
    text = log.read_text(errors="replace")
    if proc.returncode == 3:
        pytest.skip(f"no container engine can build and run images here: {text.strip().splitlines()[-1]}")
    assert proc.returncode == 0, f"scripts/build-images.sh failed ({log}):\n{text[-6000:]}"
    print(f"images built in {time.monotonic() - t0:.0f} s")
    stand_in = bool(
        engine("image", "inspect", "--format", f'{{{{ index .Config.Labels "{STAND_IN_LABEL}" }}}}', WORKER_IMAGE)
        .stdout.strip()
        .replace("<no value>", "")
    )
    if stand_in:
        warnings.warn(
            "the worker image was built on scripts/build-images.sh's Debian stand-in for the "
            "PyTorch base (no registry here): no PyTorch, no CUDA; tested with the numpy "
            "example, tests/container_worker.py and the NCCL plugin installed",
            stacklevel=2,
        )
    return {"stand_in": stand_in, "untagged_left": sorted(_untagged(engine) - untagged_before)}


def _untagged(engine: Engine) -> set[str]:
    """The untagged top-level images (`<none>` in `images`: not the layers of a named one)."""
    return set(engine("images", "-q", "--no-trunc", "--filter", "dangling=true").stdout.split())


def test_build_leaves_only_named_images(engine, images):
    assert images["untagged_left"] == [], engine("images", "-a").stdout


def _image_config(engine: Engine, image: str) -> dict:
    return json.loads(engine("image", "inspect", "--format", "{{json .Config}}", image).stdout)


def test_images_are_what_the_dockerfiles_say(engine, images):
    reducer = _image_config(engine, REDUCER_IMAGE)
    assert reducer["Entrypoint"] == ["reduction-server", "serve"]
    assert set(reducer["ExposedPorts"]) == {"2222/tcp", "2223/tcp"}, reducer["ExposedPorts"]
    assert reducer["User"] == "10001:10001"
    worker = _image_config(engine, WORKER_IMAGE)
    assert worker["Cmd"] == ["python", "examples/allreduce_numpy.py"]
    # The NCCL plugin, installed under both names NCCL releases look for (libnccl-net.so and
    # libnccl-net-reduction-server.so), enabled by name in /etc/nccl.conf, found by the dynamic
    # loader (what NCCL's dlopen does) with its plugin symbols.
    proc = engine(
        "run",
        "--rm",
        *engine.run_flags,
        "--network",
        "none",
        WORKER_IMAGE,
        "sh",
        "-c",
        "cat /etc/nccl.conf; python -c 'import ctypes, reducer._core, numpy; "
        'lib = ctypes.CDLL("libnccl-net.so"); lib.ncclNetPlugin_v8; lib.ncclCollNetPlugin_v8; '
        'named = ctypes.CDLL("libnccl-net-reduction-server.so"); named.ncclCollNetPlugin_v11; '
        'print("plugin symbols ok", reducer.__file__)\'',
    )
    lines = proc.stdout.splitlines()
    assert "NCCL_NET_PLUGIN=reduction-server" in lines, proc.stdout
    assert "NCCL_COLLNET_ENABLE=1" in lines, proc.stdout
    assert "plugin symbols ok" in proc.stdout, proc.stdout
    assert "/site-packages/reducer/" in proc.stdout or "/dist-packages/reducer/" in proc.stdout, proc.stdout
    # Nothing of the host's checkout in the images: no tests, no .git, no .venv.
    proc = engine(
        "run",
        "--rm",
        *engine.run_flags,
        "--network",
        "none",
        "--entrypoint",
        "sh",
        REDUCER_IMAGE,
        "-c",
        "test -e /src || echo no-src; python -c 'import pytest' 2>&1 | tail -1",
    )
    assert "no-src" in proc.stdout and "No module named 'pytest'" in proc.stdout, proc.stdout


# -- the job ----------------------------------------------------------------------------------


def vertex_cluster_spec(pools: dict[str, list[str]], task_type: str, index: int) -> str:
    """CLUSTER_SPEC as Vertex AI sets it on every replica (docs: /work/shared/context/vertex-ai.md)."""
    specs = [
        {
            "machineSpec": {"machineType": "n1-standard-4"},
            "replicaCount": str(len(pools[p])),
            "containerSpec": {"imageUri": REDUCER_IMAGE if p == "workerpool2" else WORKER_IMAGE},
        }
        for p in ("workerpool0", "workerpool1", "workerpool2")
    ]
    return json.dumps(
        {
            "cluster": pools,
            "environment": "cloud",
            "task": {"type": task_type, "index": index, "trial": ""},
            "job": {"workerPoolSpecs": specs},
        }
    )


class Job:
    """Container names, the network, CLUSTER_SPECs, and cleanup of everything started."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        ident = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.network = f"rs-test-{ident}"
        self.reducers = [f"rs-{ident}-workerpool2-{i}" for i in range(2)]
        self.workers = [f"rs-{ident}-workerpool0-0", f"rs-{ident}-workerpool1-0"]
        self.pools = {
            "workerpool0": [f"{self.workers[0]}:{PORT}"],
            "workerpool1": [f"{self.workers[1]}:{PORT}"],
            "workerpool2": [f"{r}:{PORT}" for r in self.reducers],
        }
        self.procs: list[subprocess.Popen] = []

    def spec(self, task_type: str, index: int) -> str:
        return vertex_cluster_spec(self.pools, task_type, index)

    def worker_spec(self, rank: int) -> str:
        return self.spec("workerpool0", 0) if rank == 0 else self.spec("workerpool1", rank - 1)

    def start_reducers(self) -> None:
        self.engine("network", "create", "--internal", self.network)
        for i, name in enumerate(self.reducers):
            args = self.engine.run_cmd(name, self.network, self.spec("workerpool2", i), "-d", REDUCER_IMAGE)
            proc = self.engine(*args[len(self.engine.command) :], check=i > 0)
            if proc.returncode != 0 and "netavark" in proc.stderr:
                # podman's network backend cannot set up a container network on this machine
                # (netavark needs iptables or nftables): no engine for a job, not a failure of it.
                pytest.skip(f"container networks do not work here: {proc.stderr.strip().splitlines()[-1]}")
            self.engine.check(proc)
        for i, name in enumerate(self.reducers):  # serve's last start-up line
            self.wait_for_log(name, f"listening on 0.0.0.0:{PORT} (port from CLUSTER_SPEC entry workerpool2[{i}]", 180)

    def wait_for_log(self, name: str, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            log = self.engine.logs(name)
            if text in log:
                return log
            assert time.monotonic() < deadline, f"{name}: no {text!r} within {timeout:.0f} s:\n{log[-3000:]}"
            time.sleep(0.5)

    def reducer_hosts(self) -> list[str]:
        """`--add-host NAME:IP` for every reducer: their names resolved from /etc/hosts, not DNS."""
        out = []
        for name in self.reducers:
            nets = json.loads(self.engine("inspect", "--format", "{{json .NetworkSettings.Networks}}", name).stdout)
            out += ["--add-host", f"{name}:{nets[self.network]['IPAddress']}"]
        return out

    def start_workers(
        self, *command: str, volume: str | None = None, static_hosts: bool = False
    ) -> list[subprocess.Popen]:
        procs = []
        hosts = self.reducer_hosts() if static_hosts else []
        for rank, name in enumerate(self.workers):
            extra = (["-v", volume] if volume else []) + hosts
            argv = self.engine.run_cmd(
                name, self.network, self.worker_spec(rank), "--rm", *extra, WORKER_IMAGE, *command
            )
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        self.procs += procs
        return procs

    def finish(self, procs: Sequence[subprocess.Popen], timeout: float = 300) -> list[str]:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
        for rank, (p, out) in enumerate(zip(procs, outs)):
            assert p.returncode == 0, f"worker {rank} exit status {p.returncode}:\n{out[-4000:]}\n{self.reducer_logs()}"
        return outs

    def reducer_logs(self) -> str:
        return "\n".join(f"--- {name}:\n{self.engine.logs(name)[-3000:]}" for name in self.reducers)

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
        self.engine("rm", "-f", *self.reducers, *self.workers, check=False, timeout=180)
        self.engine("network", "rm", "-f", self.network, check=False)


@pytest.fixture
def job(engine: Engine, images: dict[str, bool]):
    j = Job(engine)
    try:
        yield j
    finally:
        j.cleanup()


def check_results(folder: Path, world: int) -> None:
    """Every rank's result of every round equals the reference, bit for bit."""
    for phase in (1, 2):
        contributions = [container_worker.inputs(r, phase) for r in range(world)]
        for dtype in container_worker.DTYPES:
            parts = [c[dtype] for c in contributions]
            if dtype == "int64":
                want = np.sum(parts, axis=0, dtype=np.int64)
            else:  # float64 sum of two addends, rounded once to the dtype: what a correct reducer gives
                want = np.sum([p.astype(np.float64) for p in parts], axis=0).astype(dtype)
            for rank in range(world):
                got = np.load(folder / f"rank{rank}-phase{phase}-{dtype}.npy")
                assert got.dtype == want.dtype and got.shape == want.shape
                bad = np.flatnonzero(got != want)
                assert bad.size == 0, (
                    f"rank {rank} phase {phase} {dtype}: {bad.size} wrong elements, "
                    f"first at {bad[0]}: {got[bad[0]]!r} != {want[bad[0]]!r}"
                )


def run_example_job(job: Job) -> None:
    """Job 1: the worker image's CMD, as Vertex AI runs it (with shorter arguments)."""
    cmd = _image_config(job.engine, WORKER_IMAGE)["Cmd"] + ["--sizes", "4K,1M", "--iters", "2"]
    outs = job.finish(job.start_workers(*cmd))
    for rank, out in enumerate(outs):
        assert f"rank {rank} of 2: all 2 sizes correct" in out, out
    assert "over 2 worker(s) and 2 reducer(s)" in outs[0], outs[0]
    assert any(
        line.split()[:3] == ["1MiB", "262144", "float32"] and line.endswith("OK") for line in outs[0].splitlines()
    ), outs[0]


def check_status(job: Job) -> None:
    """`reduction-server status --json` in a container of the job: both control planes answer."""
    name = f"{job.network}-status"
    argv = job.engine.run_cmd(
        name,
        job.network,
        job.spec("workerpool0", 0),
        "--rm",
        WORKER_IMAGE,
        "reduction-server",
        "status",
        "--json",
        "--timeout",
        "20",
    )
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reducers = json.loads(proc.stdout)["reducers"]
    assert [r["address"] for r in reducers] == [f"{r}:{PORT + 1}" for r in job.reducers], reducers
    # Each reducer reports its own CLUSTER_SPEC entry as its data address (not 127.0.0.1:2222).
    assert [(r["data_address"], r["data_address_from"]) for r in reducers] == [
        (f"{r}:{PORT}", "cluster") for r in job.reducers
    ], reducers
    assert all(r["state"] == "serving" for r in reducers), reducers
    assert sum(int(r["counters"]["rounds_completed"]) for r in reducers) > 0, reducers


def run_failover_job(job: Job, folder: Path) -> list[dict]:
    """Job 2: rounds, reducer 1's container SIGKILLed, rounds on the survivor."""
    out = folder / "out"
    out.mkdir()
    shutil.copy2(Path(container_worker.__file__), folder / "container_worker.py")
    # The reducers' names come from /etc/hosts here, not from the network's DNS: with podman 4.3 /
    # aardvark-dns 1.4, names stop resolving (EAI_AGAIN, or a stall of up to ~20 s) for a moment
    # when a container of the network dies, which is just when the workers fail over. Job 1
    # resolved the same names through DNS.
    procs = job.start_workers(
        "python", "/job/container_worker.py", "/job/out", volume=f"{folder}:/job", static_hosts=True
    )
    deadline = time.monotonic() + 300
    while not all((out / f"ready-{r}").exists() for r in range(2)):
        for rank, p in enumerate(procs):
            assert p.poll() is None, f"worker {rank} exited early:\n{p.communicate()[0]}\n{job.reducer_logs()}"
        assert time.monotonic() < deadline, f"phase 1 not done in 300 s\n{job.reducer_logs()}"
        time.sleep(0.2)
    victim = job.reducers[1]
    job.engine("kill", "--signal", "KILL", victim)
    job.engine("wait", victim, timeout=120)
    state = json.loads(job.engine("inspect", "--format", "{{json .State}}", victim).stdout)
    assert not state["Running"] and state["ExitCode"] == 137, state
    (out / "go").write_text("")
    outs = job.finish(procs)
    for rank, text in enumerate(outs):
        assert f"rank {rank}: phase 2 done" in text, text
    check_results(out, 2)
    return [json.loads((out / f"rank{r}-stats.json").read_text()) for r in range(2)]


def test_job_of_containers_survives_a_reducer_kill(job, tmp_path):
    t0 = time.monotonic()

    def done(what: str) -> None:
        print(f"{time.monotonic() - t0:6.1f} s  {what}")

    job.start_reducers()
    for i, name in enumerate(job.reducers):
        log = job.engine.logs(name)
        assert f"this is reducer {i} of 2 (workerpool2 index {i})" in log, log
    done("two reducer containers listen")
    run_example_job(job)
    done("job 1: the worker image's CMD on two worker containers")
    check_status(job)
    done("reduction-server status --json from a container: both control planes")
    stats = run_failover_job(job, tmp_path)
    for s in stats:
        assert s["reducer_failovers"] == 1 and s["reducers_active"] == 1, stats
    done("job 2: rounds, reducer 1 SIGKILLed, rounds on the survivor, results exact")
    survivor = job.reducers[0]
    job.engine("stop", "-t", "30", survivor, timeout=120)
    state = json.loads(job.engine("inspect", "--format", "{{json .State}}", survivor).stdout)
    log = job.engine.logs(survivor)
    assert state["ExitCode"] == 0, f"{state}\n{log[-3000:]}"
    assert "received SIGTERM" in log and "stopped after" in log, log[-3000:]
    done("the survivor stopped by SIGTERM, exit status 0")


# -- status through mapped ports ----------------------------------------------------------------


def _mapped_network(engine: Engine) -> list[str]:
    """`run` flags for ports mapped onto this host's loopback: podman's slirp4netns where it is
    installed (it needs no iptables), else the engine's default network."""
    return ["--network", "slirp4netns"] if engine.command[0] == "podman" and shutil.which("slirp4netns") else []


def test_status_through_mapped_ports(engine, images):
    import reducer
    from reducer.launch import free_ports

    data_a, control_a, data_b, control_b = free_ports(4)
    ident = f"{os.getpid()}-{secrets.token_hex(3)}"
    names = [f"rs-{ident}-own-view", f"rs-{ident}-advertised"]
    advertised = f"127.0.0.1:{data_b}"
    try:
        for name, data, control, extra in (
            (names[0], data_a, control_a, []),
            (names[1], data_b, control_b, ["-e", f"RS_ADVERTISE_ADDRESS={advertised}"]),
        ):
            maps = ["-p", f"127.0.0.1:{data}:{PORT}", "-p", f"127.0.0.1:{control}:{PORT + 1}"]
            net = _mapped_network(engine)
            engine("run", "-d", "--name", name, *engine.run_flags, *net, *maps, *extra, REDUCER_IMAGE)
        deadline = time.monotonic() + 120
        while not all(f"listening on 0.0.0.0:{PORT}" in engine.logs(n) for n in names):
            assert time.monotonic() < deadline, "\n".join(engine.logs(n)[-2000:] for n in names)
            time.sleep(0.5)
        status = [sys.executable, "-m", "reducer.cli.main", "status", "--timeout", "20"]
        env = child_env()
        controls = [f"127.0.0.1:{control_a}", f"127.0.0.1:{control_b}"]
        proc = subprocess.run(status + ["--json", *controls], capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        own, adv = json.loads(proc.stdout)["reducers"]
        assert (own["data_address"], own["data_address_from"]) == (f"127.0.0.1:{PORT}", "listen"), own
        assert own["control_address"] == f"127.0.0.1:{PORT + 1}", own
        assert (adv["data_address"], adv["data_address_from"]) == (advertised, "advertise"), adv
        proc = subprocess.run(status + ["--once", *controls], capture_output=True, text=True, timeout=60, env=env)
        text = " ".join(proc.stdout.split())
        assert f"* {controls[0]}: data 127.0.0.1:{PORT} as the reducer sees itself" in text, proc.stdout
        assert f"* {controls[1]}:" not in text, proc.stdout
        # The advertised address is one a worker on this host can use.
        with reducer.Communicator([advertised], rank=0, world_size=1, timeout=30, connect_timeout=30) as comm:
            a = np.arange(1000, dtype=np.float32)
            comm.allreduce(a)
        assert np.array_equal(a, np.arange(1000, dtype=np.float32))
    finally:
        engine("rm", "-f", *names, check=False, timeout=180)
