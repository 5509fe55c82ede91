"""The metrics port's HTTP server: bounded in connections, in threads and in time.

prometheus_client's own server runs one thread per connection and waits forever for a request;
this one reads requests in the front's selector thread (a connection has `request_timeout`
seconds to send its whole request head, at most MAX_REQUEST_BYTES), answers each complete GET
from a pool of `workers` threads, one request per connection (Connection: close), and refuses
politely what is over the limits: 429 past the per-peer request rate, 503 when the pool already
has `workers` x 2 requests to do. Nothing here knows about Prometheus: `render(accept)` returns
(body, content type).
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .front import FIRST_BYTES_S, Conn, SelectorFront
from .limits import ConnectionTable, LogThrottle, PeerRateLimiter

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 8192  # request line and headers
WRITE_TIMEOUT_S = 10.0  # to send one answer
DEFAULT_WORKERS = 2

Render = Callable[[str], tuple[bytes, str]]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    405: "Method Not Allowed",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def response(
    status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", head: bool = False, extra: str = ""
) -> bytes:
    """A complete HTTP/1.1 answer that closes the connection."""
    lines = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    )
    return lines.encode("ascii") + (b"" if head else body)


def parse_head(raw: bytes) -> tuple[str, str, str]:
    """(method, path, Accept header) of a request head; ValueError if it is not one."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError("not an HTTP/1.x request line")
    accept = ""
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == "accept":
            accept = value.strip()
    return parts[0], parts[1], accept


class MetricsServer(SelectorFront):
    """Serves `render` over HTTP on host:port (0 = any free port) within the limits given."""

    kind = "metrics"

    def __init__(
        self,
        host: str,
        port: int,
        render: Render,
        table: ConnectionTable,
        limiter: PeerRateLimiter | None = None,
        workers: int = DEFAULT_WORKERS,
        request_timeout: float = FIRST_BYTES_S,
    ) -> None:
        super().__init__(host, port, table, request_timeout)
        self.render = render
        self.limiter = limiter
        self.workers = int(workers)
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="rs-metrics")
        self._queued = 0
        self._lock = threading.Lock()
        self._slow = LogThrottle(log)

    def stop(self) -> None:
        super().stop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _opened(self, conn: Conn) -> None:
        conn.data = bytearray()
        self.sel.register(conn.sock, selectors.EVENT_READ, conn)

    def _expired(self, conn: Conn, now: float) -> str | None:
        # The whole request head must arrive in time, not just its first bytes.
        if now - conn.opened > self.first_bytes_s:
            return f"no complete request within {self.first_bytes_s:g}s"
        return None

    def _event(self, key: selectors.SelectorKey, mask: int) -> None:
        conn: Conn = key.data
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.close_conn(conn, str(exc))
            return
        if not data:
            self.close_conn(conn, "closed by the client")
            return
        self.received(conn)
        conn.data += data
        end = conn.data.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.data) > MAX_REQUEST_BYTES:
                self._answer_now(conn, 431, b"request head too large\n")
            return
        try:
            method, _path, accept = parse_head(bytes(conn.data[:end]))
        except ValueError as exc:
            self._answer_now(conn, 400, f"{exc}\n".encode())
            return
        if method not in ("GET", "HEAD"):
            self._answer_now(conn, 405, b"only GET and HEAD\n", extra="Allow: GET, HEAD\r\n")
        elif self.limiter is not None and not self.limiter.allow(conn.peer):
            if self.limiter.should_block(conn.peer):
                self.block(conn.peer)
            self._slow.warning(
                "metrics port: too many requests from %s (at most %g per second)", conn.peer, self.limiter.rate
            )
            self._answer_now(conn, 429, b"too many requests from this address\n", extra="Retry-After: 1\r\n")
        else:
            self._hand_off(conn, method == "HEAD", accept)

    def _answer_now(self, conn: Conn, status: int, body: bytes, extra: str = "") -> None:
        """A short refusal from the loop thread: one non-blocking send, then close."""
        try:
            conn.sock.send(response(status, body, extra=extra))
        except OSError:
            pass
        self.close_conn(conn, f"answered {status}")

    def _hand_off(self, conn: Conn, head: bool, accept: str) -> None:
        with self._lock:
            busy = self._queued >= self.workers * 2
            if not busy:
                self._queued += 1
        if busy:
            self._answer_now(conn, 503, b"busy: try again\n", extra="Retry-After: 1\r\n")
            return
        # The connection leaves the loop: the worker answers, closes it and frees its slot.
        self.conns.pop(conn.id, None)
        self.sel.unregister(conn.sock)
        self._pool.submit(self._serve, conn, head, accept)

    def _serve(self, conn: Conn, head: bool, accept: str) -> None:
        try:
            try:
                body, content_type = self.render(accept)
                answer = response(200, body, content_type, head=head)
            except Exception:  # a collector failed: say so rather than hang up
                log.exception("metrics: rendering failed")
                answer = response(500, b"rendering the metrics failed: see the reducer's log\n")
            conn.sock.setblocking(True)
            conn.sock.settimeout(WRITE_TIMEOUT_S)
            conn.sock.sendall(answer)
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        except OSError as exc:
            log.debug("metrics: answering %s failed: %s", conn.address, exc)
        finally:
            conn.sock.close()
            self.table.release(conn.id)
            with self._lock:
                self._queued -= 1
