"""The point-to-point net against a hostile or failing peer (docs/security.md, the plugin's p2p net).

A Python peer speaks the plugin's wire format (csrc/nccl_plugin/p2p_net.cc, p2p_listen.h) over
4 sockets, one progress thread each, resets one socket in the middle of a message and goes on
with the others. NCCL frees or reuses a buffer as soon as test() reports its request over, failed
or not: so once test() has reported the failure, no byte of the buffer may be written (receive)
or read (send) again. The test overwrites the buffer with a marker right after the failure and
watches it; under scripts/sanitize.sh the plugin is built with ASan too.

A handle whose connect-state bytes (64-72) a peer filled must be refused, not followed.
"""

from __future__ import annotations

import ctypes as C
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import nccl_harness as H
import numpy as np
import pytest
from paths import TESTS

pytestmark = pytest.mark.sanitize

V = 12  # the net table version the harness drives
NSOCKS = 4
HELLO = struct.Struct("<IHHH6xQQ")  # p2p_listen.h: magic, version, index, sockets, nonce, connection id
HELLO_MAGIC, MSG_MAGIC, HANDLE_MAGIC = 0x484E5352, 0x4D4E5352, 0x4C4E5352
MARK = 0xAB
WATCH_S = 2.0  # how long the buffer is watched after the failure


def stripe(size: int, n: int, s: int) -> tuple[int, int]:
    """(offset, length) of socket s's part of a message (p2p::stripe)."""
    used = min(n, max(1, size // (64 << 10)))
    chunk = -(-size // used)
    b, e = min(size, s * chunk), min(size, (s + 1) * chunk)
    return b, e - b


def reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a crashed host or a middlebox would."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.fixture
def plugin(monkeypatch):
    for k in H.CLUSTER_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RS_NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("RS_NCCL_NSOCKS", str(NSOCKS))
    monkeypatch.setenv("NCCL_SOCKET_NTHREADS", str(NSOCKS))  # one progress thread per socket
    p = H.Plugin()
    try:
        yield p, H.init_net(p, V)
    finally:
        p.close()


def wait_failed(plugin: H.Plugin, net: Any, req: C.c_void_p, timeout: float = 30.0) -> int:
    done, size = C.c_int(), C.c_int()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rc = net.test(req, C.byref(done), C.byref(size))
        if rc != H.SUCCESS:
            return rc
        assert not done.value, "the request finished although a socket was reset"
        time.sleep(0.0005)
    raise AssertionError("test() never reported the reset socket\n" + plugin.log_text())


def fail_then_mark(
    plugin: H.Plugin, net: Any, req: C.c_void_p, buf: np.ndarray, peer: Any, reported: threading.Event
) -> threading.Thread:
    """Starts the peer, waits until test() reports the failure, then overwrites `buf` with MARK
    (NCCL would free or reuse it now) and lets the peer go on; the peer's thread."""
    t = threading.Thread(target=peer, daemon=True)
    t.start()
    assert wait_failed(plugin, net, req) != H.SUCCESS
    buf[:] = MARK
    reported.set()
    return t


def test_receive_buffer_untouched_after_a_socket_reset(plugin):
    """The peer resets socket 1 halfway through an 8 MiB message, then sends the rest of the others."""
    p, net = plugin
    handle, lcomm = H.listen(p, net, V, None)
    family, host, port = H.listen_address(handle)
    nonce = int.from_bytes(handle.raw[16:24], "little")
    socks = []
    for i in range(NSOCKS):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(HELLO.pack(HELLO_MAGIC, 1, i, NSOCKS, nonce, 0x5EED))
        socks.append(s)
    rcomm = C.c_void_p()
    deadline = time.monotonic() + 30
    while not rcomm.value and time.monotonic() < deadline:
        H.check(net.accept(lcomm, C.byref(rcomm), None), "accept", p)
    assert rcomm.value, p.log_text()
    H.check(net.closeListen(lcomm), "closeListen", p)

    size = 8 << 20
    buf = np.zeros(size, dtype=np.uint8)
    data, sizes, tags = (C.c_void_p * 1)(buf.ctypes.data), (C.c_size_t * 1)(size), (C.c_int * 1)(7)
    req = C.c_void_p()
    H.check(net.irecv(rcomm, 1, data, sizes, tags, None, None, C.byref(req)), "irecv", p)
    assert req.value
    msg = H.payload(7, size).tobytes()
    reported = threading.Event()

    def peer() -> None:
        socks[0].sendall(struct.pack("<IIQ", MSG_MAGIC, 0, size))
        parts = [stripe(size, NSOCKS, s) for s in range(NSOCKS)]
        for s, (off, n) in enumerate(parts):
            socks[s].sendall(msg[off : off + n // 2])
        reset(socks[1])
        reported.wait(30)
        for s in (0, 2, 3):  # the rest of the message on the sockets that still work
            off, n = parts[s]
            try:
                socks[s].settimeout(WATCH_S / 2)
                socks[s].sendall(msg[off + n // 2 : off + n])
            except OSError:
                pass  # nobody reads any more (the fixed plugin): fine

    t = None
    try:
        t = fail_then_mark(p, net, req, buf, peer, reported)
        end = time.monotonic() + WATCH_S
        while time.monotonic() < end:
            written = int(np.count_nonzero(buf != MARK))
            assert written == 0, f"{written} bytes written into the receive buffer after test() reported the failure"
            time.sleep(0.01)
        assert "receive from peer" in p.log_text(), p.log_text()
    finally:
        reported.set()
        if t:
            t.join(30)
        H.check(net.closeRecv(rcomm), "closeRecv", p)
        for s in socks:
            s.close()
    assert int(np.count_nonzero(buf != MARK)) == 0, "written while closeRecv ran"


def test_send_buffer_unread_after_a_socket_reset(plugin):
    """The peer reads a little of each part of a 64 MiB message, resets socket 1, reads on."""
    p, net = plugin
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # little in flight: the sender blocks
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    lsock.settimeout(30)
    nonce = 0x1234_5678_9ABC_DEF0
    handle = bytearray(H.HANDLE_BYTES)
    struct.pack_into("<IHHHH", handle, 0, HANDLE_MAGIC, 1, socket.AF_INET, lsock.getsockname()[1], NSOCKS)
    struct.pack_into("<Q", handle, 16, nonce)
    handle[24:28] = socket.inet_aton("127.0.0.1")
    hbuf = C.create_string_buffer(bytes(handle), H.HANDLE_BYTES)
    scomm = C.c_void_p()
    socks: dict[int, socket.socket] = {}
    deadline = time.monotonic() + 30
    while not scomm.value and time.monotonic() < deadline:
        H.check(net.connect(None, 0, hbuf, C.byref(scomm), None), "connect", p)
        time.sleep(0.001)
    assert scomm.value, p.log_text()
    for _ in range(NSOCKS):
        s, _addr = lsock.accept()
        s.settimeout(10)
        hello = recv_exact(s, HELLO.size)
        magic, _v, index, n, got_nonce, _cid = HELLO.unpack(hello)
        assert (magic, n, got_nonce) == (HELLO_MAGIC, NSOCKS, nonce)
        socks[index] = s
    lsock.close()

    size = 64 << 20
    src = H.payload(11, size)
    req = C.c_void_p()
    H.check(net.isend(scomm, src.ctypes.data, size, 7, None, None, C.byref(req)), "isend", p)
    assert req.value
    orig = src.copy()
    reported = threading.Event()
    wrong = [0]

    def peer() -> None:
        hdr = recv_exact(socks[0], 16)
        assert struct.unpack("<IIQ", hdr) == (MSG_MAGIC, 0, size)
        parts = [stripe(size, NSOCKS, s) for s in range(NSOCKS)]
        got = [0] * NSOCKS
        for s in range(NSOCKS):
            got[s] = len(recv_exact(socks[s], 256 << 10))
        reset(socks[1])
        reported.wait(30)
        end = time.monotonic() + WATCH_S
        for s in (0, 2, 3):
            off, n = parts[s]
            socks[s].settimeout(0.3)
            while got[s] < n and time.monotonic() < end:
                try:
                    chunk = socks[s].recv(min(1 << 20, n - got[s]))
                except OSError:
                    break
                if not chunk:
                    break
                at = off + got[s]
                expect = orig[at : at + len(chunk)]
                wrong[0] += int(np.count_nonzero(np.frombuffer(chunk, np.uint8) != expect))
                got[s] += len(chunk)

    try:
        t = fail_then_mark(p, net, req, src, peer, reported)
        t.join(30)
        assert not t.is_alive()
        assert wrong[0] == 0, (
            f"the peer read {wrong[0]} bytes taken from the send buffer after test() reported the failure"
        )
        assert "send to peer" in p.log_text(), p.log_text()
    finally:
        reported.set()
        H.check(net.closeSend(scomm), "closeSend", p)
        for s in socks.values():
            s.close()


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return bytes(out)


# -- a handle whose connect state a peer filled ------------------------------------------------

FORGED = r"""
import ctypes as C, os, sys
sys.path.insert(0, sys.argv[1])
import nccl_harness as H
p = H.Plugin()
net = H.init_net(p, 12)
handle, lcomm = H.listen(p, net, 12, None)
raw = bytearray(handle.raw)
raw[64:72] = bytes.fromhex(sys.argv[2])
forged = C.create_string_buffer(bytes(raw), H.HANDLE_BYTES)
scomm = C.c_void_p()
rc = net.connect(None, 0, forged, C.byref(scomm), None)
print("rc", rc, "comm", bool(scomm.value))
print(p.log_text())
# A genuine pending connect's state copied into another handle is refused as well. The connect
# stays pending: its target's accept queue is full (a listener that never accepts, backlog filled).
import socket
stuck = socket.socket()
stuck.bind(("127.0.0.1", 0))
stuck.listen(0)
fill = [socket.socket() for _ in range(4)]
for f in fill:
    f.setblocking(False)
    f.connect_ex(stuck.getsockname())
raw[8:10] = stuck.getsockname()[1].to_bytes(2, "little")
raw[64:72] = bytes(8)
good = C.create_string_buffer(bytes(raw), H.HANDLE_BYTES)
rc1 = net.connect(None, 0, good, C.byref(scomm), None)
other = bytearray(H.HANDLE_BYTES)
other[:64] = bytes(raw[:64]); other[8] ^= 1  # another port
other[64:72] = good.raw[64:72]
assert good.raw[64:72] != bytes(8), "the connect did not stay pending"
rc2 = net.connect(None, 0, C.create_string_buffer(bytes(other), H.HANDLE_BYTES), C.byref(scomm), None)
print("copied", rc1, rc2, bool(scomm.value))
"""


@pytest.mark.parametrize("state", ["4141414141414141", "0100000000000000", "ffffffffffffffff"])
def test_forged_connect_state_in_a_handle_is_refused(state):
    """On the old code connect() followed bytes 64-72 as a pointer: the child crashed."""
    env = {k: v for k, v in os.environ.items() if k not in H.CLUSTER_VARS}
    env.update({"RS_NCCL_SOCKET_IFNAME": "lo", "RS_NCCL_NSOCKS": "2"})
    run = subprocess.run(
        [sys.executable, "-c", FORGED, str(TESTS), state], capture_output=True, text=True, timeout=60, env=env
    )
    assert run.returncode == 0, f"the process died ({run.returncode}):\n{run.stdout}\n{run.stderr[-3000:]}"
    assert f"rc {H.SUCCESS} " not in run.stdout and "comm False" in run.stdout, run.stdout
    assert "connect state (bytes 64-72) that this process did not write" in run.stdout, run.stdout
    (copied,) = [ln for ln in run.stdout.splitlines() if ln.startswith("copied")]
    _, rc1, rc2, made = copied.split()
    assert rc1 == str(H.SUCCESS) and rc2 != str(H.SUCCESS) and made == "False", copied
