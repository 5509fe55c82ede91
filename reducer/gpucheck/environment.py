"""What the GPU check needs from the machine: a CUDA GPU and PyTorch with NCCL (probed in a
subprocess with a timeout, so a wedged driver cannot hang the check), and the NCCL plugin
installed with ``reduction-server nccl-plugin --install DIR``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NEEDS = (
    "the GPU check needs a CUDA GPU and PyTorch with NCCL (torch.cuda.is_available() and "
    "torch.distributed.is_nccl_available())"
)

_PROBE = r"""
import json, sys
out = {}
try:
    import torch
except Exception as exc:
    out["missing"] = f"PyTorch cannot be imported ({type(exc).__name__}: {exc})"
else:
    out["torch"] = torch.__version__
    out["cuda_build"] = torch.version.cuda
    import torch.distributed as dist
    if not torch.cuda.is_available():
        out["missing"] = "no CUDA GPU visible to PyTorch (torch.cuda.is_available() is False)"
    elif not (dist.is_available() and dist.is_nccl_available()):
        out["missing"] = "this PyTorch has no NCCL backend (torch.distributed.is_nccl_available() is False)"
    else:
        out["gpus"] = torch.cuda.device_count()
        out["gpu"] = torch.cuda.get_device_name(0)
        out["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
try:
    import jax
    out["jax"] = jax.__version__
except Exception:
    pass
print(json.dumps(out))
"""


@dataclass
class Probe:
    ok: bool
    reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)


def probe(python: str = sys.executable, timeout: float = 120.0, env: Mapping[str, str] | None = None) -> Probe:
    """Whether this machine can run the check; never raises."""
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=None if env is None else dict(env),
        )
    except subprocess.TimeoutExpired:
        return Probe(False, f"probing PyTorch/CUDA took longer than {timeout:g}s")
    except OSError as exc:
        return Probe(False, f"cannot run {python}: {exc}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return Probe(False, f"probing PyTorch/CUDA failed (exit {proc.returncode}): {' / '.join(tail)}")
    info = json.loads(lines[-1])
    if "missing" in info:
        return Probe(False, info.pop("missing"), info)
    return Probe(True, "", info)


def install_plugin(directory: str, timeout: float = 60.0) -> dict[str, str]:
    """Run ``python -m reducer.cli.main nccl-plugin --install DIR`` (the package need not be pip
    installed: PYTHONPATH is enough) and return the environment it prints (``export K=V``), with
    DIR put first on LD_LIBRARY_PATH. RuntimeError with the command's output on failure."""
    cmd = [sys.executable, "-m", "reducer.cli.main", "nccl-plugin", "--install", directory]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(cmd)} took longer than {timeout:g}s") from None
    if proc.returncode != 0:
        said = proc.stderr.strip() or proc.stdout.strip()
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {said}")
    env = parse_exports(proc.stdout.splitlines())
    if not any(name.startswith("libnccl-net") for name in os.listdir(directory)):
        raise RuntimeError(f"{' '.join(cmd)} left no libnccl-net*.so in {directory}")
    previous = os.environ.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = directory + (os.pathsep + previous if previous else "")
    return env


def parse_exports(lines: list[str]) -> dict[str, str]:
    """`export K=V` lines (comments and anything else ignored)."""
    env = {}
    for line in lines:
        line = line.strip()
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            env[key.strip()] = value.strip().strip("'\"")
    return env
