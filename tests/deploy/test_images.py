"""The container images' entry points, run the way the images run them, without a container engine.

tests/deploy/test_container_job.py builds the real images and runs a job of containers (opt-in, it takes
minutes; .ci/run runs it where podman works). This module is the quick stand-in that runs
everywhere:

docker/reducer.Dockerfile and docker/worker.Dockerfile build a wheel of this repository
(`pip wheel .`), install only that wheel, and run `reduction-server serve` (reducer ENTRYPOINT) or
`python examples/allreduce_numpy.py` (worker CMD, from a directory holding a copy of examples/).
This module does the same without Docker:

1. copies the source tree (what git tracks or would track: no build/, no compiled .so) and builds
   a wheel from it once, compiling the C++ core from scratch;
2. creates a fresh virtual environment (no --system-site-packages) and installs the wheel with
   --no-deps. The runtime dependencies the wheel declares (numpy, ml_dtypes, ...) and *their*
   dependencies are linked in from the current environment, one distribution at a time, instead
   of being downloaded: nothing else of the current environment (in particular not this
   checkout, which is installed in editable mode) is visible in the venv;
3. runs the commands the Dockerfiles name, with CLUSTER_SPECs shaped like Vertex AI's: two
   reducers as workerpool2 replicas, two workers as workerpool0 / workerpool1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import child_env
from paths import ROOT

from reducer.launch import free_ports

REDUCER_DOCKERFILE = ROOT / "docker" / "reducer.Dockerfile"
WORKER_DOCKERFILE = ROOT / "docker" / "worker.Dockerfile"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


# -- reading the Dockerfiles ---------------------------------------------------------------------


def _instruction(dockerfile: Path, name: str) -> list[str]:
    """The exec-form (JSON array) argument of the last `name` instruction of the final stage."""
    found = None
    for line in dockerfile.read_text().splitlines():
        m = re.match(rf"\s*{name}\s+(\[.*\])\s*$", line, re.I)
        if m:
            found = json.loads(m.group(1))
    assert found is not None, f"{dockerfile.name} has no exec-form {name}"
    return found


def test_dockerfiles_name_the_commands_tested_here():
    text = REDUCER_DOCKERFILE.read_text()
    assert _instruction(REDUCER_DOCKERFILE, "ENTRYPOINT") == ["reduction-server", "serve"]
    # The data port and the control plane's default port (data port + 1, reducer/control/lifecycle.py).
    expose = re.findall(r"^EXPOSE\s+(.+)$", text, re.M)
    assert expose and set(expose[-1].split()) == {"2222", "2223"}, expose
    user = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0"), "the reducer must not run as root"
    assert "pip wheel" in text and "pip install /wheels/" in text
    cmd = _instruction(WORKER_DOCKERFILE, "CMD")
    assert cmd[0] == "python" and (ROOT / cmd[1]).is_file(), cmd
    assert "COPY examples/ examples/" in WORKER_DOCKERFILE.read_text()


# -- a wheel and a fresh venv --------------------------------------------------------------------


def _source_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"],
            cwd=str(ROOT),
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        return [f for f in out.splitlines() if f and (ROOT / f).is_file()]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", "build", "dist", ".venv", "__pycache__", ".pytest_cache", ".benchmarks"}
        files = []
        for dirpath, dirnames, filenames in os.walk(ROOT):
            dirnames[:] = [d for d in dirnames if d not in skip and not d.endswith(".egg-info")]
            files += [
                os.path.relpath(os.path.join(dirpath, f), ROOT) for f in filenames if not f.endswith((".so", ".pyc"))
            ]
        return files


def _runtime_closure(requirements: list[str]) -> set[str]:
    """Distributions needed at run time by `requirements` (no extras), transitively."""
    from importlib import metadata

    from packaging.requirements import Requirement

    todo = [Requirement(r) for r in requirements]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = req.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        todo.extend(Requirement(r) for r in (metadata.distribution(req.name).requires or []))
    return seen


def _link_distributions(names: set[str], target: Path) -> None:
    """Symlink each distribution's top-level packages and metadata into `target`."""
    from importlib import metadata

    target.mkdir()
    for name in names:
        dist = metadata.distribution(name)
        base = Path(dist.locate_file(""))
        # RECORD lists the packages, the modules and the .dist-info directory itself.
        tops = {Path(str(f)).parts[0] for f in (dist.files or []) if not str(f).startswith("..")}
        assert tops, f"{name}: no RECORD, cannot tell its files"
        for top in tops:
            if top == "__pycache__" or (target / top).exists():
                continue
            if (base / top).exists():
                (target / top).symlink_to(base / top)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("images")
    src, wheels = tmp / "src", tmp / "wheels"
    for rel in _source_files():
        dst = src / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst)
    assert not list(src.rglob("*.so")), "the copy must not carry a prebuilt extension"
    # The Dockerfiles' `pip wheel .`, without build isolation (no network here).
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src), "-w", str(wheels)],
        check=True,
        timeout=480,
        cwd=str(tmp),
    )
    (wheel,) = wheels.glob("reduction_server-*.whl")

    env_dir = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=60)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            str(wheel),
        ],
        check=True,
        timeout=120,
    )

    from importlib import metadata

    requires = (
        metadata.Distribution.at(next(env_dir.glob("lib/python*/site-packages/reduction_server-*.dist-info"))).requires
        or []
    )
    deps = tmp / "deps"
    _link_distributions(_runtime_closure(requires), deps)
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    )
    (site / "runtime_deps.pth").write_text(str(deps) + "\n")

    # The worker image's WORKDIR: a copy of examples/ and nothing else of the repository.
    workdir = tmp / "workdir"
    shutil.copytree(ROOT / "examples", workdir / "examples")
    return {"python": py, "bin": env_dir / "bin", "workdir": workdir, "root": env_dir}


def _venv_env(venv: dict[str, Path], **extra: str) -> dict[str, str]:
    env = child_env(drop=("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"))
    env["PATH"] = f"{venv['bin']}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv["root"])
    env.update(extra)
    return env


def _vertex_spec(pools: dict[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps(
        {
            "cluster": pools,
            "environment": "cloud",
            "task": {"type": task_type, "index": index, "trial": ""},
            "job": {"workerPoolSpecs": []},
        }
    )


def test_venv_uses_the_wheel(venv):
    code = (
        "import json, reducer, reducer._core, numpy, sys; "
        "print(json.dumps([reducer.__file__, reducer._core.__file__, sys.prefix]))"
    )
    out = subprocess.run(
        [str(venv["python"]), "-c", code],
        env=_venv_env(venv),
        cwd=str(venv["workdir"]),
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    pkg, core, prefix = json.loads(out)
    venv_root = str(venv["root"].resolve())
    assert os.path.realpath(pkg).startswith(venv_root), pkg
    assert os.path.realpath(core).startswith(venv_root), core
    assert os.path.realpath(prefix) == venv_root
    assert str(ROOT) not in pkg
    helptext = subprocess.run(
        [str(venv["bin"] / "reduction-server"), "--help"],
        env=_venv_env(venv),
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    for command in ("serve", "launch", "plan", "vertex-job"):
        assert command in helptext


def test_reducer_entrypoint_and_worker_cmd(venv):
    """Two reducer 'containers' (ENTRYPOINT, workerpool2) and two worker 'containers' (CMD)."""
    entrypoint = _instruction(REDUCER_DOCKERFILE, "ENTRYPOINT")
    worker_cmd = _instruction(WORKER_DOCKERFILE, "CMD") + ["--sizes", "4K,1M", "--iters", "2"]
    r0, r1, w0, w1 = free_ports(4)
    pools = {
        "workerpool0": [f"127.0.0.1:{w0}"],
        "workerpool1": [f"127.0.0.1:{w1}"],
        "workerpool2": [f"127.0.0.1:{r0}", f"127.0.0.1:{r1}"],
    }
    reducers, workers = [], []
    try:
        for i in range(2):
            env = _venv_env(venv, CLUSTER_SPEC=_vertex_spec(pools, "workerpool2", i), RS_THREADS="1")
            # PATH lookup of the entry point, as the image's ENTRYPOINT does.
            reducers.append(
                subprocess.Popen(
                    entrypoint,
                    env=env,
                    cwd=str(venv["workdir"]),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        for task_type, _port in (("workerpool0", w0), ("workerpool1", w1)):
            env = _venv_env(venv, CLUSTER_SPEC=_vertex_spec(pools, task_type, 0))
            # Workers start while the reducers may still be starting: the client retries connects.
            workers.append(
                subprocess.Popen(
                    worker_cmd,
                    env=env,
                    cwd=str(venv["workdir"]),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        outs = []
        for w in workers:
            out, _ = w.communicate(timeout=90)
            outs.append(out)
        for rank, (w, out) in enumerate(zip(workers, outs)):
            assert w.returncode == 0, out
            assert f"rank {rank} of 2: all 2 sizes correct" in out, out
        assert re.search(r"^\s+1MiB\s+262144\s+float32\s.*OK$", outs[0], re.M), outs[0]
        logs = []
        for r in reducers:
            r.send_signal(signal.SIGTERM)
            out, _ = r.communicate(timeout=30)
            logs.append(out)
            assert r.returncode == 0, out
        for i, (port, log) in enumerate(zip((r0, r1), logs)):
            assert f"this is reducer {i} of 2 (workerpool2 index {i})" in log, log
            assert f"listening on 0.0.0.0:{port} (port from CLUSTER_SPEC entry workerpool2[{i}]" in log, log
            assert "received SIGTERM" in log and "stopped after" in log, log
    finally:
        for p in reducers + workers:
            if p.poll() is None:
                p.kill()
                p.communicate()


def test_launcher_from_the_venv(venv):
    """The one-machine main job, installed from the wheel."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            str(venv["bin"] / "reduction-server"),
            "launch",
            "--workers",
            "2",
            "--reducers",
            "1",
            "--",
            "python",
            "examples/allreduce_numpy.py",
            "--sizes",
            "64K",
            "--iters",
            "2",
        ],
        env=_venv_env(venv),
        cwd=str(venv["workdir"]),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[worker 1.0] rank 1 of 2: all 1 sizes correct" in proc.stdout
    assert time.monotonic() - t0 < 60
