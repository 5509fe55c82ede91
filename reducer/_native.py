"""Loads the C++ core and routes its log lines into Python's logging ("reducer.core")."""
from __future__ import annotations

import atexit
import logging

try:
    from . import _core
except ImportError as exc:  # pragma: no cover - only without a built extension
    raise ImportError(
        "reducer._core (the C++ core of reduction-server) is not built: install the package with "
        "`pip install .` (or `python setup.py build_ext --inplace` in a source checkout)"
    ) from exc

_core_logger = logging.getLogger("reducer.core")


def _forward(level: int, message: str) -> None:
    _core_logger.log(level, message)


_core.set_log_callback(_forward)
# C++ threads may still log while the interpreter shuts down: stop forwarding first.
atexit.register(_core.set_log_callback, None)

core = _core
__all__ = ["core"]
