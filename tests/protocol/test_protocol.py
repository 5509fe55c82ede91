"""The wire protocol from the outside: the independent Python encoder of docs/protocol.md
(tests/attack_tools.py) talks to a real reducer, and malformed input never hurts anyone else."""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import threading
import time

import numpy as np
import pytest
from attack_tools import (
    CHALLENGE,
    DATA,
    ERR_PROTOCOL,
    ERROR,
    F32,
    FRAME,
    HELLO,
    REPLY,
    RESULT,
    SUM,
    VERSION,
    RawWorker,
    Status,
    closed_by_peer,
    frame,
    job_credential,
    job_key,
    recv_exact,
)

import reducer
from reducer._native import core

pytestmark = [pytest.mark.timeout(60), pytest.mark.sanitize]


def test_layout_sizes():
    assert (CHALLENGE.size, HELLO.size, REPLY.size, FRAME.size) == (48, 96, 40, 48)
    assert core.PROTOCOL_VERSION == VERSION == 2


def test_hmac_matches_python():
    for key, msg in [(b"", b""), (b"key", b"The quick brown fox jumps over the lazy dog"), (b"k" * 100, b"x" * 1000)]:
        want = hmac.new(key, msg, hashlib.sha256).digest()
        assert core.hmac_sha256(key.decode(), msg.decode()) == want


def test_job_key_matches_the_documented_derivation():
    # K_job = HMAC-SHA256(secret, "reduction-server job key v1" || 0x00 || job id)
    for secret, job in [("s3cret", "job-A"), ("s3cret", "job-B"), ("x" * 200, "j" * 256)]:
        want = hmac.new(secret.encode(), b"reduction-server job key v1\0" + job.encode(), hashlib.sha256).digest()
        assert core.job_key(secret, job) == want == job_key(secret.encode(), job.encode())
    assert core.job_key("s3cret", "job-A") != core.job_key("s3cret", "job-B")


@pytest.fixture
def server():
    with reducer.ReducerServer(host="127.0.0.1", port=0, threads=2) as srv:
        yield srv


def test_raw_worker_round_trip(server):
    a, b = RawWorker(server.port, 0, 2), RawWorker(server.port, 1, 2)
    assert not a.challenge.auth_required and a.challenge.version == VERSION
    ra, rb = a.reply(), b.reply()
    assert (ra.status, ra.message) == (Status.OK, "welcome") and rb.status == Status.OK
    # Without a secret the reducer cannot sign: the reply MAC is zeros.
    assert ra.mac == rb.mac == b"\0" * 32
    x = np.arange(10, dtype="<f4")
    a.send_data(x.tobytes())
    b.send_data((2 * x).tobytes())
    for w in (a, b):
        t, fl, rnd, off, payload = w.frame()
        assert (t, fl, rnd, off) == (RESULT, 1, 0, 0)
        np.testing.assert_array_equal(np.frombuffer(payload, "<f4"), 3 * x)


def assert_still_serving(server):
    with reducer.Communicator([server.address], 0, 1, group=f"after-{time.monotonic()}", connect_timeout=5) as c:
        a = np.ones(4, np.float32)
        c.allreduce(a)
        assert a.tolist() == [1, 1, 1, 1]


def test_garbage_is_dropped(server):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    recv_exact(s, 48)
    s.sendall(os.urandom(4096))
    assert closed_by_peer(s)
    assert_still_serving(server)
    assert server.stats()["rejected"] >= 1


def test_wrong_version_gets_reply(server):
    w = RawWorker(server.port, version=99)
    r = w.reply()
    assert r.status == Status.BAD_VERSION and "version" in r.message and "99" in r.message
    assert_still_serving(server)


BAD_HELLO_FIELDS = [
    (dict(world=(1 << 31) - 1), "world size"),
    (dict(world=0), "world size"),
    (dict(world=65537), "world size"),
    (dict(rank=5, world=2), "rank 5"),
    (dict(chunk=0), "chunk size"),
    (dict(chunk=56), "chunk size"),
    (dict(chunk=1001), "chunk size"),
    (dict(chunk=(64 << 20) + 8), "chunk size"),
    (dict(streams=0), "streams"),
    (dict(streams=65), "streams"),
    (dict(stream=2, streams=2), "stream index"),
]


@pytest.mark.parametrize(
    "fields,fragment", BAD_HELLO_FIELDS, ids=["-".join(f"{k}={v}" for k, v in f[0].items()) for f in BAD_HELLO_FIELDS]
)
def test_out_of_range_hello_fields_rejected_for_the_sender_only(server, fields, fragment):
    neighbour = RawWorker(server.port, 0, 2, group=b"neighbour")
    w = RawWorker(server.port, group=b"bad", **fields)
    r = w.reply()
    assert r.status == Status.BAD_HELLO, (r.status, r.message)
    assert fragment in r.message
    assert closed_by_peer(w.sock)
    # The neighbour still forms its group and reduces.
    other = RawWorker(server.port, 1, 2, group=b"neighbour")
    assert neighbour.reply().status == other.reply().status == Status.OK
    x = np.arange(4, dtype="<f4")
    neighbour.send_data(x.tobytes())
    other.send_data(x.tobytes())
    assert np.array_equal(np.frombuffer(neighbour.frame()[4], "<f4"), 2 * x)


BAD_HEADERS = [
    (dict(dtype=9), b"unknown dtype"),
    (dict(op=7), b"unknown op"),
    (dict(type_=9), b"unknown frame type"),
    (dict(type_=RESULT), b"unexpected frame type"),
    (dict(offset=(1 << 64) - 8, length=16, total=64), b"outside the shard"),
    (dict(offset=8, length=(1 << 32) - 8, total=1 << 40), b"exceeds the chunk size"),
    (dict(length=0, total=16), b"positive multiple"),
    (dict(length=6, total=16), b"positive multiple"),
    (dict(offset=2, length=4, total=16), b"aligned"),
    (dict(shard=32, total=16, length=16), b"shard larger"),
]


@pytest.mark.parametrize(
    "fields,fragment", BAD_HEADERS, ids=[f[1].decode() + str(i) for i, f in enumerate(BAD_HEADERS)]
)
def test_out_of_range_data_headers_rejected_for_the_sender_only(server, fields, fragment):
    kw = dict(type_=DATA, length=16, total=16)
    kw.update(fields)
    type_ = kw.pop("type_")
    bystander = RawWorker(server.port, 0, 1, group=b"bystander")
    assert bystander.reply().status == Status.OK
    a = RawWorker(server.port, 0, 1, group=b"hdr")
    assert a.reply().status == Status.OK
    a.sock.sendall(frame(type_, **kw))
    t, fl, _, _, msg = a.frame()
    assert t == ERROR and fl == ERR_PROTOCOL and fragment in msg, msg
    assert closed_by_peer(a.sock)
    # The other group on the reducer is untouched.
    x = np.arange(8, dtype="<f4")
    bystander.send_data(x.tobytes())
    t, _, _, _, payload = bystander.frame()
    assert t == RESULT and np.array_equal(np.frombuffer(payload, "<f4"), x)
    assert_still_serving(server)


def test_oversized_frame_fails_group_not_server(server):
    a, b = RawWorker(server.port, 0, 2, chunk=4096), RawWorker(server.port, 1, 2, chunk=4096)
    a.reply(), b.reply()
    # Claims a payload far beyond the negotiated chunk size: never allocated or read.
    a.sock.sendall(FRAME.pack(DATA, F32, SUM, 1, 1 << 30, 0, 1 << 31, 1 << 31, 0, 0))
    t, fl, _, _, msg = b.frame()
    assert t == ERROR and b"exceeds the chunk size" in msg
    assert closed_by_peer(a.sock)
    assert_still_serving(server)


def test_out_of_bounds_offset(server):
    a = RawWorker(server.port, 0, 1)
    a.reply()
    a.send_data(b"\0" * 16, total=16, offset=8)
    t, fl, _, _, msg = a.frame()
    assert t == ERROR and b"outside the shard" in msg
    assert_still_serving(server)


def test_truncated_frame_then_disconnect(server):
    a, b = RawWorker(server.port, 0, 2), RawWorker(server.port, 1, 2)
    a.reply(), b.reply()
    a.sock.sendall(FRAME.pack(DATA, F32, SUM, 1, 400, 0, 400, 400, 0, 0) + b"\0" * 100)
    a.sock.close()
    t, fl, _, _, msg = b.frame()
    assert t == ERROR and b"rank 0" in msg
    assert_still_serving(server)


def test_silent_connection_times_out(server):
    with reducer.ReducerServer(host="127.0.0.1", port=0, handshake_timeout=0.5) as srv:
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        recv_exact(s, 48)
        assert closed_by_peer(s, timeout=5)


def test_many_bad_clients_concurrently(server):
    def bad():
        for _ in range(10):
            try:
                s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                s.sendall(os.urandom(200))
                s.close()
            except OSError:
                pass

    threads = [threading.Thread(target=bad) for _ in range(4)]
    for t in threads:
        t.start()
    assert_still_serving(server)
    for t in threads:
        t.join()
    assert_still_serving(server)


def test_raw_auth():
    secret = b"tok"
    with reducer.ReducerServer(host="127.0.0.1", port=0, auth_token=secret.decode()) as srv:
        good = RawWorker(srv.port, job=b"job-A", key=job_key(secret, b"job-A"))
        assert good.challenge.auth_required
        r = good.reply()
        assert r.status == Status.OK
        # The reducer proves it knows the secret: the reply is signed with K_job over both nonces.
        assert good.reply_mac_ok(r)
        assert r.mac != b"\0" * 32
        bad = RawWorker(srv.port, job=b"job-A", key=job_key(b"nope", b"job-A"))
        r = bad.reply()
        assert r.status == Status.AUTH_FAILED and "authentication failed" in r.message
        unsigned = RawWorker(srv.port, job=b"job-A")
        assert unsigned.reply().status == Status.AUTH_FAILED


def test_raw_auth_mac_covers_every_byte():
    # Each byte of the signed hello matters: change one after signing and the reducer refuses.
    secret = b"tok"
    key = job_key(secret, b"job-A")
    with reducer.ReducerServer(host="127.0.0.1", port=0, auth_token=secret.decode()) as srv:
        for pos in (4 + 2, 8, 12, 20, 32, 96, 96 + 5):  # flags, world, rank, chunk, worker nonce, job, group
            w = RawWorker(srv.port, 0, 1, job=b"job-A", group=b"group", key=key, send_hello=False)
            tampered = bytearray(w.hello_bytes)
            tampered[pos] ^= 0x01
            w.sock.sendall(bytes(tampered))
            r = w.reply()
            assert r.status in (Status.AUTH_FAILED, Status.BAD_HELLO), (pos, r)
            if pos >= 32:
                assert r.status == Status.AUTH_FAILED, (pos, r)


def test_raw_auth_with_job_credential():
    secret = b"s3cret"
    cred = job_credential("job-A", job_key(secret, b"job-A"))
    with reducer.ReducerServer(host="127.0.0.1", port=0, auth_token=secret.decode()) as srv:
        key = bytes.fromhex(cred.rsplit(":", 1)[1])
        w = RawWorker(srv.port, job=b"job-A", key=key)
        r = w.reply()
        assert r.status == Status.OK and w.reply_mac_ok(r)
        # The same key presented for another job is refused by the reducer itself.
        other = RawWorker(srv.port, job=b"job-B", key=key)
        assert other.reply().status == Status.AUTH_FAILED


KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize(
    "shard, chunk",
    [
        (16 * KiB, 64 * KiB),  # under 128 KiB: latency-bound, one chunk (64 KiB floor)
        (100 * KiB, 64 * KiB),
        (128 * KiB, 16 * KiB),  # from 128 KiB: shard/64, at least 16 KiB
        (256 * KiB, 16 * KiB),
        (1 * MiB, 16 * KiB),  # 64 per shard: fill and drain 3% (the old 64 KiB floor: 12%)
        (2 * MiB, 32 * KiB),
        (3 * MiB + 64 * KiB, 52 * KiB),  # shard/64 rounded up to 4 KiB
        (4 * MiB, 64 * KiB),
        (6 * MiB, 64 * KiB),  # from 4 MiB: shard/128 (fill and drain 1.5%), at least 64 KiB
        (8 * MiB, 64 * KiB),
        (16 * MiB, 128 * KiB),
        (64 * MiB, 512 * KiB),
        (256 * MiB, 1 * MiB),  # capped by max_chunk
    ],
)
def test_chunk_rule(shard, chunk):
    assert core.chunk_for(shard, 1 * MiB) == chunk


@pytest.mark.parametrize(
    "nbytes, reducers, workers, used",
    [
        (4, 4, 4, 1),  # a barrier-sized round: one reducer
        (16 * KiB, 8, 8, 1),  # shards stay >= 32 KiB
        (64 * KiB, 4, 4, 2),  # W x shard <= 128 KiB: 2 x 32 KiB shards (was 1 x 64 KiB: 256 KiB incast)
        (64 * KiB, 8, 8, 2),  # capped by the 32 KiB shard floor (one reducer: 512 KiB incast)
        (128 * KiB, 4, 4, 4),
        (128 * KiB, 8, 8, 4),
        (64 * KiB, 2, 2, 1),  # W = 2: one 64 KiB shard is 128 KiB of incast
        (128 * KiB, 8, 2, 2),
        (256 * KiB, 8, 8, 8),
        (256 * KiB, 4, 4, 4),  # R x 64 KiB and more: every reducer
        (64 * MiB, 4, 16, 4),
        (256 * KiB, 16, 16, 8),
        (512 * KiB, 16, 16, 16),
        (100 * KiB, 1, 8, 1),
    ],
)
def test_reducer_count_rule(nbytes, reducers, workers, used):
    assert core.reducers_for(nbytes, reducers, workers) == used


def test_reducer_count_rule_bounds_incast_or_keeps_shards_large():
    """Below R x 64 KiB every count keeps a reducer's share of a round (W x shard) at 128 KiB or
    its shards at 32 KiB at least, never uses more reducers than that needs, and never more than R."""
    for workers in (1, 2, 3, 4, 6, 8, 16, 32):
        for reducers in (1, 2, 3, 4, 8, 16):
            for nbytes in [1, 4, 4 * KiB, 32 * KiB, 33 * KiB] + [k * 16 * KiB for k in range(3, 65)]:
                used = core.reducers_for(nbytes, reducers, workers)
                assert 1 <= used <= reducers
                if nbytes >= reducers * 64 * KiB:
                    assert used == reducers
                    continue
                shard = -(-nbytes // used)
                assert workers * shard <= 128 * KiB or shard >= 32 * KiB or used == reducers, (
                    nbytes,
                    reducers,
                    workers,
                    used,
                )
                if 1 < used < min(reducers, nbytes // (32 * KiB)):  # not capped: one fewer would not do
                    assert used - 1 < -(-nbytes // (64 * KiB)) or workers * nbytes > 128 * KiB * (used - 1), (
                        nbytes,
                        reducers,
                        workers,
                        used,
                    )


def test_chunk_rule_respects_a_small_max_chunk():
    assert core.chunk_for(1 * MiB, 8 * KiB) == 8 * KiB
    assert core.chunk_for(4 * KiB, 8 * KiB) == 8 * KiB


@pytest.mark.timeout(300)  # a sanitized build of the transport and kernels: ~30 s alone, minutes on a loaded machine
def test_frame_reader_unit_tests_in_cpp(tmp_path):
    # tests/cpp/test_frame_io.cc, under ASan + UBSan: random streams of frames into every kind of
    # sink (memory, scatter, aligned scatter, text, discard) with small and large socket buffers,
    # random read budgets and pauses, driven only as poll/epoll drive the reader (pump when
    # readable): every payload intact, no frame left complete in the reader's memory with nothing
    # in the socket to wake anyone, for every budget; a peer that leaves mid-header is lost.
    from cpp_build import SANITIZE, build_and_run, kernel_sources

    sources = [
        "tests/cpp/test_frame_io.cc",
        "csrc/net/frame_auth.cc",
        "csrc/net/frame_io.cc",
        "csrc/net/socket.cc",
        "csrc/common/settings.cc",
        "csrc/protocol/auth.cc",
        "csrc/protocol/hmac.cc",
        "csrc/protocol/wire.cc",
        "csrc/protocol/plan.cc",
        "csrc/common/common.cc",
        "csrc/common/text.cc",
    ]
    build_and_run(tmp_path, "test_frame_io", sources + kernel_sources(), libs=["crypto"], flags=SANITIZE)
