"""The wire protocol from the outside: an independent Python encoder of docs/protocol.md
talks to a real reducer, and malformed input never hurts anyone else."""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest

import reducer
from reducer._native import core

pytestmark = pytest.mark.timeout(60)

MAGIC = 0x56525352
VERSION = 1
CHALLENGE = struct.Struct("<IHBBII32s")          # 48 bytes
HELLO = struct.Struct("<IHHIIHHIHHI32s")          # 64 bytes
REPLY = struct.Struct("<IHH")                    # 8 bytes
FRAME = struct.Struct("<BBBBIQQQQQ")             # 48 bytes
DATA, RESULT, ERROR, BYE = 1, 2, 3, 4
F32, SUM = 0, 0


def test_layout_sizes():
    assert (CHALLENGE.size, HELLO.size, REPLY.size, FRAME.size) == (48, 64, 8, 48)
    assert core.PROTOCOL_VERSION == VERSION


def test_hmac_matches_python():
    for key, msg in [(b"", b""), (b"key", b"The quick brown fox jumps over the lazy dog"), (b"k" * 100, b"x" * 1000)]:
        want = hmac.new(key, msg, hashlib.sha256).digest()
        assert core.hmac_sha256(key.decode(), msg.decode()) == want


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


class RawWorker:
    """A worker written from docs/protocol.md, not from the C++ code."""

    def __init__(self, port: int, rank: int = 0, world: int = 1, group: bytes = b"raw", job: bytes = b"j",
                 token: bytes = b"", version: int = VERSION, chunk: int = 1 << 20):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        magic, ver, auth, _, maxchunk, _, nonce = CHALLENGE.unpack(recv_exact(self.sock, 48))
        assert magic == MAGIC and ver == VERSION
        self.auth_required = bool(auth)
        fields = [MAGIC, version, 0, world, rank, 0, 1, chunk, len(job), len(group), 0]
        unsigned = HELLO.pack(*fields, b"\0" * 32) + job + group
        mac = hmac.new(token, nonce + unsigned, hashlib.sha256).digest() if token else b"\0" * 32
        self.sock.sendall(HELLO.pack(*fields, mac) + job + group)

    def reply(self):
        magic, status, n = REPLY.unpack(recv_exact(self.sock, 8))
        assert magic == MAGIC
        return status, recv_exact(self.sock, n).decode()

    def send_data(self, payload: bytes, round_: int = 0, total: int = None, offset: int = 0, flags: int = 1,
                  length: int = None, dtype: int = F32):
        total = len(payload) if total is None else total
        length = len(payload) if length is None else length
        self.sock.sendall(FRAME.pack(DATA, dtype, SUM, flags, length, round_, total, total, offset, 0) + payload)

    def frame(self):
        t, dt, op, fl, length, rnd, total, shard, off, tag = FRAME.unpack(recv_exact(self.sock, 48))
        return t, fl, rnd, off, recv_exact(self.sock, length)


@pytest.fixture
def server():
    with reducer.ReducerServer(host="127.0.0.1", port=0, threads=2) as srv:
        yield srv


def test_raw_worker_round_trip(server):
    a, b = RawWorker(server.port, 0, 2), RawWorker(server.port, 1, 2)
    assert a.reply() == (0, "welcome") and b.reply()[0] == 0
    x = np.arange(10, dtype="<f4")
    a.send_data(x.tobytes())
    b.send_data((2 * x).tobytes())
    for w in (a, b):
        t, fl, rnd, off, payload = w.frame()
        assert (t, rnd, off) == (RESULT, 0, 0)
        np.testing.assert_array_equal(np.frombuffer(payload, "<f4"), 3 * x)


def assert_still_serving(server):
    with reducer.Communicator([server.address], 0, 1, group=f"after-{time.monotonic()}", connect_timeout=5) as c:
        a = np.ones(4, np.float32)
        c.allreduce(a)
        assert a.tolist() == [1, 1, 1, 1]


def closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_garbage_is_dropped(server):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    recv_exact(s, 48)
    s.sendall(os.urandom(4096))
    assert closed_by_peer(s)
    assert_still_serving(server)
    assert server.stats()["rejected"] >= 1


def test_wrong_version_gets_reply(server):
    w = RawWorker(server.port, version=99)
    status, msg = w.reply()
    assert status == 1 and "version" in msg and "99" in msg
    assert_still_serving(server)


def test_bad_hello_fields(server):
    w = RawWorker(server.port, rank=5, world=2)
    status, msg = w.reply()
    assert status == 3 and "rank 5" in msg


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


def test_raw_auth(server):
    with reducer.ReducerServer(host="127.0.0.1", port=0, auth_token="tok") as srv:
        good = RawWorker(srv.port, token=b"tok")
        assert good.auth_required
        assert good.reply()[0] == 0
        bad = RawWorker(srv.port, token=b"nope")
        status, msg = bad.reply()
        assert status == 2 and "authentication failed" in msg
