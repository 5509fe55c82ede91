"""Accepting fronts of the control port and the metrics port: one selector thread per port.

SelectorFront accepts under a ConnectionTable (a total cap, a per-peer cap, fair eviction when
full), closes a connection that sends nothing for `first_bytes_s` seconds, pauses accepting for a
moment when the process is out of descriptors (never spins, never crashes), and leaves what to do
with the bytes to a subclass:

- ControlFront (here) splices each admitted connection to the reducer's internal gRPC server on
  the loopback interface and remembers which real peer each of its upstream connections carries
  (real_peer(), for the per-peer request limits of reducer.control.service); a connection that
  sends no byte for `idle_s` seconds is closed;
- reducer.control.http.MetricsServer reads one HTTP request and answers it from a bounded pool.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import threading
import time
from typing import Any

from reducer.addresses import format_address

from .limits import BLOCK_S, MAX_TRACKED_PEERS, ConnectionTable, LogThrottle, grpc_peer_host, peer_key

log = logging.getLogger(__name__)

FIRST_BYTES_S = 10.0  # seconds a new connection has to send something (metrics: its whole request)
IDLE_S = 60.0  # control port: seconds without a byte from the client before it is closed
ACCEPT_PAUSE_S = 0.1  # no accepting for this long after EMFILE/ENFILE/ENOBUFS/ENOMEM
BUFFER_BYTES = 64 << 10  # per direction, per control connection
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def listen_socket(host: str, port: int, backlog: int = 64) -> socket.socket:
    """A non-blocking listening TCP socket on host:port (port 0 = any free port); OSError if not."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, IndexError) as exc:
        raise OSError(f"cannot listen on {format_address(host, port)}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and host in ("", "::"):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(addr)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {format_address(host, port)}: {exc.strerror or exc}") from None
    return sock


class Conn:
    """One admitted client connection."""

    __slots__ = ("id", "sock", "peer", "address", "opened", "last_in", "got_first", "data")

    def __init__(self, conn_id: int, sock: socket.socket, peer: str, address: Any) -> None:
        self.id, self.sock, self.peer, self.address = conn_id, sock, peer, address
        self.opened = self.last_in = time.monotonic()
        self.got_first = False
        self.data: Any = None


class SelectorFront:
    """Accepts on host:port under `table` in a thread of its own; subclasses handle the bytes."""

    kind = "front"

    def __init__(self, host: str, port: int, table: ConnectionTable, first_bytes_s: float = FIRST_BYTES_S) -> None:
        self.table = table
        self.first_bytes_s = float(first_bytes_s)
        self.listener = listen_socket(host, port)
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, Conn] = {}
        self.refused = 0
        self.timed_out = 0
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._accepting = True
        self._resume_at = 0.0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"rs-{self.kind}", daemon=True)
        self._refusals = LogThrottle(log)
        self._blocks = LogThrottle(log)
        self._blocked: dict[str, float] = {}  # peer key -> until (monotonic)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def start(self) -> SelectorFront:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping = True
        self.wake()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self._close_everything()

    def block(self, peer: str, seconds: float = BLOCK_S) -> None:
        """Close `peer`'s connections and refuse its new ones for `seconds` (any thread)."""
        if len(self._blocked) >= MAX_TRACKED_PEERS:
            self._blocked.clear()
        self._blocked[peer] = time.monotonic() + seconds
        self._blocks.warning(
            "%s port: %s is far over its request rate: its connections are closed and new ones refused for %gs",
            self.kind,
            peer,
            seconds,
        )
        self.wake()

    def blocked(self, peer: str, now: float) -> bool:
        until = self._blocked.get(peer)
        if until is None:
            return False
        if until <= now:
            self._blocked.pop(peer, None)
            return False
        return True

    def wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    # -- the loop ---------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                accept = False
                for key, mask in self.sel.select(0.25):
                    if key.data == "accept":
                        accept = True
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._event(key, mask)
                # Accepts last: connections that closed in the same batch free their places first,
                # so a newcomer is not refused (or made to evict) for slots already given back.
                if accept:
                    self._accept_some()
                self._sweep(time.monotonic())
        except Exception:  # a bug here must not take the process down; the port stops answering
            log.exception("%s loop failed; the port no longer answers", self.kind)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _accept_some(self) -> None:
        for _ in range(64):
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    self._pause_accepting(exc)
                return
            self._admit(sock, address)

    def _pause_accepting(self, exc: OSError) -> None:
        self._refusals.warning("%s port: cannot accept (%s); pausing %gs", self.kind, exc.strerror, ACCEPT_PAUSE_S)
        self.sel.unregister(self.listener)
        self._accepting = False
        self._resume_at = time.monotonic() + ACCEPT_PAUSE_S

    def _admit(self, sock: socket.socket, address: Any) -> None:
        peer = peer_key(str(address[0]))
        if self._blocked and self.blocked(peer, time.monotonic()):
            self.refused += 1
            sock.close()
            return
        verdict = self.table.admit(peer)
        if not verdict.ok:
            self.refused += 1
            self._refusals.warning("%s port: refused a connection from %s: %s", self.kind, address[0], verdict.why)
            sock.close()
            return
        if verdict.evict is not None and verdict.evict in self.conns:
            victim = self.conns[verdict.evict]
            self._refusals.warning(
                "%s port: full (%d connections): closed the least active one of %s for one from %s",
                self.kind,
                self.table.max_total,
                victim.peer,
                address[0],
            )
            self.close_conn(victim, f"evicted for a connection from {peer}")
        sock.setblocking(False)
        conn = Conn(verdict.conn_id, sock, peer, address)
        self.conns[conn.id] = conn
        try:
            self._opened(conn)
        except OSError as exc:
            self.close_conn(conn, f"cannot serve it: {exc}")

    def _sweep(self, now: float) -> None:
        if not self._accepting and now >= self._resume_at:
            self.sel.register(self.listener, selectors.EVENT_READ, "accept")
            self._accepting = True
        for conn in list(self.conns.values()):
            why = (
                "blocked: far over its request rate"
                if self._blocked and self.blocked(conn.peer, now)
                else self._expired(conn, now)
            )
            if why:
                self.timed_out += 1
                self.close_conn(conn, why)

    def _expired(self, conn: Conn, now: float) -> str | None:
        if not conn.got_first and now - conn.opened > self.first_bytes_s:
            return f"sent nothing for {self.first_bytes_s:g}s"
        return None

    def received(self, conn: Conn) -> None:
        conn.last_in = time.monotonic()
        conn.got_first = True
        self.table.touch(conn.id)

    def close_conn(self, conn: Conn, why: str) -> None:
        if self.conns.pop(conn.id, None) is None:
            return
        log.debug("%s port: closing %s: %s", self.kind, conn.address, why)
        self._closing(conn)
        _unregister(self.sel, conn.sock)
        conn.sock.close()
        self.table.release(conn.id)

    def _close_everything(self) -> None:
        for conn in list(self.conns.values()):
            self.close_conn(conn, "stopping")
        for s in (self.listener, self._wake_r, self._wake_w):
            s.close()
        self.sel.close()

    # -- what subclasses do -------------------------------------------------------------------------

    def _opened(self, conn: Conn) -> None:
        raise NotImplementedError

    def _event(self, key: selectors.SelectorKey, mask: int) -> None:
        raise NotImplementedError

    def _closing(self, conn: Conn) -> None:
        """Release what the subclass holds for `conn` (its socket is closed afterwards)."""


def _unregister(sel: selectors.BaseSelector, sock: socket.socket) -> None:
    try:
        sel.unregister(sock)
    except (KeyError, ValueError):
        pass


def _set_interest(sel: selectors.BaseSelector, sock: socket.socket, mask: int, data: Any) -> None:
    """Watch `sock` for `mask` (0 = not at all)."""
    try:
        key = sel.get_key(sock)
    except KeyError:
        key = None
    if mask == 0:
        if key is not None:
            sel.unregister(sock)
    elif key is None:
        sel.register(sock, mask, data)
    elif key.events != mask:
        sel.modify(sock, mask, data)


class _Pipe:
    """A client connection spliced to the internal gRPC server."""

    __slots__ = ("conn", "up", "local_port", "to_up", "to_client", "connecting")

    def __init__(self, conn: Conn, up: socket.socket, local_port: int) -> None:
        self.conn, self.up, self.local_port = conn, up, local_port
        self.to_up = bytearray()
        self.to_client = bytearray()
        self.connecting = True


class ControlFront(SelectorFront):
    """The control port: admitted connections are spliced to `upstream` (the internal gRPC server)."""

    kind = "control"

    def __init__(
        self,
        host: str,
        port: int,
        table: ConnectionTable,
        upstream: tuple[str, int],
        first_bytes_s: float = FIRST_BYTES_S,
        idle_s: float = IDLE_S,
    ) -> None:
        super().__init__(host, port, table, first_bytes_s)
        self.upstream = upstream
        self.idle_s = float(idle_s)
        self._peers: dict[int, str] = {}  # local port of an upstream connection -> the client's peer key

    def real_peer(self, grpc_peer: str) -> str:
        """The peer key of the client behind an RPC the internal server got (context.peer())."""
        host, port = grpc_peer_host(grpc_peer)
        found = self._peers.get(port) if port is not None else None
        return found if found is not None else peer_key(host)

    def _opened(self, conn: Conn) -> None:
        up = socket.socket(socket.AF_INET6 if ":" in self.upstream[0] else socket.AF_INET, socket.SOCK_STREAM)
        try:
            up.setblocking(False)
            err = up.connect_ex(self.upstream)
            if err not in (0, errno.EINPROGRESS):
                raise OSError(err, f"cannot reach the control plane's gRPC server: {errno.errorcode.get(err, err)}")
            local_port = int(up.getsockname()[1])
        except OSError:
            up.close()
            raise
        pipe = _Pipe(conn, up, local_port)
        conn.data = pipe
        self._peers[local_port] = conn.peer
        self._update(pipe)

    def _closing(self, conn: Conn) -> None:
        pipe: _Pipe | None = conn.data
        if pipe is None:
            return
        self._peers.pop(pipe.local_port, None)
        _unregister(self.sel, pipe.up)
        pipe.up.close()

    def _expired(self, conn: Conn, now: float) -> str | None:
        why = super()._expired(conn, now)
        if why is None and now - conn.last_in > self.idle_s:
            why = f"no byte from the client for {self.idle_s:g}s"
        return why

    def _event(self, key: selectors.SelectorKey, mask: int) -> None:
        pipe, side = key.data
        if pipe.conn.id not in self.conns:
            return
        try:
            if side == "u" and pipe.connecting and mask & selectors.EVENT_WRITE:
                err = pipe.up.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, "cannot reach the control plane's gRPC server")
                pipe.connecting = False
            if mask & selectors.EVENT_READ and not self._read(pipe, side):
                return
            self._flush(pipe)
        except OSError as exc:
            self.close_conn(pipe.conn, str(exc))
            return
        self._update(pipe)

    def _read(self, pipe: _Pipe, side: str) -> bool:
        """Read what `side` has; False when the pipe was closed (end of stream on either side)."""
        sock = pipe.conn.sock if side == "c" else pipe.up
        try:
            data = sock.recv(BUFFER_BYTES)
        except (BlockingIOError, InterruptedError):
            return True
        if not data:
            if side == "u" and pipe.to_client:  # the server's last words (GOAWAY), best effort
                try:
                    pipe.conn.sock.send(pipe.to_client)
                except OSError:
                    pass
            self.close_conn(pipe.conn, "closed by the " + ("client" if side == "c" else "server"))
            return False
        if side == "c":
            self.received(pipe.conn)
            pipe.to_up += data
        else:
            pipe.to_client += data
        return True

    def _flush(self, pipe: _Pipe) -> None:
        for buf, sock, ready in ((pipe.to_up, pipe.up, not pipe.connecting), (pipe.to_client, pipe.conn.sock, True)):
            if buf and ready:
                try:
                    sent = sock.send(buf)
                except (BlockingIOError, InterruptedError):
                    continue
                del buf[:sent]

    def _update(self, pipe: _Pipe) -> None:
        client = (selectors.EVENT_READ if len(pipe.to_up) < BUFFER_BYTES else 0) | (
            selectors.EVENT_WRITE if pipe.to_client else 0
        )
        up = (selectors.EVENT_READ if len(pipe.to_client) < BUFFER_BYTES and not pipe.connecting else 0) | (
            selectors.EVENT_WRITE if pipe.to_up or pipe.connecting else 0
        )
        _set_interest(self.sel, pipe.conn.sock, client, (pipe, "c"))
        _set_interest(self.sel, pipe.up, up, (pipe, "u"))
