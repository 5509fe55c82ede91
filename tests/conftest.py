"""Shared fixtures: reducers in this process, worker processes on loopback."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from reducer.launch import CLEARED_ENV

HERE = os.path.dirname(os.path.abspath(__file__))
# tests/ (the shared helper modules) and each folder of tests (tests/<part>/test_*.py, by the part of
# the code they test) on sys.path: some test modules import others' helpers by module name
# (`from test_fusion import run_workers`), whichever folder they are in and in any order.
for _dir in [HERE, *sorted(e.path for e in os.scandir(HERE) if e.is_dir() and e.name not in ("cpp", "__pycache__"))]:
    if _dir not in sys.path:
        sys.path.insert(0, _dir)
from paths import ROOT  # noqa: E402 (tests/ on sys.path first)

MAX_POOL = 5

# Variables of the test runner's own environment that would change what a child process discovers
# (the launcher's list), how it authenticates, logs or sizes its threads.
CHILD_ENV_DROP = (*CLEARED_ENV, "RS_AUTH_TOKEN", "RS_AUTH_TOKEN_FILE", "RS_LOG_LEVEL", "RS_THREADS")


def child_env(drop: Sequence[str] = (), **extra: str) -> dict[str, str]:
    """This process's environment without CHILD_ENV_DROP (and `drop`), unbuffered, plus `extra`."""
    gone = set(CHILD_ENV_DROP) | set(drop)
    env = {k: v for k, v in os.environ.items() if k not in gone}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def child_env_in_tree(**extra: str) -> dict[str, str]:
    """child_env() for a `python -c` child that imports this tree's reducer: the repository root
    first on PYTHONPATH, what was there (a sanitized build's copy) kept after it."""
    before = os.environ.get("PYTHONPATH")
    return child_env(PYTHONPATH=str(ROOT) + (os.pathsep + before if before else ""), **extra)


# `reduction-server` as the tests run it: this interpreter and the module, no installed script.
CLI = (sys.executable, "-m", "reducer.cli.main")
SERVE = (*CLI, "serve")


def serve_argv(
    *args: str, host: str | None = "127.0.0.1", port: int | str | None = 0, threads: int | None = 1
) -> list[str]:
    """The one `serve` command line of the tests: `threads` reducer threads on host:port (0: any free
    port), then `args`. None leaves that flag out (the cluster spec or the default decides)."""
    argv = list(SERVE)
    for flag, value in (("--threads", threads), ("--host", host), ("--port", port)):
        if value is not None:
            argv += [flag, str(value)]
    return [*argv, *args]


def start_serve(*args: str, env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.Popen:
    """serve_argv(*args, **kwargs) in a subprocess in the repository root (env: child_env_in_tree()),
    stdout and stderr together in one text pipe (read it with child_lines.ChildLines)."""
    popen = {k: kwargs.pop(k) for k in ("preexec_fn",) if k in kwargs}
    return subprocess.Popen(
        serve_argv(*args, **kwargs),
        env=child_env_in_tree() if env is None else env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`soak` tests (the long variants: repeats, the full fuzz time, the simulator's large cases)
    are opt-in: skipped unless the marker expression names them (`pytest -m soak`)."""
    if "soak" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="opt-in long variant: pytest -m soak")
    for item in items:
        if item.get_closest_marker("soak") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def pool():
    """Up to 5 worker processes (spawned once) that run functions from tests/tasks.py."""
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=MAX_POOL, mp_context=ctx) as ex:
        # Warm every process up (imports numpy and the extension once).
        list(ex.map(_warm, range(MAX_POOL)))
        yield ex


def _warm(_: int) -> int:
    import tasks  # noqa: F401

    return os.getpid()


def run_ranks(
    pool: ProcessPoolExecutor, fn: Callable[..., Any], world: int, timeout: float = 120.0, **kwargs: Any
) -> list[Any]:
    """Run fn(rank=r, world=world, **kwargs) in `world` processes at once; results by rank.

    Exceptions raised in a worker are re-raised here (the first by rank).
    """
    assert world <= MAX_POOL
    futs = [pool.submit(fn, rank=r, world=world, **kwargs) for r in range(world)]
    results: list[Any] = []
    errors: dict[int, BaseException] = {}
    for r, f in enumerate(futs):
        try:
            results.append(f.result(timeout=timeout))
        except BaseException as exc:  # collect, then raise the first
            errors[r] = exc
            results.append(exc)
    if errors:
        raise next(iter(errors.values()))
    return results


def run_ranks_collect(
    pool: ProcessPoolExecutor, fn: Callable[..., Any], world: int, timeout: float = 120.0, **kwargs: Any
) -> list[Any]:
    """Like run_ranks, but returns exceptions in place of results instead of raising."""
    futs = [pool.submit(fn, rank=r, world=world, **kwargs) for r in range(world)]
    out: list[Any] = []
    for f in futs:
        try:
            out.append(f.result(timeout=timeout))
        except BaseException as exc:
            out.append(exc)
    return out


@pytest.fixture
def reducers(request):
    """Factory: reducers(n, **kw) -> list of started ReducerServer on 127.0.0.1 (stopped after the test)."""
    import reducer

    started: list[Any] = []

    def make(n: int = 1, **kw: Any) -> list[Any]:
        kw.setdefault("host", "127.0.0.1")
        kw.setdefault("port", 0)
        servers = [reducer.ReducerServer(**kw).start() for _ in range(n)]
        started.extend(servers)
        return servers

    yield make
    for s in started:
        s.stop()


def addresses(servers: Sequence[Any]) -> list[str]:
    return [s.address for s in servers]
