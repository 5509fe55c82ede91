"""`reduction-server status` as a user sees it (issue 24 point 5): one snapshot when the output is
not a terminal or with --once, tables that read at 80 columns, groups that ended in their own
section, and `no answer` (with the gist of why) for a reducer that does not answer."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
from conftest import child_env_in_tree
from paths import ROOT

pytestmark = pytest.mark.timeout(120)

REFUSED = (
    "127.0.0.1:1: GetStats failed: UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
    "ipv4:127.0.0.1:1: Failed to connect to remote host: connect: Connection refused (111)"
)


def _group(
    group: str, world: int, connected: int, complete: bool, rounds: int, error: str = "", job: str = "job-7"
) -> dict[str, Any]:
    return dict(
        job=job,
        group=group,
        world_size=world,
        connected=connected,
        complete=complete,
        rounds=rounds,
        bytes_received=123_456_789,
        bytes_sent=123_456_789,
        last_error=error,
        age_s=75.0,
        streams=1,
    )


def _reducer(groups: list[dict[str, Any]], live_groups: int) -> dict[str, Any]:
    counters = dict(
        groups=live_groups,
        connected_workers=2,
        rounds_completed=123_456,
        bytes_received=12_345_678_901,
        bytes_sent=12_345_678_901,
        errors=1,
        rejected=0,
        memory_bytes=268_435_456,
    )
    return dict(
        address="10.0.0.3:2223",
        data_address="10.0.0.3:2222",
        state="serving",
        uptime_s=3723.0,
        counters=counters,
        groups=groups,
    )


def _text(reducers: list[dict[str, Any]], width: int = 80) -> str:
    from rich.console import Console

    from reducer.cli.status import render

    console = Console(width=width, record=True, color_system=None)
    console.print(render(reducers))
    return console.export_text()


def _section(text: str, title: str) -> str:
    """The lines of one table, from its title to the next blank line."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(title))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[start:end])


HEADERS = {
    "reducers": ["control", "data", "state", "up", "groups", "workers"],
    "traffic": ["control", "rounds", "MB in", "MB out", "errors", "rejected", "memory MB"],
    "live groups": ["reducer", "job/group", "ranks", "rounds", "MB in", "MB out", "age"],
    "ended groups": ["reducer", "job/group", "world", "rounds", "MB in", "MB out", "ended"],
}


def test_tables_read_at_80_columns_with_ended_groups_apart() -> None:
    snap = [
        _reducer(
            [
                _group("grads", 2, 2, True, 1234),
                _group("grads/fusion-probe", 2, 1, False, 77),
                _group("old", 4, 3, False, 5, error="rank 2 left mid-round: connection reset by peer"),
                _group("default.torch.994cd9b6563c", 2, 2, True, 9, job="vertex-1234567890123456789"),
            ],
            live_groups=2,
        ),
        {"address": "127.0.0.1:1", "error": REFUSED},
    ]
    text = _text(snap)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text
    for title, headers in HEADERS.items():
        header_line = _section(text, title).splitlines()[1]
        assert header_line.split() == " ".join(headers).split(), (title, header_line)
    live, ended = _section(text, "live groups"), _section(text, "ended groups")
    assert "job-7/grads " in live and "2/2" in live and "1234" in live and "fusion" not in live and "old" not in live
    assert "994cd9b" in live  # a long name folds in its column: the line stays within 80
    assert "job-7/grads/fusion-probe" in ended and "job-7/old" in ended
    assert [ln.split()[-1] for ln in ended.splitlines()[2:]] == ["left", "failed"]
    # the error in full, folded, never clipped
    assert "rank 2 left mid-round: connection reset by peer" in " ".join(text.split())


def test_groups_of_a_reducer_with_no_live_group_are_ended() -> None:
    """The issue's case: `groups 0` on the reducer, yet a group listed as 1/2."""
    text = _text([_reducer([_group("grads", 2, 1, False, 0)], live_groups=0)])
    assert "job-7/grads" in _section(text, "ended groups") and "1/2" not in text
    assert "(none)" in text.split("live groups", 1)[1].split("ended groups", 1)[0]


def test_a_forming_group_stays_live() -> None:
    text = _text([_reducer([_group("grads", 2, 1, False, 0)], live_groups=1)])
    assert "1/2" in _section(text, "live groups") and "ended groups" not in text


def test_a_row_marked_ended_is_taken_at_its_word() -> None:
    from reducer.cli.status import group_ended

    row = _group("grads", 2, 2, True, 3)
    assert not group_ended(row, 1) and group_ended(dict(row, ended=True), 1)
    assert not group_ended(dict(_group("g", 2, 1, False, 9), ended=False), 0)


def test_unreachable_reducer_says_no_answer_with_the_gist() -> None:
    from reducer.cli.status import no_answer_reason

    assert no_answer_reason(REFUSED) == "UNAVAILABLE: Connection refused (111)"
    assert no_answer_reason("something else") == "something else"
    text = _text([{"address": "127.0.0.1:1", "error": REFUSED}])
    row = next(ln for ln in _section(text, "reducers").splitlines() if ln.startswith("127.0.0.1:1"))
    assert row.split()[1:4] == ["-", "no", "answer"]
    assert "no answer from 127.0.0.1:1: UNAVAILABLE: Connection refused (111)" in text


# -- the command against a live reducer -----------------------------------------------------------------


@pytest.fixture
def plane_with_an_ended_group(reducers):
    """A reducer with its control plane, and one group that ran 3 rounds and ended."""
    from reducer import Communicator
    from reducer.control.lifecycle import Lifecycle
    from reducer.control.service import ControlPlane

    (server,) = reducers(1)
    plane = ControlPlane(server, Lifecycle(server, 5.0), host="127.0.0.1", port=0).start()
    with Communicator([server.address], 0, 1, group="finished") as comm:
        for _ in range(3):
            comm.allreduce(np.ones(16, np.float32))
    yield plane
    plane.stop(0)


def _status(args: list[str], stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess:
    env = child_env_in_tree(COLUMNS="80")
    return subprocess.run(
        [sys.executable, "-m", "reducer.cli.main", "status", "--timeout", "3", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


def test_piped_status_prints_one_snapshot_and_exits(plane_with_an_ended_group) -> None:
    """Before: nothing was written until Ctrl-C (the subprocess timed out here)."""
    proc = _status([plane_with_an_ended_group.address, "127.0.0.1:1"])
    assert proc.returncode == 1, proc.stderr  # one reducer gave no answer
    out = proc.stdout
    row = next(ln for ln in _section(out, "ended groups").splitlines() if "local/finished" in ln).split()
    assert (row[2], row[3], row[-1]) == ("1", "3", "left"), out  # world 1, 3 rounds, its member left
    assert "local/finished" not in _section(out, "live groups"), out
    assert "no answer from 127.0.0.1:1: UNAVAILABLE" in out, out


def test_once_in_a_terminal_prints_one_snapshot_and_exits(plane_with_an_ended_group) -> None:
    main, sub = pty.openpty()
    try:
        proc = _status(["--once", plane_with_an_ended_group.address], stdout=sub)
        os.close(sub)
        sub = -1
        chunks = []
        while True:
            try:
                data = os.read(main, 65536)
            except OSError:  # the pty's other side is closed: all read
                break
            if not data:
                break
            chunks.append(data)
    finally:
        if sub >= 0:
            os.close(sub)
        os.close(main)
    out = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, proc.stderr
    assert "reducers" in out and "local/finished" in out, out


def test_reducer_marks_the_groups_that_ended() -> None:
    """A group whose workers left is listed once, marked ended (not as a live 0/1 group beside it)."""
    import numpy as np

    import reducer

    with reducer.ReducerServer(host="127.0.0.1", port=0).start() as srv:
        comm = reducer.Communicator([f"127.0.0.1:{srv.port}"], rank=0, world_size=1, group="ends")
        x = np.arange(8, dtype=np.int32)
        comm.allreduce(x)
        live = [g for g in srv.group_stats() if g["group"] == "ends"]
        assert live and all(not g["ended"] for g in live), live
        comm.close()
        deadline = time.monotonic() + 10
        rows = []
        while time.monotonic() < deadline:
            rows = [g for g in srv.group_stats() if g["group"] == "ends"]
            if rows and all(g["ended"] for g in rows):
                break
            time.sleep(0.05)
        assert rows and all(g["ended"] for g in rows), rows
        assert rows[0]["rounds"] == 1
