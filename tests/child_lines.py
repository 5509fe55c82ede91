"""A child process's output, line by line, with a deadline: the one way tests read a child's pipe.

select() on a pipe's Python file object followed by readline() misses lines that are already in
the file object's buffer (readline reads ahead: select() then sees an empty pipe and waits while
the line the test wants sits in the buffer), and a bare readline() waits forever on a child that
hangs. ChildLines reads the pipe in a thread of its own (text or binary; bytes are decoded as
UTF-8) and lets a test wait for a line with a deadline.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import IO, Any

Match = str | re.Pattern[str] | Callable[[str], bool]


def _matches(match: Match, line: str) -> bool:
    if isinstance(match, str):
        return match in line
    if isinstance(match, re.Pattern):
        return match.search(line) is not None
    return bool(match(line))


class ChildLines:
    """Collects the lines of `pipe` (a child's stdout or stderr) until it closes."""

    def __init__(self, pipe: IO[Any], name: str = "child") -> None:
        self.name = name
        self._pipe = pipe
        self._lines: list[str] = []
        self._eof = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, name=f"lines-{name}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for raw in self._pipe:
                line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
                with self._cond:
                    self._lines.append(line)
                    self._cond.notify_all()
        except (OSError, ValueError):  # closed under us
            pass
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def lines(self) -> list[str]:
        with self._cond:
            return list(self._lines)

    def text(self) -> str:
        return "".join(self.lines())

    @property
    def closed(self) -> bool:
        """The pipe has ended (the child closed it or exited)."""
        with self._cond:
            return self._eof

    def wait_for(self, match: Match, timeout: float) -> str:
        """The first line so far (from the start) that contains `match` (a str), matches it (a
        compiled pattern, re.search) or satisfies it (a callable); AssertionError with what was
        read when no such line came within `timeout` seconds or the pipe ended without one."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self._lines[seen:]:
                    if _matches(match, line):
                        return line
                seen = len(self._lines)
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    why = "its output ended" if self._eof else f"{timeout:g} s passed"
                    raise AssertionError(
                        f"{self.name}: no line matching {match!r} ({why}); output so far:\n{''.join(self._lines)}"
                    )
                self._cond.wait(min(left, 1.0))

    def search(self, pattern: str | re.Pattern[str], timeout: float) -> re.Match[str]:
        """re.search(pattern) in the first line where it matches, waiting as wait_for() does."""
        regex = re.compile(pattern)
        found = regex.search(self.wait_for(regex, timeout))
        assert found is not None
        return found

    def join(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) for the pipe to end; True once it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
