"""Packaging: what a wheel installs, where the version is stated, and how the benchmark scripts run.

- Only the library is a package: `benchmarks/` (and `tests/`) stay in the source tree, so
  installing reduction-server never puts a top-level `benchmarks` package into site-packages.
- The version is written once (`reducer.__version__`); pyproject.toml reads it (dynamic).
- The benchmark scripts need no `sys.path` edits: they run as `python -m benchmarks.<name>` from
  the repository root.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py")
                 if p.stem != "__init__" and not p.stem.startswith("test_"))


def _version_in_source() -> str:
    tree = ast.parse((ROOT / "reducer" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("reducer/__init__.py has no __version__ = '...' line")


def test_build_installs_only_the_reducer_package(tmp_path):
    # build_py is the part of a wheel build that collects the Python packages (no compiling).
    out = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    top = sorted(p.name for p in tmp_path.iterdir())
    assert top == ["reducer"], f"top-level entries a wheel would install: {top}"
    assert (tmp_path / "reducer" / "bench" / "runner.py").is_file()  # subpackages are still in


def test_the_version_is_stated_once():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"], "pyproject.toml states a version of its own"
    assert "version" in project["project"].get("dynamic", [])
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "reducer.__version__"}
    out = subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == _version_in_source()


def test_no_benchmark_edits_sys_path():
    offenders = [p.name for p in (ROOT / "benchmarks").glob("*.py") if "sys.path" in p.read_text()]
    assert offenders == []


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_scripts_run_as_modules_from_the_root(name, tmp_path):
    # A source tree only (no install): the repository root on PYTHONPATH, as `python -m` from the
    # root gives; run from elsewhere so the working directory adds nothing.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["selftest", "--help"] if name == "emulate" else ["--help"]
    out = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout
