"""Simulated all-reduce times of large jobs: this project's rs and ring on SimGrid.

``simulate(...)`` returns one row per (algorithm, size); ``reduction-server simulate`` is its command
line, docs/performance.md ("Simulated jobs") its calibration on the emulated runs. SimGrid is an
optional dependency (reducer.simulate.engine says how to install it).
"""

from __future__ import annotations

from .engine import SimulatorUnavailable, available
from .model import Network, Reducers
from .params import Settings
from .rows import simulate

__all__ = ["Network", "Reducers", "Settings", "SimulatorUnavailable", "available", "simulate"]
