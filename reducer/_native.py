"""Loads the C++ core, routes its log lines into Python's logging ("reducer.core") and applies
the process-wide socket settings (RS_TCP_CONGESTION)."""

from __future__ import annotations

import atexit
import logging

from . import config

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


def set_tcp_congestion(name: str | None = None) -> str:
    """Set the TCP congestion control of every data connection this process opens or accepts from
    now on (workers, reducers, ring): `name` (e.g. 'cubic', 'bbr'; 'auto': cubic where this process
    may use it, else the kernel's; '' or 'default': the kernel's), else RS_TCP_CONGESTION (default
    'auto'). Returns the setting in force ('' = the kernel's). ConfigError if the kernel refuses a
    named algorithm (not available, or not allowed for this process)."""
    value = (config.get("tcp_congestion", name) or "").strip()
    try:
        return str(_core.set_tcp_congestion(value))
    except Exception as exc:
        src = f"{config.SETTINGS['tcp_congestion'].env}={value!r}" if name is None else repr(value)
        raise type(exc)(f"{src}: {exc}") from None


set_tcp_congestion()

__all__ = ["core", "set_tcp_congestion"]
