"""Tenants and the reducer's memory budget (issue 25, point 2; docs/security.md, "Memory").

One job (with its credential, from one address or several) or one address (without a secret,
under any number of job ids) may hold only its share of the server-wide budget, so a greedy
tenant cannot keep a second job from running; groups that go idle give their memory back and
take it again with their next chunk; a refusal names the limit it hit.

Hellos reserve memory without committing it (the arenas are mapped, not touched), so these
budgets cost nothing; the reducer runs in this process and peers use 127.0.0.1..127.0.0.9 as
distinct addresses (tests/attack_tools.py).
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence

import numpy as np
import pytest
from attack_tools import (
    ERR_INTERNAL,
    ERROR,
    I32,
    RESULT,
    GoodGroup,
    RawWorker,
    Status,
    close_all,
    job_credential,
    job_key,
    peers,
    serve,
    wait_until,
)
from child_lines import ChildLines
from conftest import child_env_in_tree, serve_argv, start_serve
from paths import ROOT

import reducer

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
SLOTS = 4  # the reducer's default group_slots
HOG_CHUNK = 1 * MiB
HOG_NEED = SLOTS * 3 * HOG_CHUNK  # a world-1 group: slots x (1 + 2) x chunk = 12 MiB
SECRET = "tenant-budget-secret"


def hog(port: int, i: int, *, job: bytes, source: str, key: bytes | None = None) -> tuple[RawWorker, object]:
    """One hello of a greedy tenant: a world-1 group (complete at once: it reserves at once)."""
    w = RawWorker(port, 0, 1, group=f"hog-{i}".encode(), job=job, key=key, chunk=HOG_CHUNK, source=source)
    return w, w.reply(timeout=10)


def greedy(
    port: int, count: int, *, jobs: Sequence[bytes], sources: Sequence[str], secret: str | None = None
) -> tuple[list[RawWorker], list]:
    """`count` hellos, round-robin over `jobs` and `sources`; returns the workers and their replies."""
    workers, replies = [], []
    for i in range(count):
        job = jobs[i % len(jobs)]
        key = job_key(secret.encode(), job) if secret else None
        w, r = hog(port, i, job=job, source=sources[i % len(sources)], key=key)
        workers.append(w)
        replies.append(r)
    return workers, replies


# ---- a greedy tenant cannot keep a second job from running -------------------------------------------


@pytest.mark.parametrize("sources", [["127.0.0.2"], peers(4)], ids=["one-address", "four-addresses"])
def test_greedy_job_credential_leaves_room_for_another_job(sources):
    """Job A's credential sends 50 hellos (from one address, then spread over four): it gets its
    job share (half of the budget by default) and no more, and job B's group all-reduces exactly.
    Before the shares, A's hellos reserved the whole budget and B was refused with OverLimit."""
    budget = 512 * MiB
    with serve(threads=2, max_memory_bytes=budget, auth_token=SECRET) as srv:
        workers, replies = greedy(srv.port, 50, jobs=[b"greedy"], sources=sources, secret=SECRET)
        try:
            held = srv.stats()["memory_bytes"]
            # Job B, with its own credential, needs 16 MiB (more than the 8 MiB the old code left).
            cred_b = job_credential("victim", job_key(SECRET.encode(), b"victim"))
            good = GoodGroup(
                srv.address, "victim-group", rounds=5, job_id="victim", auth_token=cred_b, chunk_bytes=1 * MiB
            ).start()
            good.wait_connected()
            good.join(60)
            statuses = [r.status for r in replies]
            granted = statuses.count(Status.OK)
            assert set(statuses) == {Status.OK, Status.OVER_LIMIT}, statuses
            assert granted == (budget // 2) // HOG_NEED, statuses  # 21 groups: 252 of 256 MiB
            refusal = next(r.message for r in replies if r.status == Status.OVER_LIMIT)
            assert "job share" in refusal and "max_memory_per_job" in refusal and "greedy" in refusal, refusal
            assert held == granted * HOG_NEED <= budget // 2
        finally:
            close_all([w.sock for w in workers])
        assert wait_until(lambda: srv.stats()["memory_bytes"] == 0, 10), srv.stats()


@pytest.mark.sanitize
def test_greedy_address_without_a_secret_leaves_room_for_another_job():
    """Without a secret, job ids cost nothing: one address sends 50 hellos, each under a new job
    id. It gets its address share and no more; a job from another address all-reduces exactly."""
    budget = 512 * MiB
    with serve(threads=2, max_memory_bytes=budget) as srv:
        jobs = [f"greedy-{i}".encode() for i in range(50)]
        workers, replies = greedy(srv.port, 50, jobs=jobs, sources=["127.0.0.2"])
        try:
            good = GoodGroup(srv.address, "victim-group", rounds=5, job_id="victim", chunk_bytes=1 * MiB).start()
            good.wait_connected()
            good.join(60)
            statuses = [r.status for r in replies]
            assert statuses.count(Status.OK) == (budget // 2) // HOG_NEED, statuses
            refusal = next(r.message for r in replies if r.status == Status.OVER_LIMIT)
            assert "address share" in refusal and "max_memory_per_peer" in refusal and "127.0.0.2" in refusal, refusal
        finally:
            close_all([w.sock for w in workers])


def test_honest_large_job_gets_its_whole_share_beside_a_greedy_tenant():
    """A greedy address holds its share; an honest job then gets everything its own share allows
    (2 streams x 4 x (2 + 2) x 4 MiB = 128 MiB = half of the budget) and all-reduces 16 MiB
    rounds exactly; a job that asks for more than its share is refused naming the job share."""
    budget = 256 * MiB
    with serve(threads=2, max_memory_bytes=budget) as srv:
        jobs = [f"greedy-{i}".encode() for i in range(20)]
        workers, replies = greedy(srv.port, 20, jobs=jobs, sources=["127.0.0.3"])
        try:
            held = srv.stats()["memory_bytes"]
            good = GoodGroup(
                srv.address, "large", rounds=3, n=4 << 20, job_id="honest", streams=2, chunk_bytes=4 * MiB, timeout=60
            ).start()
            good.wait_connected()
            assert srv.stats()["memory_bytes"] == held + budget // 2
            good.join(120)
            assert Status.OVER_LIMIT in [r.status for r in replies]
            assert held == 10 * HOG_NEED  # 120 of its 128 MiB
            with pytest.raises(reducer.ReductionError, match="job share"):
                reducer.Communicator(
                    [srv.address],
                    0,
                    1,
                    group="too-large",
                    job_id="honest-but-large",
                    streams=3,
                    chunk_bytes=16 * MiB,
                    timeout=10,
                    connect_timeout=10,
                )
        finally:
            close_all([w.sock for w in workers])


# ---- the refusal says which limit -----------------------------------------------------------------


@pytest.mark.sanitize
def test_over_limit_message_names_the_limit_hit():
    budget, per_job, per_peer = 10 * HOG_NEED, 4 * HOG_NEED, 6 * HOG_NEED
    with serve(threads=2, max_memory_bytes=budget, max_memory_per_job=per_job, max_memory_per_peer=per_peer) as srv:
        limits = srv.stats()["limits"]
        assert (limits["max_memory_per_job"], limits["max_memory_per_peer"]) == (per_job, per_peer)
        held: list[RawWorker] = []
        try:
            # The job share: one job id from two addresses.
            ws, rs = greedy(srv.port, 5, jobs=[b"one-job"], sources=peers(2))
            held += ws
            assert [r.status for r in rs] == [Status.OK] * 4 + [Status.OVER_LIMIT]
            assert "job share" in rs[-1].message and "max_memory_per_job" in rs[-1].message, rs[-1].message
            # The address share: one address, many job ids.
            ws, rs = greedy(srv.port, 7, jobs=[f"job-{i}".encode() for i in range(7)], sources=["127.0.0.5"])
            held += ws
            assert [r.status for r in rs] == [Status.OK] * 6 + [Status.OVER_LIMIT]
            assert "address share" in rs[-1].message and "max_memory_per_peer" in rs[-1].message, rs[-1].message
            # The server budget: 4 + 6 groups hold all of it; a new job from a new address fits both shares.
            assert srv.stats()["memory_bytes"] == budget
            ws, rs = greedy(srv.port, 1, jobs=[b"late"], sources=["127.0.0.6"])
            held += ws
            assert rs[0].status == Status.OVER_LIMIT
            assert "server budget" in rs[0].message and "max_memory_bytes" in rs[0].message, rs[0].message
            assert "share" not in rs[0].message, rs[0].message
            assert srv.stats()["refused_over_limit"] >= 3
        finally:
            close_all([w.sock for w in held])


# ---- idle reservations expire ---------------------------------------------------------------------


def round_trip(w: RawWorker, payload: bytes, round_: int) -> tuple[int, int, bytes]:
    """Sends one chunk of a world-1 group; returns (frame type, flags, payload) of the answer."""
    w.send_data(payload, round_=round_, dtype=I32)
    t, flags, _rnd, _off, body = w.frame(timeout=20)
    return t, flags, body


@pytest.mark.sanitize
def test_idle_groups_give_their_memory_back_and_renew_it_with_data():
    """A group that receives nothing for memory_idle_timeout gives its reservation back; its next
    chunk takes it again and reduces exactly. When another job took the room meanwhile, that
    chunk fails the group with an ERROR naming the limit, and the other job keeps working."""
    budget = HOG_NEED + HOG_NEED // 2  # 18 MiB: A (12 MiB) or B (16 MiB), not both
    data = np.arange(HOG_CHUNK // 4, dtype=np.int32) * 7 - 5
    payload = data.tobytes()
    with serve(
        threads=2,
        max_memory_bytes=budget,
        max_memory_per_job=budget,
        max_memory_per_peer=budget,
        memory_idle_timeout=0.5,
    ) as srv:
        assert srv.stats()["limits"]["memory_idle_timeout"] == 0.5
        a, r = hog(srv.port, 0, job=b"idle-a", source="127.0.0.2")
        pair: list[RawWorker] = []
        try:
            assert r.status == Status.OK, r.message
            assert wait_until(lambda: srv.stats()["memory_bytes"] == 0, 30), srv.stats()
            # Data again: reserved again, reduced exactly (world 1: the sum is the chunk itself).
            t, _flags, body = round_trip(a, payload, 0)
            assert t == RESULT and body == payload
            assert wait_until(lambda: srv.stats()["memory_bytes"] == 0, 30), srv.stats()
            # Meanwhile job B forms a pair (16 MiB); a chunk of rank 0 waits for rank 1, so B is
            # busy, not idle, and keeps its memory.
            pair = [
                RawWorker(srv.port, rank, 2, group=b"pair", job=b"idle-b", chunk=HOG_CHUNK, source="127.0.0.3")
                for rank in range(2)
            ]
            for w in pair:
                r = w.reply(timeout=10)
                assert r.status == Status.OK, r.message
            pair[0].send_data(payload, dtype=I32)
            assert wait_until(lambda: srv.stats()["chunks_in_flight"] == 1, 30), srv.stats()
            assert srv.stats()["memory_bytes"] == SLOTS * 4 * HOG_CHUNK
            # A's next chunk cannot take its memory again: its group fails, naming the limit.
            t, flags, body = round_trip(a, payload, 1)
            text = body.decode("utf-8", "replace")
            assert t == ERROR and flags == ERR_INTERNAL, (t, flags, text)
            assert "idle" in text and "server budget" in text and "max_memory_bytes" in text, text
            # B is unaffected: its round completes exactly.
            pair[1].send_data(payload, dtype=I32)
            want = (data.astype(np.int64) * 2).astype(np.int32).tobytes()
            for w in pair:
                t, _flags, _rnd, _off, body = w.frame(timeout=20)
                assert t == RESULT and body == want
        finally:
            close_all([w.sock for w in [a, *pair]])


# ---- tenants behind one address (issue 28.5) ------------------------------------------------------


def signed(port: int, job: bytes, group: bytes, rank: int = 0, world: int = 1, source: str = "127.0.0.2") -> RawWorker:
    """A hello of `job` with its credential (K_job) from `source`."""
    return RawWorker(
        port, rank, world, group=group, job=job, key=job_key(SECRET.encode(), job), chunk=HOG_CHUNK, source=source
    )


def refused_naming(w: RawWorker, *words: str) -> None:
    """The hello of `w` is refused OverLimit with each of `words` in the message."""
    r = w.reply(timeout=10)
    assert r.status == Status.OVER_LIMIT and all(word in r.message for word in words), r.message


def pair_formed(port: int, job: bytes) -> list[RawWorker]:
    """A world-2 group of `job` from 127.0.0.2; both replies checked Ok."""
    pair = [signed(port, job, b"pair", rank=k, world=2) for k in range(2)]
    for w in pair:
        r = w.reply(timeout=10)
        assert r.status == Status.OK, r.message
    return pair


def test_jobs_behind_one_address_each_get_their_memory_share():
    """With a secret, job A's workers on an address take A's job share, not the address's: job B
    from the same address (NAT, one host) gets its own share. Before, B was refused OverLimit
    ('address share') while half of the budget was free."""
    budget = 8 * HOG_NEED  # 96 MiB: shares of 48 MiB = 4 world-1 groups each
    with serve(threads=2, max_memory_bytes=budget, auth_token=SECRET) as srv:
        held: list[RawWorker] = []
        try:
            for job, want in ((b"tenant-a", [Status.OK] * 4 + [Status.OVER_LIMIT]), (b"tenant-b", [Status.OK] * 4)):
                replies = []
                for i in range(len(want)):  # one at a time: the refusal is the last one
                    held.append(signed(srv.port, job, f"g{i}".encode()))
                    replies.append(held[-1].reply(timeout=10))
                assert [r.status for r in replies] == want, [(r.status, r.message) for r in replies]
                if Status.OVER_LIMIT in want:
                    assert "job share" in replies[-1].message and "tenant-a" in replies[-1].message
            assert srv.stats()["memory_bytes"] == budget
        finally:
            close_all([w.sock for w in held])
        assert wait_until(lambda: srv.stats()["memory_bytes"] == 0, 10), srv.stats()


def test_waiting_groups_of_one_job_do_not_lock_out_another_job_on_its_address():
    """Job A fills max_groups_per_peer with groups that wait for their second rank; job B, from the
    same address, still creates its group and all-reduces. A's next group is refused naming its
    job. Before, B was refused ('address 127.0.0.2 already created ... max_groups_per_peer')."""
    cap = 8
    with serve(threads=2, auth_token=SECRET, max_groups_per_peer=cap, group_timeout=60) as srv:
        held: list[RawWorker] = []
        try:
            held += [signed(srv.port, b"tenant-a", f"wait-{i}".encode(), world=2) for i in range(cap)]
            assert wait_until(lambda: srv.stats()["groups"] == cap, 10), srv.stats()  # (joined: created)
            held.append(signed(srv.port, b"tenant-a", b"one-too-many", world=2))
            refused_naming(held[-1], "job tenant-a", "max_groups_per_peer")
            pair = pair_formed(srv.port, b"tenant-b")
            held += pair
            data = np.arange(HOG_CHUNK // 4, dtype=np.int32) * 3 - 1
            for w in pair:
                w.send_data(data.tobytes(), dtype=I32)
            want = (data.astype(np.int64) * 2).astype(np.int32).tobytes()
            for w in pair:
                t, _flags, _rnd, _off, body = w.frame(timeout=20)
                assert t == RESULT and body == want
        finally:
            close_all([w.sock for w in held])


def test_connections_of_one_job_do_not_lock_out_another_job_on_its_address():
    """Authenticated connections count against their job: job A holding max_connections_per_peer
    connections from an address leaves that address's count free for job B, and A's next one is
    refused naming the job. Unauthenticated connections still count against the address."""
    cap = 6
    with serve(threads=2, auth_token=SECRET, max_connections_per_peer=cap, group_timeout=60) as srv:
        held: list[RawWorker] = []
        try:
            held += [signed(srv.port, b"tenant-a", b"big", rank=k, world=2 * cap) for k in range(cap)]
            assert wait_until(lambda: srv.stats()["waiting"] == cap, 10), srv.stats()
            held.append(signed(srv.port, b"tenant-a", b"big", rank=cap, world=2 * cap))
            refused_naming(held[-1], "job tenant-a", "max_connections_per_peer")
            held += pair_formed(srv.port, b"tenant-b")
        finally:
            close_all([w.sock for w in held])


# ---- the settings ----------------------------------------------------------------------------------


def test_shares_default_to_half_of_the_budget_and_come_from_settings(monkeypatch):
    for env in ("RS_MAX_MEMORY_PER_JOB", "RS_MAX_MEMORY_PER_PEER", "RS_MEMORY_IDLE_TIMEOUT"):
        monkeypatch.delenv(env, raising=False)
    with serve(max_memory_bytes=1 << 30) as srv:
        limits = srv.stats()["limits"]
    assert (limits["max_memory_per_job"], limits["max_memory_per_peer"]) == (512 * MiB, 512 * MiB)
    assert limits["memory_idle_timeout"] == 60
    monkeypatch.setenv("RS_MAX_MEMORY_PER_JOB", "100M")
    monkeypatch.setenv("RS_MAX_MEMORY_PER_PEER", "30M")
    monkeypatch.setenv("RS_MEMORY_IDLE_TIMEOUT", "7")
    with serve(max_memory_bytes=1 << 30) as srv:
        limits = srv.stats()["limits"]
    assert (limits["max_memory_per_job"], limits["max_memory_per_peer"], limits["memory_idle_timeout"]) == (
        100 * MiB,
        30 * MiB,
        7,
    )
    with serve(max_memory_bytes=1 << 30, max_memory_per_job=5 * MiB, memory_idle_timeout=0) as srv:
        limits = srv.stats()["limits"]
    assert (limits["max_memory_per_job"], limits["max_memory_per_peer"], limits["memory_idle_timeout"]) == (
        5 * MiB,
        30 * MiB,
        0,
    )
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(reducer.ReductionError, match="memory_idle_timeout"):
            serve(memory_idle_timeout=bad)


def test_serve_flags_set_the_shares(tmp_path):
    env = child_env_in_tree()
    proc = start_serve(
        "--control-port",
        "off",
        "--max-memory-per-job",
        "64M",
        "--max-memory-per-peer",
        "32MiB",
        "--memory-idle-timeout",
        "5",
        env=env,
    )
    out = ChildLines(proc.stdout, "serve")
    try:
        out.wait_for("limits: memory", 60)
        assert "(64 MiB per job, 32 MiB per address)" in out.text(), out.text()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    bad = subprocess.run(
        serve_argv("--max-memory-per-job", "lots"),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--max-memory-per-job" in bad.stderr, bad.stderr
