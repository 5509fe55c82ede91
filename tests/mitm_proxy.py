"""An on-path attacker for the integrity tests: a TCP proxy on loopback between workers and a
reducer that understands the protocol's framing (docs/protocol.md) and can tamper with frames.

Every accepted connection is relayed to the reducer by two threads, one per direction. The
handshake is passed through untouched; after it, each direction is cut into frames (header,
then, with `tags`, the 16-byte header tag; the payload; with `tags` the 16-byte trailer) and
every frame goes through `tamper(direction, conn, index, frame) -> frames to send instead`
(index counts the frames of that direction of that connection from 0, conn the proxied
connections from 0). Tampering helpers below: flip one bit, drop, replay, swap with the next.

Every socket wait has a timeout; a direction ends when its sender closes (the end is passed on).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable

from attack_tools import CHALLENGE, FRAME, HELLO, REPLY, TAG_BYTES, recv_exact

TO_REDUCER, TO_WORKER = "to_reducer", "to_worker"
Tamper = Callable[[str, int, int, bytes], list[bytes]]


def untouched(_direction: str, _conn: int, _index: int, frame: bytes) -> list[bytes]:
    return [frame]


def flip(direction: str, index: int, offset: int, *, conn: int = 0, bit: int = 0) -> Tamper:
    """Flips bit `bit` of byte `offset` of frame `index` (offset 0 = the header's first byte)."""

    def tamper(d: str, c: int, i: int, frame: bytes) -> list[bytes]:
        if (d, c, i) != (direction, conn, index):
            return [frame]
        b = bytearray(frame)
        b[offset] ^= 1 << bit
        return [bytes(b)]

    return tamper


def drop(direction: str, index: int, *, conn: int = 0) -> Tamper:
    return lambda d, c, i, frame: [] if (d, c, i) == (direction, conn, index) else [frame]


def replay(direction: str, index: int, *, conn: int = 0) -> Tamper:
    return lambda d, c, i, frame: [frame, frame] if (d, c, i) == (direction, conn, index) else [frame]


def swap(direction: str, index: int, *, conn: int = 0) -> Tamper:
    """Holds frame `index` back and sends it after frame index + 1."""
    held: list[bytes] = []

    def tamper(d: str, c: int, i: int, frame: bytes) -> list[bytes]:
        if (d, c) != (direction, conn):
            return [frame]
        if i == index:
            held.append(frame)
            return []
        if i == index + 1 and held:
            return [frame, held.pop()]
        return [frame]

    return tamper


class Proxy:
    """Listens on 127.0.0.1 (any free port) and relays to 127.0.0.1:`target_port`."""

    def __init__(self, target_port: int, tags: bool, tamper: Tamper = untouched, timeout: float = 30.0) -> None:
        self.target_port = target_port
        self.tags = tags
        self.tamper = tamper
        self.timeout = timeout
        self.frames = {TO_REDUCER: 0, TO_WORKER: 0}  # frames relayed (all connections)
        self.tampered = 0  # frames the tamper function changed
        self._lock = threading.Lock()
        self._conns = 0
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._spawn(self._accept_loop)

    def _spawn(self, fn: Callable[..., None], *args: object) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                worker, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            reducer = socket.create_connection(("127.0.0.1", self.target_port), timeout=self.timeout)
            for s in (worker, reducer):
                s.settimeout(self.timeout)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                conn = self._conns
                self._conns += 1
                self._socks += [worker, reducer]
            self._spawn(self._relay, worker, reducer, TO_REDUCER, conn)
            self._spawn(self._relay, reducer, worker, TO_WORKER, conn)

    def _next_frame(self, src: socket.socket) -> bytes:
        header = recv_exact(src, FRAME.size)
        length = struct.unpack_from("<I", header, 4)[0]
        rest = recv_exact(src, length + (2 * TAG_BYTES if self.tags else 0))
        return header + rest

    def _relay(self, src: socket.socket, dst: socket.socket, direction: str, conn: int) -> None:
        try:
            # The handshake, untouched: challenge then reply one way, the hello the other.
            if direction == TO_WORKER:
                dst.sendall(recv_exact(src, CHALLENGE.size))
                fixed = recv_exact(src, REPLY.size)
                dst.sendall(fixed + recv_exact(src, struct.unpack_from("<H", fixed, 6)[0]))
            else:
                fixed = recv_exact(src, HELLO.size)
                job_len, group_len = struct.unpack_from("<HH", fixed, 24)
                dst.sendall(fixed + recv_exact(src, job_len + group_len))
            index = 0
            while not self._closed.is_set():
                frame = self._next_frame(src)
                out = self.tamper(direction, conn, index, frame)
                with self._lock:
                    self.frames[direction] += 1
                    if out != [frame]:
                        self.tampered += 1
                for f in out:
                    dst.sendall(f)
                index += 1
        except (OSError, EOFError, ConnectionError):
            pass  # either side closed
        finally:
            # Pass the end on in this direction only: what the other direction still carries
            # (a reducer's ERROR frame after the worker's frame was refused) must get through.
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        self._closed.set()
        self.listener.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            try:
                s.close()
            except OSError:
                pass
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Proxy", "TO_REDUCER", "TO_WORKER", "flip", "drop", "replay", "swap", "untouched"]
