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
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from paths import ROOT

SCRIPTS = sorted(
    p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__" and not p.stem.startswith("test_")
)


def _version_in_source() -> str:
    tree = ast.parse((ROOT / "reducer" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("reducer/__init__.py has no __version__ = '...' line")


def _source_copy(tmp_path: Path) -> Path:
    """The tree a build sees, copied (setuptools writes an egg-info next to setup.py: not into ours)."""
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("*.so", "__pycache__", "build", "*.egg-info")
    for name in ("reducer", "benchmarks", "csrc"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    return src


def test_build_installs_only_the_reducer_package(tmp_path):
    # build_py is the part of a wheel build that collects the Python packages (no compiling).
    src, lib = _source_copy(tmp_path), tmp_path / "lib"
    out = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(lib)],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    top = sorted(p.name for p in lib.iterdir())
    assert top == ["reducer"], f"top-level entries a wheel would install: {top}"
    assert (lib / "reducer" / "bench" / "runner.py").is_file()  # subpackages are still in


def test_the_version_is_stated_once(tmp_path):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"], "pyproject.toml states a version of its own"
    assert "version" in project["project"].get("dynamic", [])
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "reducer.__version__"}
    out = subprocess.run(
        [sys.executable, "setup.py", "--version"],
        cwd=_source_copy(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
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
    out = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout


# -- the set-up scripts say what they do ----------------------------------------------------------


def _fake_bin(tmp_path: Path) -> Path:
    """A PATH with only what the scripts need to reach their first install: root's `id`, a logging
    `apt-get`, a `python3` that stops the script (no clang++, no ccache)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    scripts = {
        "id": "echo 0",
        "apt-get": 'echo "apt-get $*" >> "$APT_LOG"',
        "python3": 'echo "python3 $*"; exit 7',
    }
    for name, body in scripts.items():
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)
    for tool in ("dirname",):
        (bindir / tool).symlink_to(shutil.which(tool))
    return bindir


@pytest.mark.parametrize("no_apt", [False, True])
def test_test_script_says_when_it_installs_system_packages(tmp_path, no_apt):
    bindir = _fake_bin(tmp_path)
    log = tmp_path / "apt.log"
    env = {"PATH": str(bindir), "APT_LOG": str(log), **({"NO_APT": "1"} if no_apt else {})}
    out = subprocess.run(
        ["/bin/bash", str(ROOT / "scripts" / "test.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 7, out.stdout + out.stderr  # stopped by the fake python3 at the venv
    said = "installing clang ccache system-wide with apt-get" in out.stdout
    installed = log.exists() and "install -y -qq clang ccache" in log.read_text()
    assert (said, installed) == ((False, False) if no_apt else (True, True)), out.stdout
    assert "[1/5] virtual environment .venv" in out.stdout  # a line per stage


def test_set_up_scripts_show_pips_output():
    for name in ("test.sh", "run-local.sh"):
        text = (ROOT / "scripts" / name).read_text()
        assert "pip install" in text and "--quiet" not in text and " -q " not in text.replace("-qq", ""), name
