"""The reducer's membership rules as C++ unit tests without sockets (tests/cpp/test_group_table.cc)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["tests/cpp/test_group_table.cc", "csrc/server/group_table.cc", "csrc/server/group.cc", "csrc/protocol/plan.cc",
           "csrc/server/limits.cc", "csrc/protocol/wire.cc", "csrc/common/common.cc"]


def test_group_table_rules(tmp_path):
    cxx = shutil.which(os.environ.get("CXX", "g++").split()[-1]) or shutil.which("g++")
    if cxx is None:
        pytest.fail("no C++ compiler: the suite needs g++ (the extension needs it too)")
    kernels = sorted(f"csrc/kernels/{f}" for f in os.listdir(os.path.join(ROOT, "csrc/kernels")) if f.endswith(".cc"))
    exe = tmp_path / "test_group_table"
    build = subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Icsrc", "-o", str(exe), *SOURCES, *kernels,
                            "-pthread"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "all checks passed" in run.stdout
