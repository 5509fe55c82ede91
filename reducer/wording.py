"""Small wording helpers shared by the command-line output and the library's log lines."""

from __future__ import annotations


def plural(n: int, word: str) -> str:
    """'1 worker', '2 workers'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def install_hint(extra: str, packages: str) -> str:
    """How to get an optional dependency, in words that work: the package is not on a package index.

    `extra` is the pyproject extra ("torch", "plot", "vertex"), `packages` what it pulls in
    ("torch", "matplotlib"). A user has either a clone (editable install) or a wheel built by
    scripts/build-wheel.sh; installing the dependency itself works with either.
    """
    return (
        f"pip install {packages} (or reinstall this package with its '{extra}' extra: "
        f"pip install -e '.[{extra}]' from a clone, pip install 'dist/reduction_server-*.whl[{extra}]' from a wheel)"
    )
