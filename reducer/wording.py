"""Small wording helpers shared by the command-line output and the library's log lines."""

from __future__ import annotations


def plural(n: int, word: str) -> str:
    """'1 worker', '2 workers'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
