"""The point-to-point listener in the training process against peers that connect and never
speak, or speak nonsense (docs/security.md, the NCCL plugin's listener): a bounded number of
descriptors, a hello timeout, a throttled log, and real connections still get through."""

from __future__ import annotations

import ctypes as C
import math
import socket
import struct
import subprocess
import sys
import threading
import time

import nccl_harness as H
import pytest

MAX_PENDING = 64  # p2p::Listener::kMaxPending
BURST, WINDOW_S = 5, 10.0  # the listener's log limiter


def held_open(clients: list[socket.socket]) -> int:
    """How many of our client sockets the listener still holds: no EOF and no reset seen on them.

    Counted on the clients themselves, not on the process's descriptors (other tests' clients
    closing in the background change those). A zero-timeout peek per socket: never waits."""
    n = 0
    for c in clients:
        c.setblocking(False)
        try:
            n += bool(c.recv(1, socket.MSG_PEEK))  # the listener never sends: data would mean open
        except BlockingIOError:
            n += 1  # nothing to read, not closed: still held
        except OSError:
            pass  # reset: closed
    return n


def held_within(clients: list[socket.socket], bound: int, timeout: float = 5.0) -> int:
    """held_open, polled (bounded) until it is at most `bound`: a close's FIN may trail the call."""
    deadline = time.monotonic() + timeout
    while (held := held_open(clients)) > bound and time.monotonic() < deadline:
        time.sleep(0.05)
    return held


def accept_once(plugin, net, lcomm) -> C.c_void_p:
    rcomm = C.c_void_p()
    H.check(net.accept(lcomm, C.byref(rcomm), None), "accept", plugin)
    return rcomm


def connect_many(plugin, net, lcomm, addr, n: int, payload: bytes = b"") -> list[socket.socket]:
    """n connections, NCCL's accept() called after every 16 (the kernel's accept queue is short)."""
    family, host, port = addr
    out = []
    for i in range(n):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect((host, port))
        if payload:
            s.sendall(payload)
        out.append(s)
        if i % 16 == 15:
            assert not accept_once(plugin, net, lcomm).value
    return out


def drop_lines(plugin) -> list[str]:
    return [t for lvl, t in plugin.log if "accept: dropping a connection" in t]


def test_listener_bounds_silent_and_junk_connections(monkeypatch):
    for k in H.CLUSTER_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RS_NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("RS_HANDSHAKE_TIMEOUT", "1")
    t0 = time.monotonic()
    plugin = H.Plugin()
    net = H.init_net(plugin, 12)
    handle, lcomm = H.listen(plugin, net, 12, None)
    addr = H.listen_address(handle)
    clients: list[socket.socket] = []
    try:
        # 300 connections that never send their hello: the listener keeps at most MAX_PENDING.
        clients += connect_many(plugin, net, lcomm, addr, 300)
        assert not accept_once(plugin, net, lcomm).value
        held = held_within(clients, MAX_PENDING)
        assert 0 < held <= MAX_PENDING, held

        # A real connection gets through the flood (the oldest waiting socket makes room).
        scomm, rcomm = C.c_void_p(), C.c_void_p()
        peer = C.create_string_buffer(handle.raw, H.HANDLE_BYTES)
        for _ in range(2000):
            if not scomm.value:
                H.check(net.connect(None, 0, peer, C.byref(scomm), None), "connect", plugin)
            if not rcomm.value:
                rcomm = accept_once(plugin, net, lcomm)
            if scomm.value and rcomm.value:
                break
            time.sleep(0.001)
        assert scomm.value and rcomm.value, plugin.log_text()
        H.check(net.closeSend(scomm), "closeSend", plugin)
        H.check(net.closeRecv(rcomm), "closeRecv", plugin)

        # 200 junk hellos: every one is dropped and closed, the log stays short.
        clients += connect_many(plugin, net, lcomm, addr, 200, payload=b"\xff" * 32)
        assert not accept_once(plugin, net, lcomm).value
        elapsed = time.monotonic() - t0
        assert len(drop_lines(plugin)) <= BURST * (1 + math.ceil(elapsed / WINDOW_S)), drop_lines(plugin)
        assert held_within(clients, MAX_PENDING) <= MAX_PENDING

        # After the hello timeout every silent one is closed too. A connection the kernel queued
        # late (its handshake's last ACK lost to a full accept queue under load, then retried) is
        # taken by a later accept() with a timer of its own: poll until none is held, bounded.
        time.sleep(1.2)
        deadline = time.monotonic() + 15.0
        while True:
            assert not accept_once(plugin, net, lcomm).value
            held = held_open(clients)
            if held == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert held == 0, f"{held} silent connection(s) still open 15 s after the hello timeout"
    finally:
        for c in clients:
            c.close()
        H.check(net.closeListen(lcomm), "closeListen", plugin)
        plugin.close()


# -- a connection flood from other addresses --------------------------------------------------

FLOOD = r"""
import signal, socket, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[4])
count, sources = int(sys.argv[3]), int(sys.argv[5])
ring, made, end = [], 0, time.monotonic() + seconds
def report(*_):
    print("made", made, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, report)
print("ready", flush=True)
while made < count and time.monotonic() < end:
    s = socket.socket()
    s.bind((f"127.0.0.{2 + made % sources}", 0))
    s.setblocking(False)
    s.connect_ex((host, port))  # never says a word
    ring.append(s)
    made += 1
    if len(ring) > 512:
        ring.pop(0).close()
report()
"""
FLOOD_MAX, FLOOD_S, FLOOD_SOURCES = 40000, 8.0, 8
PEERS, HELLO_DELAY_S = 10, 0.1
HELLO = struct.Struct("<IHHH6xQQ")  # p2p_listen.h


def late_peers(host: str, port: int, nonce: int, nsocks: int, out: list[str]) -> None:
    """PEERS peers from 127.0.0.1, one after another: connect every socket, say hello HELLO_DELAY_S later."""
    for k in range(PEERS):
        socks = []
        try:
            socks = [socket.create_connection((host, port), timeout=10) for _ in range(nsocks)]
            time.sleep(HELLO_DELAY_S)
            for i, s in enumerate(socks):
                s.sendall(HELLO.pack(0x484E5352, 1, i, nsocks, nonce, 1000 + k))
            time.sleep(0.05)
        except OSError as e:
            out.append(f"peer {k}: {e}")
        finally:
            for s in socks:
                s.close()


@pytest.mark.sanitize
def test_listener_keeps_late_peers_under_a_connection_flood(monkeypatch):
    """Silent connections from 8 other addresses, as fast as one process opens them (bounded in
    count and time), while 10 real peers say their hello 100 ms after connecting: each is accepted.
    The old listener closed the oldest waiting socket, a late peer's, after 64 newer ones."""
    for k in H.CLUSTER_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RS_NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("RS_NCCL_NSOCKS", "2")
    plugin = H.Plugin()
    net = H.init_net(plugin, 12)
    handle, lcomm = H.listen(plugin, net, 12, None)
    _family, host, port = H.listen_address(handle)
    nonce = int.from_bytes(handle.raw[16:24], "little")
    flood = subprocess.Popen(
        [sys.executable, "-c", FLOOD, host, str(port), str(FLOOD_MAX), str(FLOOD_S), str(FLOOD_SOURCES)],
        stdout=subprocess.PIPE,
        text=True,
    )
    accepted, errors = [], []
    try:
        assert flood.stdout is not None and flood.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # the flood is running
        peers = threading.Thread(target=late_peers, args=(host, port, nonce, 2, errors), daemon=True)
        peers.start()
        while peers.is_alive() or flood.poll() is None:
            rcomm = accept_once(plugin, net, lcomm)
            if rcomm.value:
                accepted.append(rcomm)
            if not peers.is_alive() and len(accepted) == PEERS:
                break
            time.sleep(0.001)
        for _ in range(100):  # the last peer's hello, after the flood ended
            if len(accepted) == PEERS:
                break
            rcomm = accept_once(plugin, net, lcomm)
            if rcomm.value:
                accepted.append(rcomm)
            time.sleep(0.01)
        peers.join(30)
    finally:
        flood.terminate()
        out = flood.communicate(timeout=30)[0]
        for rcomm in accepted:
            H.check(net.closeRecv(rcomm), "closeRecv", plugin)
        H.check(net.closeListen(lcomm), "closeListen", plugin)
        plugin.close()
    made = int(out.split()[-1])
    assert len(accepted) == PEERS, f"{len(accepted)} of {PEERS} accepted; {errors}; {made} flood connections"
    # Far more silent connections than the listener keeps: it evicted many while the peers waited.
    assert made >= 20 * MAX_PENDING, f"only {made} flood connections: the test proves nothing"
