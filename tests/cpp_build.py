"""Builds and runs the C++ unit tests of tests/cpp/ (each prints "all checks passed")."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from paths import ROOT


def kernel_sources() -> list:
    """The kernels and the dtype/op vocabulary they use."""
    kernels = sorted(f"csrc/kernels/{f}" for f in os.listdir(os.path.join(ROOT, "csrc/kernels")) if f.endswith(".cc"))
    return kernels + ["csrc/common/dtype.cc"]


def build_and_run(
    tmp_path: Path, name: str, sources: Sequence[str], libs: Sequence[str] = (), flags: Sequence[str] = ()
) -> str:
    """Compiles `sources` (paths from the repository root) into tmp_path/name, with extra compiler
    `flags` (e.g. sanitizers), runs it, checks it passed and returns its output."""
    cxx = shutil.which(os.environ.get("CXX", "g++").split()[-1]) or shutil.which("g++")
    if cxx is None:
        pytest.fail("no C++ compiler: the suite needs g++ (the extension needs it too)")
    exe = tmp_path / name
    # Under scripts/sanitize.sh the sanitizer runtimes are preloaded for Python's sake: not for the
    # compiler (it would only run slower), nor for a test built with its own -fsanitize flags.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
    build = subprocess.run(
        [
            cxx,
            "-std=c++17",
            "-O1",
            "-Wall",
            "-Wextra",
            *flags,
            "-Icsrc",
            "-Itests/cpp",
            "-o",
            str(exe),
            *sources,
            "-pthread",
            *(f"-l{lib}" for lib in libs),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert "all checks passed" in run.stdout
    return run.stdout
