"""A worker facing a lying reducer or co-member (issue 25, points 1 and 7).

Everything a worker reads from a reducer, and from the other workers through the failover
exchange, is bounded by what this worker itself has in flight (docs/protocol.md, "Reducer
failover" and section 2; docs/security.md). Each test puts one real worker (rank 0 of a group of
two whose rank 1 is imaginary) in front of tests/lying_reducer.py's `LyingReducer`, which tells one
lie: entry counts in the failover exchange that wrap the table's size or reach 2^63, rounds far
away, results longer than the chunk sent or for a round never started, CLEAR 2^64-1, a BYE, 4 KiB
error texts full of control characters. The worker runs in a subprocess, so that a crash (the old
code's heap overflow) fails the test instead of the test run; it must raise the one clear
reducer.errors exception and nothing else: exit normally, within its timeouts, its peak RSS
barely moved, no raw control character in the message or the log.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from attack_tools import BYE, DATA, ERR_PROTOCOL, ERR_SHUTDOWN, F32, SUM, Status
from conftest import child_env_in_tree
from lying_reducer import ERR_FAILOVER, EXCHANGE_TAG, Header, LyingReducer, clear_frame, error_frame, result_for

pytestmark = pytest.mark.timeout(120)

N = 1024  # float32 elements of the worker's round (4096 bytes: one chunk)
RSS_GROWTH_LIMIT = 256 << 20  # the worker's peak RSS may grow this much at most (ASan included)

# The worker: one all-reduce of arange(N) as rank 0 of 2; prints what happened as JSON.
_WORKER = r"""
import json, logging, resource, sys
args = json.loads(sys.argv[1])
lines = []
class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
logging.getLogger("reducer").addHandler(Keep())
logging.getLogger("reducer").setLevel(logging.DEBUG)
import numpy as np
import reducer
from reducer._native import core
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
out = {"error": None}
client = None
try:
    client = core.Client([args["address"]], 0, 2, "lies", "local", 10.0, 10.0, "", 1, 1 << 20,
                         failover=args["failover"])
    a = np.arange(args["n"], dtype=np.float32)
    client.allreduce(a, "float32", "sum")
    out["sum"] = float(a.astype(np.float64).sum())
    if args["idle"]:  # then idle, its links read by the idle-progress thread only, then a round
        client.progress_while_idle(0.05)
        import time
        time.sleep(args["idle"])
        out["connected_after_idle"] = client.connected
        client.allreduce(np.arange(args["n"], dtype=np.float32), "float32", "sum")
except reducer.ReductionError as exc:
    out["error"] = type(exc).__name__
    out["message"] = str(exc)
finally:
    if client is not None:
        client.close()
out["rss_growth"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
out["log"] = lines
print(json.dumps(out))
"""


def run_worker(address: str, failover: bool = True, idle: float = 0.0) -> dict[str, Any]:
    """Runs the worker against `address`; returns its report after checking it ended cleanly.
    idle > 0: after its round it lets the idle-progress thread read its links for `idle` seconds,
    then starts another round."""
    env = child_env_in_tree()
    proc = subprocess.run(
        [sys.executable, "-c", _WORKER, json.dumps({"address": address, "failover": failover, "n": N, "idle": idle})],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    assert proc.returncode == 0, f"the worker died (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["rss_growth"] < RSS_GROWTH_LIMIT, report["rss_growth"]
    return report


def printable(text: str) -> bool:
    return all(32 <= ord(c) < 127 for c in text)


def expect_error(report: dict[str, Any], kind: str, *parts: str) -> str:
    assert report["error"] == kind, report
    message = report["message"]
    for p in parts:
        assert p in message, (p, message)
    assert printable(message), message
    assert all(printable(line) for line in report["log"]), report["log"]
    return message


# ---- the pure checks, in C++ under ASan/UBSan ------------------------------------------------------


@pytest.mark.sanitize
@pytest.mark.timeout(300)  # a sanitized build: seconds alone, minutes on a loaded machine
def test_worker_checks_unit_tests_in_cpp(tmp_path):
    """tests/cpp/test_worker_lies.cc: summary rows with wrapped, 2^63, negative and out-of-window
    counts and rounds, entries out of their rows, the old wrapped table width (a heap overflow
    there), plan() against the old algorithm on random tables, RESULT/CLEAR checks, peer_text."""
    from cpp_build import SANITIZE, build_and_run

    sources = [
        "tests/cpp/test_worker_lies.cc",
        "csrc/client/failover.cc",
        "csrc/client/peer_text.cc",
        "csrc/client/reducer_frames.cc",
        "csrc/common/common.cc",
        "csrc/common/text.cc",
    ]
    build_and_run(tmp_path, "test_worker_lies", sources, flags=SANITIZE)


# ---- the failover exchange ----------------------------------------------------------------------

U64 = 1 << 64
WRAPPED = (U64 + 5) // 6  # 2 x WRAPPED x 3 words = 2^64 + 2: a 2-word table on the old code


def failover_script(row: tuple | None = None, entries: list | None = None):
    """on_data for a failover: the first connection answers the worker's round with ERROR Failover
    (another worker lost a reducer), so the worker reconnects and runs the exchange; the imaginary
    rank 1 reports `row` (oldest, next, entries) in the first all-reduce and `entries` (flat
    triples) in the second; None: the honest (0, 1, 1) and [(0, -1, -1)]."""
    row = (0, 1, 1) if row is None else row
    entries = [0, -1, -1] if entries is None else entries

    def on_data(conn: int, h: Header, payload: bytes) -> bytes | None:
        if conn == 0:
            return error_frame(ERR_FAILOVER, b"another worker lost a reducer")
        if h.tag != EXCHANGE_TAG:
            return None  # the repair round (and any other): the honest result
        words = list(struct.unpack(f"<{len(payload) // 8}q", payload))
        lie = list(row) if h.round == 0 else entries  # the summaries (round 0 of the session), then the entries
        half = len(words) // 2
        for i, v in enumerate(lie[:half]):
            words[half + i] = (words[half + i] + v + (1 << 63)) % U64 - (1 << 63)  # rank 1's row
        return result_for(h, struct.pack(f"<{len(words)}q", *words))

    return on_data


@pytest.mark.sanitize
def test_an_honest_exchange_through_the_lying_reducer_completes():
    """The control: with honest rows the same script takes the worker through a whole failover
    (exchange, then the round reduced again), so the lies below are told where they count."""
    with LyingReducer(failover_script()) as fake:
        report = run_worker(fake.address)
    assert report["error"] is None, report
    assert report["sum"] == float(np.arange(N, dtype=np.float64).sum())
    tags = [h.tag for _c, h in fake.data]
    assert tags.count(EXCHANGE_TAG) == 2, tags  # both all-reduces of the exchange ran
    assert not fake.errors


@pytest.mark.sanitize
@pytest.mark.parametrize(
    "case,row",
    [
        ("wrapped count", (0, 1, WRAPPED)),
        ("2^63 count", (0, 1, 1 << 63)),
        ("2^63-1 count", (0, 1, (1 << 63) - 1)),
        ("2^27 count", (0, 1, 1 << 27)),
        ("negative count", (0, 1, -1)),
        ("next below oldest", (5, 1, 1)),
        ("rounds far ahead", (0, 1 << 40, 1)),
    ],
)
def test_lying_summary_rows_are_a_clear_protocol_error(case, row):
    """A row of the first exchange that no worker could send fails the rounds with one
    ProtocolError naming the rank, before anything is sized from it (the old code sized the second
    table as 2 x count x 3 words: a wrapped count overflowed the heap, 2^63 wrote into an empty
    table, 2^27 allocated 6 GiB)."""
    with LyingReducer(failover_script(row=row)) as fake:
        report = run_worker(fake.address)
    expect_error(report, "ProtocolError", "failover exchange: rank 1")
    assert not fake.errors
    assert sum(1 for _c, h in fake.data if h.tag == EXCHANGE_TAG) == 1  # never a second exchange


@pytest.mark.sanitize
@pytest.mark.parametrize(
    "case,count,entries,why",
    [
        ("round outside its rounds", 1, [1 << 40, -1, -1], "outside its rounds [0, 1)"),
        ("bytes past the round", 2, [0, -1, -1, 0, 0, 1 << 40], "reports bytes [0, 1099511627776) of round 0"),
        ("a span without its marker", 1, [0, 0, 8], "before its marker"),
        ("a broken marker", 1, [0, -1, 5], "invalid entry"),
        ("overlapping spans", 3, [0, -1, -1] + [0, 0, 4] * 2, "out of order"),
    ],
)
def test_lying_entries_are_a_clear_protocol_error(case, count, entries, why):
    """Entries of the second exchange outside what the row's rounds and this worker allow."""
    with LyingReducer(failover_script(row=(0, 1, count), entries=entries)) as fake:
        report = run_worker(fake.address)
    expect_error(report, "ProtocolError", "failover exchange: rank 1", why)
    assert not fake.errors


def test_a_reducer_that_keeps_saying_failover_fails_the_round():
    """ERROR Failover to every frame, the exchange's too: the worker starts a bounded number of
    failover sessions (16 + one per reducer) without a round finishing, then fails (it looped for
    ever before)."""
    with LyingReducer(lambda _c, _h, _p: error_frame(ERR_FAILOVER, b"again"), max_conns=64) as fake:
        report = run_worker(fake.address)
    expect_error(report, "PeerLostError", "17 failover sessions without a round finishing")
    assert len({c for c, _h in fake.data}) == 18  # the first session and 17 failover sessions


# ---- frames a reducer sends ---------------------------------------------------------------------


def longer_chunk(_conn: int, h: Header, payload: bytes) -> bytes:
    return result_for(h, payload + payload)  # twice the bytes this worker sent, same round and shard


def larger_round(_conn: int, h: Header, payload: bytes) -> bytes:
    bigger = replace(h, total=2 * h.total, shard=2 * h.shard, offset=h.length)
    return result_for(bigger, payload)  # the chunk after the one sent, of a round twice as large


def wrong_round(_conn: int, h: Header, payload: bytes) -> bytes:
    return result_for(replace(h, round=7), payload)


def clear_everything(_conn: int, h: Header, payload: bytes) -> bytes:
    return clear_frame(U64 - 1) + result_for(h, payload)  # read before the result


def bye_instead(_conn: int, _h: Header, _payload: bytes) -> bytes:
    text = b"bye\n\x1b[2J" * 400
    return Header(BYE, 0, 0, 0, len(text), 0, 0, 0, 0, 0).pack() + text


@pytest.mark.sanitize
@pytest.mark.parametrize(
    "lie,why",
    [
        (longer_chunk, "outside the shard"),
        (larger_round, "where this worker sent 4096 and 4096"),
        (wrong_round, "round 7 is not in flight"),
        (clear_everything, "cleared round 18446744073709551615 before this worker said it had the results"),
        (bye_instead, "unexpected frame type"),
    ],
    ids=["longer-result", "result-of-a-larger-round", "wrong-round", "clear-2^64-1", "bye"],
)
@pytest.mark.parametrize("failover", [True, False], ids=["failover", "no-failover"])
def test_lying_frames_are_a_clear_protocol_error(lie, why, failover):
    if lie is clear_everything and not failover:
        why = "a CLEAR (round 18446744073709551615) on a connection without reducer failover"
    with LyingReducer(lie) as fake:
        report = run_worker(fake.address, failover=failover)
    expect_error(report, "ProtocolError", fake.address, why)
    assert not fake.errors


# ---- frames sent to an idle worker --------------------------------------------------------------


@pytest.mark.sanitize
@pytest.mark.parametrize(
    "lie,kind,why",
    [
        (
            result_for(Header(DATA, F32, SUM, 0, 4096, 7, 4096, 4096, 0, 0), bytes(4096)),
            "ProtocolError",
            "round 7 is not in flight",
        ),
        (clear_frame(U64 - 1), "ProtocolError", "cleared round 18446744073709551615"),
        (b"\xff" * 64, "ProtocolError", "unknown frame type 255"),
        (error_frame(ERR_PROTOCOL, b"idle lie \x1b[2J"), "ProtocolError", "idle lie \\x1b[2J"),
        # Not a lie that fails: every reducer "lost" while idle, and this one still answers, so the
        # next round reconnects and works (issue 29.5; tests/client/test_recovery.py).
        (error_frame(ERR_SHUTDOWN, b"going away"), None, ""),
    ],
    ids=["result-never-started", "clear-2^64-1", "garbage", "error-text", "shutdown"],
)
def test_a_lie_to_an_idle_worker_is_read_by_its_idle_thread_and_raised_by_the_next_round(lie, kind, why):
    """Idle progress (Client.progress_while_idle) reads a reducer's frames with no call inside the
    client: a frame sent unasked to a worker that has its results is parsed by the same checks as
    in a call, drops the session there (not connected any more when the worker comes back), and
    the next round raises the one clear error; the process ends normally."""
    with LyingReducer(idle_lie=(0.3, lie)) as fake:
        report = run_worker(fake.address, idle=1.5)
    assert report["sum"] == float(np.arange(N, dtype=np.float64).sum()), report  # the honest first round
    assert report["connected_after_idle"] is False, report  # the idle thread read the lie
    if kind is None:
        assert report["error"] is None, report
    else:
        expect_error(report, kind, why)
    assert not fake.errors


# ---- text from a reducer (issue 25 point 7) -------------------------------------------------------

HOSTILE = (b"first line\nWARNING forged log line\r\n\x1b[31mred\x1b[0m \x00nul \x7f\xff\\" * 80)[:4096]


def check_quoted(message: str) -> None:
    """The hostile text arrives escaped (printable ASCII only) and capped at 256 characters."""
    assert printable(message), message
    assert "first line\\nWARNING forged log line\\r\\n\\x1b[31mred\\x1b[0m \\x00nul \\x7f\\xff\\\\" in message
    assert "... (4096 bytes)" in message
    quoted = message[message.index("first line") : message.index("... (4096 bytes)")]
    assert 250 <= len(quoted) <= 256, len(quoted)


def test_error_text_is_escaped_and_capped_in_the_exception():
    with LyingReducer(lambda _c, _h, _p: error_frame(ERR_PROTOCOL, HOSTILE)) as fake:
        report = run_worker(fake.address, failover=False)
    check_quoted(expect_error(report, "ProtocolError", f"reducer {fake.address}: "))


def test_error_text_is_escaped_and_capped_in_the_log():
    """With failover a reducer's Shutdown makes it a lost reducer: its text reaches the log's
    warning and, with no reducer left, the exception."""
    with LyingReducer(lambda _c, _h, _p: error_frame(ERR_SHUTDOWN, HOSTILE)) as fake:
        report = run_worker(fake.address, failover=True)
    check_quoted(expect_error(report, "PeerLostError", "every reducer is lost"))
    warnings = [line for line in report["log"] if "lost" in line and "first line" in line]
    assert warnings, report["log"]
    for line in warnings:
        check_quoted(line)


def test_refusal_text_is_escaped_and_capped():
    with LyingReducer(reply=(Status.OVER_LIMIT, HOSTILE)) as fake:
        report = run_worker(fake.address)
    check_quoted(expect_error(report, "ConnectError", "refused the connection (over a reducer limit)"))
