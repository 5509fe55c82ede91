"""Runs one simulation in a child process on SimGrid (a SimGrid engine is one per process).

SimGrid is an optional dependency: PyPI ``simgrid`` (``pip install 'reduction-server[sim]'``,
a source build with cmake and boost) or Debian's ``python3-simgrid`` (``apt-get install
python3-simgrid``), which this module loads from /usr/lib/python3/dist-packages when the running
Python has the same version (RS_SIMGRID_DIR names another folder).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from ..errors import ConfigError

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sg_actors.py")
INSTALL_HINT = (
    "the simulator needs SimGrid: `apt-get install python3-simgrid` (Debian/Ubuntu, Python 3.11) or "
    "`pip install 'reduction-server[sim]'` (builds SimGrid from source: cmake, a C++ compiler, boost)"
)


class SimulatorUnavailable(ConfigError):
    """SimGrid cannot be loaded in this Python."""


def available() -> str | None:
    """None if SimGrid loads here, else why not (with how to install it)."""
    probe = "import sys; sys.path.insert(0, sys.argv[1]); import sg_actors; sg_actors.load_simgrid()"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", probe, os.path.dirname(RUNNER)], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot start {sys.executable}: {exc}; {INSTALL_HINT}"
    return None if proc.returncode == 0 else INSTALL_HINT


def run(spec: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    """Simulates one all-reduce described by `spec` (reducer/simulate/sg_actors.py): {"seconds", "events"}."""
    try:
        proc = subprocess.run(
            [sys.executable, RUNNER], input=json.dumps(spec), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(f"the simulation ran past {timeout:g} s: simulate fewer hosts or larger chunks") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        if "ImportError: simgrid" in proc.stderr or "No module named 'simgrid'" in proc.stderr:
            raise SimulatorUnavailable(INSTALL_HINT)
        raise ConfigError(f"the simulation failed (exit {proc.returncode}): {last}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))
