"""Whole-machine CPU usage sampled from /proc/stat in a background thread.

    with CpuMonitor(interval=0.2) as cpu:
        run_benchmark()
    print(cpu.mean_percent, cpu.max_percent)
    cpu.warn_if_over(70.0, logger)

Busy = everything but idle and iowait (guest time is already inside user).
`mean_percent` is over the whole monitored period (first to last snapshot),
`max_percent` the busiest sampling interval.  Standard library only.
"""

from __future__ import annotations

import logging
import os
import threading
import time

__all__ = ["CpuMonitor", "read_cpu_times"]


def read_cpu_times(path: str = "/proc/stat") -> tuple[int, int]:
    """(busy, total) jiffies of the aggregate 'cpu' line."""
    with open(path) as f:
        for line in f:
            if line.startswith("cpu "):
                v = [int(x) for x in line.split()[1:]]
                break
        else:
            raise RuntimeError(f"no aggregate cpu line in {path}")
    # user nice system idle iowait irq softirq steal [guest guest_nice]
    total = sum(v[:8])
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return total - idle, total


class CpuMonitor:
    def __init__(self, interval: float = 0.2, path: str = "/proc/stat"):
        self.interval = float(interval)
        self.path = path
        self.samples: list[float] = []  # percent busy per interval
        self._first: tuple[int, int] | None = None
        self._last: tuple[int, int] | None = None
        self._prev: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.ncpu = os.cpu_count() or 1
        self.t_start = self.t_end = 0.0

    def _sample(self) -> None:
        cur = read_cpu_times(self.path)
        with self._lock:
            if self._prev is not None:
                db, dt = cur[0] - self._prev[0], cur[1] - self._prev[1]
                if dt > 0:
                    self.samples.append(100.0 * db / dt)
            self._prev = cur
            self._last = cur

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> CpuMonitor:
        self._first = self._prev = self._last = read_cpu_times(self.path)
        self.t_start = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="cpu-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._sample()
            self.t_end = time.monotonic()

    def __enter__(self) -> CpuMonitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def mean_percent(self) -> float:
        """Mean busy percent of the whole machine (100 = all cores busy)."""
        with self._lock:
            if self._first is None or self._last is None:
                return 0.0
            db, dt = self._last[0] - self._first[0], self._last[1] - self._first[1]
        return 100.0 * db / dt if dt > 0 else 0.0

    @property
    def max_percent(self) -> float:
        with self._lock:
            return max(self.samples) if self.samples else self.mean_percent

    def summary(self) -> str:
        return f"cpu mean {self.mean_percent:.0f}% max {self.max_percent:.0f}% of {self.ncpu} cores"

    def warn_if_over(self, threshold: float = 70.0, logger: logging.Logger | None = None) -> bool:
        """Log a warning (and return True) if the mean CPU use exceeded
        `threshold` percent: the result may then be CPU-bound, not network-bound."""
        mean = self.mean_percent
        if mean <= threshold:
            return False
        (logger or logging.getLogger(__name__)).warning(
            "CPU busy %.0f%% on average (max %.0f%%) > %.0f%%: the measurement may be limited "
            "by this machine's %d cores rather than by the emulated network",
            mean,
            self.max_percent,
            threshold,
            self.ncpu,
        )
        return True
