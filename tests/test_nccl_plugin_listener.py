"""The point-to-point listener in the training process against peers that connect and never
speak, or speak nonsense (docs/security.md, the NCCL plugin's listener): a bounded number of
descriptors, a hello timeout, a throttled log, and real connections still get through."""

from __future__ import annotations

import ctypes as C
import math
import os
import socket
import time

import nccl_harness as H

MAX_PENDING = 64  # p2p::Listener::kMaxPending
BURST, WINDOW_S = 5, 10.0  # the listener's log limiter


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


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
    base = open_fds()
    clients: list[socket.socket] = []
    try:
        # 300 connections that never send their hello: the listener keeps at most MAX_PENDING.
        clients += connect_many(plugin, net, lcomm, addr, 300)
        assert not accept_once(plugin, net, lcomm).value
        held = open_fds() - base - len(clients)
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
        assert open_fds() - base - len(clients) <= MAX_PENDING

        # After the hello timeout every silent one is closed too. A connection the kernel queued
        # late (its handshake's last ACK lost to a full accept queue under load, then retried) is
        # taken by a later accept() with a timer of its own: poll until none is held, bounded.
        time.sleep(1.2)
        deadline = time.monotonic() + 15.0
        while True:
            assert not accept_once(plugin, net, lcomm).value
            held = open_fds() - base - len(clients)
            if held == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert held == 0, f"{held} silent connection(s) still open 15 s after the hello timeout"
    finally:
        for c in clients:
            c.close()
        H.check(net.closeListen(lcomm), "closeListen", plugin)
        plugin.close()
