"""A reducer played by the test, for the worker-side security tests (tests/client/test_worker_lies.py).

`LyingReducer` speaks protocol version 2 (docs/protocol.md, from tests/attack_tools.py's
independent encoder) to ONE real worker of a group whose other members are imaginary: it answers
every hello with `reply` (Ok by default, without authentication), every DATA chunk with what
`on_data` returns (by default the honest RESULT: the worker's own chunk, as if the other members
contributed zeros) and every DONE with what `on_done` returns (by default the CLEAR it asks for).
A script decides where it lies.

Every connection is served by a thread of its own; every socket wait has a timeout.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from attack_tools import (
    BYE,
    DATA,
    ERROR,
    FRAME,
    HELLO,
    RESULT,
    Status,
    close_all,
    encode_challenge,
    encode_reply,
    recv_exact,
)

DONE, CLEAR = 5, 6
ERR_FAILOVER = 6  # ERROR code: another worker lost reducers (tag = mask)
EXCHANGE_TAG = 0x5245564F4C494146  # "FAILOVER": the tag of the failover exchange's rounds
I64 = 5


@dataclass(frozen=True)
class Header:
    """A frame header (48 bytes, little-endian; docs/protocol.md section 2)."""

    type: int
    dtype: int
    op: int
    flags: int
    length: int
    round: int
    total: int
    shard: int
    offset: int
    tag: int

    @classmethod
    def parse(cls, raw: bytes) -> Header:
        return cls(*FRAME.unpack(raw))

    def pack(self) -> bytes:
        return FRAME.pack(
            self.type,
            self.dtype,
            self.op,
            self.flags,
            self.length,
            self.round,
            self.total,
            self.shard,
            self.offset,
            self.tag,
        )


def result_for(h: Header, payload: bytes) -> bytes:
    """The RESULT frame answering DATA `h` with `payload` (the header's length follows the payload)."""
    return replace(h, type=RESULT, length=len(payload)).pack() + payload


def error_frame(code: int, text: bytes, tag: int = 0) -> bytes:
    return Header(ERROR, 0, 0, code, len(text), 0, 0, 0, 0, tag).pack() + text


def clear_frame(round_: int) -> bytes:
    return Header(CLEAR, 0, 0, 0, 0, round_, 0, 0, 0, 0).pack()


# on_data(connection index, header, payload) -> bytes to send, or None for the honest result.
OnData = Callable[[int, Header, bytes], bytes | None]
# on_done(connection index, header) -> bytes to send, or None for the honest CLEAR.
OnDone = Callable[[int, Header], bytes | None]


class LyingReducer:
    """Listens on 127.0.0.1 (any free port); serves at most `max_conns` connections."""

    def __init__(
        self,
        on_data: OnData | None = None,
        reply: tuple[int, bytes] = (Status.OK, b"welcome"),
        max_conns: int = 8,
        timeout: float = 20.0,
        on_done: OnDone | None = None,
        idle_lie: tuple[float, bytes] | None = None,
        answer_hellos: int | None = None,
    ) -> None:
        self.on_data, self.reply, self.max_conns, self.timeout = on_data, reply, max_conns, timeout
        self.on_done = on_done
        # (delay, bytes): sent on the first connection `delay` seconds after it answered its first
        # DATA frame, unasked: to a worker that has its results and is idle by then.
        self.idle_lie = idle_lie
        # Connections from this index on get their challenge, and no reply to their hello ever.
        self.answer_hellos = answer_hellos
        self.unanswered = threading.Event()  # set once such a hello has come
        self.data: list[tuple[int, Header]] = []  # (connection, header) of every DATA frame received
        self.errors: list[BaseException] = []  # unexpected failures of the script itself
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"

    def _next_connection(self) -> socket.socket | None:
        """The next connection, or None once stopped (or the listener is closed)."""
        while not self._stop.is_set():
            ready, _, _ = select.select([self.listener], [], [], 0.2)
            if ready:
                try:
                    return self.listener.accept()[0]
                except OSError:
                    return None
        return None

    def _accept(self) -> None:
        for index in range(self.max_conns):
            conn = self._next_connection()
            if conn is None:
                return
            conn.settimeout(self.timeout)
            with self._lock:
                self._socks.append(conn)
            t = threading.Thread(target=self._serve, args=(conn, index), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket, index: int) -> None:
        try:
            conn.sendall(encode_challenge(os.urandom(32), False))
            fixed = recv_exact(conn, HELLO.size)
            fields = HELLO.unpack(fixed)
            recv_exact(conn, fields[8] + fields[9])
            if self.answer_hellos is not None and index >= self.answer_hellos:
                self.unanswered.set()
                self._stop.wait()
                return
            conn.sendall(encode_reply(self.reply[0], self.reply[1]))
            if self.reply[0] != Status.OK:
                return
            while not self._stop.is_set():
                h = Header.parse(recv_exact(conn, FRAME.size))
                payload = recv_exact(conn, h.length)
                if h.type == DATA:
                    with self._lock:
                        self.data.append((index, h))
                    out = self.on_data(index, h, payload) if self.on_data else None
                    conn.sendall(result_for(h, payload) if out is None else out)
                    if index == 0 and self.idle_lie is not None:
                        self._send_later(conn, *self.idle_lie)
                elif h.type == DONE:
                    out = self.on_done(index, h) if self.on_done else None
                    conn.sendall(clear_frame(h.round) if out is None else out)
                elif h.type == BYE:
                    return
        except (OSError, ConnectionError, struct.error):
            pass  # the worker left
        except BaseException as exc:  # a broken script: reported to the test
            self.errors.append(exc)

    def _send_later(self, conn: socket.socket, delay: float, data: bytes) -> None:
        self.idle_lie = None  # once

        def send() -> None:
            if not self._stop.wait(delay):
                try:
                    conn.sendall(data)
                except OSError:
                    pass  # the worker left

        t = threading.Thread(target=send, daemon=True)
        t.start()
        self._threads.append(t)

    def __enter__(self) -> LyingReducer:
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with self._lock:
            socks = list(self._socks)
        close_all(socks + [self.listener])
        for t in self._threads:
            t.join(10)


__all__ = [
    "CLEAR",
    "DONE",
    "ERR_FAILOVER",
    "EXCHANGE_TAG",
    "Header",
    "I64",
    "LyingReducer",
    "clear_frame",
    "error_frame",
    "result_for",
]
