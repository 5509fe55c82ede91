"""The launcher's guard: when `reduction-server launch` dies, even by SIGKILL, nothing of its job
outlives it.

Every child of the launcher leads a process group of its own (a session), and what it starts stays
in that group unless it leaves it (setsid, a daemon). The launcher stops those groups itself when a
job ends, fails or is interrupted; its direct children also die with it (PR_SET_PDEATHSIG). What
was left was a SIGKILLed launcher's grandchildren (a worker started through a wrapper, torchrun, a
shell): they lived on with parent 1.

The guard is a small process in a session of its own (so the terminal's Ctrl-C and a kill of the
launcher's process group do not reach it), started before any child. Its stdin is a pipe only the
launcher holds; the launcher writes "+PGID" for every child it starts, and "done" once it has
stopped the job itself. End of input without "done" means the launcher died: the guard sends
SIGKILL to every group it was told of, then exits. It runs this file with the standard library
alone (python -I -S launch_guard.py), and imports nothing of the package.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from typing import IO

log = logging.getLogger("reducer.launch")

DONE = b"done"


def watch(lines: IO[bytes]) -> list[int]:
    """The guard's loop: the groups to kill once `lines` end without DONE (empty after DONE)."""
    groups: list[int] = []
    for line in lines:
        word = line.strip()
        if word == DONE:
            return []
        if word.startswith(b"+") and word[1:].isdigit():
            groups.append(int(word[1:]))
    return groups


def main() -> int:
    for pgid in watch(sys.stdin.buffer):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:  # the group is gone already
            pass
    return 0


class Guard:
    """The launcher's side: start() before the first child, started(pid) after each, done() once
    the job's groups are stopped. A guard that cannot start or has died is logged once; the job
    runs on without it (what it cleans up is only what a SIGKILLed launcher leaves behind)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            log.warning("no guard process (%s): if the launcher is killed, its workers' children may outlive it", exc)

    def _send(self, line: bytes) -> None:
        if self.proc is None or self.proc.stdin is None:
            return
        try:
            self.proc.stdin.write(line + b"\n")
            self.proc.stdin.flush()
        except OSError as exc:
            log.warning("the guard process (pid %d) is gone (%s): the job runs on without it", self.proc.pid, exc)
            self.proc.stdin = None

    def started(self, pgid: int) -> None:
        self._send(b"+%d" % pgid)

    def done(self) -> None:
        if self.proc is None:
            return
        self._send(DONE)
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc = None


if __name__ == "__main__":
    sys.exit(main())
