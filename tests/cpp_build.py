"""Builds and runs the C++ unit tests of tests/cpp/ (each prints "all checks passed")."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from paths import ROOT

# AddressSanitizer + UndefinedBehaviorSanitizer, stopping at the first undefined behaviour: the
# flags the sanitized unit tests are built with.
SANITIZE = ("-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined")


def kernel_sources() -> list:
    """The kernels and the dtype/op vocabulary they use."""
    kernels = sorted(f"csrc/kernels/{f}" for f in os.listdir(os.path.join(ROOT, "csrc/kernels")) if f.endswith(".cc"))
    return kernels + ["csrc/common/dtype.cc"]


def build_and_run(
    tmp_path: Path, name: str, sources: Sequence[str], libs: Sequence[str] = (), flags: Sequence[str] = ()
) -> str:
    """Compiles `sources` (paths from the repository root) into tmp_path/name, with extra compiler
    `flags` (e.g. sanitizers), runs it, checks it passed and returns its output. Each source is
    compiled on its own, RS_BUILD_JOBS at a time (default: the cores), through ccache where it is
    installed (a rerun, or CI on unchanged sources, only links)."""
    cxx = shutil.which(os.environ.get("CXX", "g++").split()[-1]) or shutil.which("g++")
    if cxx is None:
        pytest.fail("no C++ compiler: the suite needs g++ (the extension needs it too)")
    exe = tmp_path / name
    # Under scripts/sanitize.sh the sanitizer runtimes are preloaded for Python's sake: not for the
    # compiler (it would only run slower), nor for a test built with its own -fsanitize flags.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
    launcher = [c for c in [shutil.which("ccache")] if c]
    compile_flags = ["-std=c++17", "-O1", "-Wall", "-Wextra", *flags, "-Icsrc", "-Itests/cpp", "-pthread"]
    (tmp_path / "obj").mkdir(exist_ok=True)
    objs = [str(tmp_path / "obj" / (src.replace("/", "_") + ".o")) for src in sources]

    def compile_one(src: str, obj: str) -> subprocess.CompletedProcess:
        cmd = [*launcher, cxx, *compile_flags, "-c", src, "-o", obj]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)

    jobs = max(1, int(os.environ.get("RS_BUILD_JOBS") or os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=jobs) as ex:
        for done in ex.map(compile_one, sources, objs):
            assert done.returncode == 0, done.stderr
    link = [cxx, *flags, "-o", str(exe), *objs, "-pthread", *(f"-l{lib}" for lib in libs)]
    build = subprocess.run(link, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert "all checks passed" in run.stdout
    return run.stdout
