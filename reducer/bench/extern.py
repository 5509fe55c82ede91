"""Access to the helpers in the source tree's benchmarks/ folder (emulated hosts, CPU monitor).

They are standard-library-only modules kept in benchmarks/ next to the other benchmark
tools; they are not part of the installed `reducer` package unless `benchmarks` is
packaged too, so they are found either as `benchmarks.<name>` or in the checkout that
holds this package.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from ..errors import ConfigError

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the checkout holding reducer/ (and benchmarks/)


def load_benchmarks_module(name: str):
    """benchmarks/<name>.py: importable as `benchmarks.<name>` (when the package is installed or
    the checkout is on sys.path), else loaded from the source checkout next to this package."""
    try:
        return importlib.import_module(f"benchmarks.{name}")
    except ImportError:
        pass
    path = SOURCE_ROOT / "benchmarks" / f"{name}.py"
    if not path.is_file():
        raise ConfigError(f"benchmarks/{name}.py is not available: it ships in the source tree of reduction-server, "
                          "not in the installed package; run the benchmark from a source checkout")
    spec = importlib.util.spec_from_file_location(f"_rsb_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
