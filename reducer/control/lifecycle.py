"""The life of a served reducer: serving -> draining -> drained, whoever asks for the drain.

SIGTERM/SIGINT (reduction-server serve) and the Drain RPC both end up in Lifecycle.drain(); the
health service and the metrics subscribe to the changes. Pure Python: no grpc here.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from reducer import config

log = logging.getLogger(__name__)

SERVING = "serving"  # the data plane accepts workers and groups
DRAINING = "draining"  # no new connections; rounds in flight finish (up to the drain timeout)
DRAINED = "drained"  # the data plane is stopped
STATES = (SERVING, DRAINING, DRAINED)

Listener = Callable[[str], None]


class Lifecycle:
    """Drains one started ReducerServer at most once, in a background thread.

    ``drain(timeout)`` returns at once; ``wait(timeout)`` blocks until the data plane has stopped.
    Draining is ReducerServer.drain(): stop accepting connections, let rounds in flight finish for
    up to `timeout` seconds, close every connection.
    """

    def __init__(self, server: Any, drain_timeout: float = 10.0) -> None:
        config.check_seconds(drain_timeout, "drain_timeout", zero=True)  # (ConfigError is a ValueError)
        self.server = server
        self.drain_timeout = float(drain_timeout)
        self.started_at = time.monotonic()
        self._state = SERVING
        self._reason = ""
        self._lock = threading.RLock()  # held while listeners run: they see the changes in order
        self._done = threading.Event()
        self._listeners: list[Listener] = []

    @property
    def state(self) -> str:
        return self._state

    @property
    def reason(self) -> str:
        """Who asked for the drain ("" while serving)."""
        return self._reason

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started_at

    def subscribe(self, listener: Listener) -> None:
        """Call listener(state) now and on every change (from the thread that makes it; keep it quick)."""
        with self._lock:
            self._listeners.append(listener)
            listener(self._state)

    def drain(self, timeout: float | None = None, reason: str = "") -> bool:
        """Start draining (timeout: seconds for rounds in flight, None = the default).

        Returns False when a drain had already started (the first one's timeout holds).
        ValueError (ConfigError) for a timeout that is not a finite number (inf or NaN) or more
        than config.MAX_SECONDS; <= 0 means the default."""
        if timeout is not None and (timeout > 0 or not math.isfinite(timeout)):
            config.check_seconds(timeout, "drain timeout")
        seconds = self.drain_timeout if timeout is None or timeout <= 0 else float(timeout)
        with self._lock:
            if self._state != SERVING:
                return False
            self._reason = reason or "drain"
            log.info("draining (%s): no new connections; rounds in flight get up to %gs", self._reason, seconds)
            self._set(DRAINING)
        threading.Thread(target=self._run, args=(seconds,), name="rs-drain", daemon=True).start()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """True once the data plane has stopped (False if `timeout` seconds passed first)."""
        return self._done.wait(timeout)

    def _run(self, seconds: float) -> None:
        try:
            self.server.drain(seconds)
        except Exception:  # the data plane is gone either way; say why
            log.exception("drain failed")
        finally:
            self._set(DRAINED)
            self._done.set()

    def _set(self, state: str) -> None:
        with self._lock:
            self._state = state
            for listener in self._listeners:
                try:
                    listener(state)
                except Exception:
                    log.exception("lifecycle listener failed on %s", state)
