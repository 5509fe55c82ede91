"""Tools for the protocol and attack tests.

- An independent encoder of protocol version 2, written from docs/protocol.md (not from
  the C++ code): challenge, hello with its MAC, reply with its MAC, frames, job keys and
  job credentials.
- Raw peers: a worker that speaks the protocol by hand, optionally from another loopback
  address (127.0.0.2..127.0.0.9 act as different peers), and flooding helpers.
- Probes of a reducer's resources: its sockets in CLOSE-WAIT, RSS, CPU time, and a
  reducer in a subprocess under a descriptor limit.
- A well-behaved group that keeps all-reducing (checked against a numpy reference)
  while an attack runs.

Every loop here is bounded in count and in time; every socket wait has a timeout.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import resource
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
from child_lines import ChildLines

import reducer

# ---- protocol version 2, from docs/protocol.md ----------------------------------------------

MAGIC = 0x56525352
VERSION = 2
CHALLENGE = struct.Struct("<IHBBII32s")  # 48 bytes
HELLO = struct.Struct("<IHHIIHHIHHI32s32s")  # 96 bytes, then job id and group name
REPLY = struct.Struct("<IHH32s")  # 40 bytes, then the message
FRAME = struct.Struct("<BBBBIQQQQQ")  # 48 bytes, then `length` payload bytes
REPLY_MAC_OFFSET = 8
MAX_MESSAGE = 4096

DATA, RESULT, ERROR, BYE = 1, 2, 3, 4
F32, F64, F16, BF16, I32, I64 = 0, 1, 2, 3, 4, 5
SUM, AVG, MIN, MAX = 0, 1, 2, 3
LAST = 1  # DATA/RESULT flag: last chunk of the round
ERR_MISMATCH, ERR_PEER_LOST, ERR_PROTOCOL, ERR_SHUTDOWN, ERR_INTERNAL = 1, 2, 3, 4, 5

JOB_KEY_LABEL = b"reduction-server job key v1"
HELLO_LABEL = b"RSV2-HELLO"
REPLY_LABEL = b"RSV2-REPLY"
CREDENTIAL_PREFIX = "rsjob1"


class Status(IntEnum):
    OK = 0
    BAD_VERSION = 1
    AUTH_FAILED = 2
    BAD_HELLO = 3
    GROUP_CONFLICT = 4
    RANK_TAKEN = 5
    SHUTTING_DOWN = 6
    OVER_LIMIT = 7
    GROUP_INCOMPLETE = 8
    INTEGRITY_MISMATCH = 9


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def job_key(secret: bytes, job: bytes) -> bytes:
    """K_job = HMAC-SHA256(secret, "reduction-server job key v1" || 0x00 || job id)."""
    return _hmac(secret, JOB_KEY_LABEL + b"\0" + job)


def job_credential(job: str, key: bytes) -> str:
    """The job credential a worker may hold instead of the shared secret."""
    return f"{CREDENTIAL_PREFIX}:{job}:{key.hex()}"


@dataclass
class Challenge:
    magic: int
    version: int
    auth_required: bool
    max_chunk_bytes: int
    nonce: bytes

    @classmethod
    def parse(cls, raw: bytes) -> Challenge:
        magic, version, auth, _reserved, max_chunk, _reserved2, nonce = CHALLENGE.unpack(raw)
        return cls(magic, version, bool(auth), max_chunk, nonce)


def encode_challenge(
    nonce: bytes, auth_required: bool, version: int = VERSION, max_chunk_bytes: int = 64 << 20
) -> bytes:
    return CHALLENGE.pack(MAGIC, version, int(auth_required), 0, max_chunk_bytes, 0, nonce)


def encode_hello(
    challenge_nonce: bytes,
    *,
    world: int,
    rank: int,
    job: bytes,
    group: bytes,
    key: bytes | None = None,
    stream: int = 0,
    streams: int = 1,
    chunk: int = 1 << 20,
    version: int = VERSION,
    flags: int = 0,
    worker_nonce: bytes | None = None,
    job_len: int | None = None,
    group_len: int | None = None,
) -> bytes:
    """A complete hello; the MAC is computed when `key` (K_job) is given, else zeros.

    job_len/group_len override the length fields (to send lies about them).
    """
    wn = os.urandom(32) if worker_nonce is None else worker_nonce
    jl = len(job) if job_len is None else job_len
    gl = len(group) if group_len is None else group_len
    fields = (MAGIC, version, flags, world, rank, stream, streams, chunk, jl, gl, 0, wn)
    unsigned = HELLO.pack(*fields, b"\0" * 32)
    mac = _hmac(key, HELLO_LABEL + challenge_nonce + unsigned + job + group) if key is not None else b"\0" * 32
    return HELLO.pack(*fields, mac) + job + group


@dataclass
class Reply:
    status: int
    message: str
    raw_message: bytes
    mac: bytes
    fixed: bytes

    def mac_ok(self, key: bytes, worker_nonce: bytes, challenge_nonce: bytes) -> bool:
        zeroed = self.fixed[:REPLY_MAC_OFFSET] + b"\0" * 32
        want = _hmac(key, REPLY_LABEL + worker_nonce + challenge_nonce + zeroed + self.raw_message)
        return hmac.compare_digest(want, self.mac)


def encode_reply(
    status: int,
    message: bytes,
    key: bytes | None = None,
    worker_nonce: bytes = b"",
    challenge_nonce: bytes = b"",
    mac: bytes | None = None,
) -> bytes:
    unsigned = REPLY.pack(MAGIC, status, len(message), b"\0" * 32)
    if mac is None:
        mac = (
            _hmac(key, REPLY_LABEL + worker_nonce + challenge_nonce + unsigned + message)
            if key is not None
            else b"\0" * 32
        )
    return REPLY.pack(MAGIC, status, len(message), mac) + message


def frame(
    type_: int,
    length: int = 0,
    *,
    dtype: int = F32,
    op: int = SUM,
    flags: int = LAST,
    round_: int = 0,
    total: int = 0,
    shard: int | None = None,
    offset: int = 0,
    tag: int = 0,
) -> bytes:
    return FRAME.pack(type_, dtype, op, flags, length, round_, total, total if shard is None else shard, offset, tag)


def bye(text: bytes = b"") -> bytes:
    return frame(BYE, len(text), flags=0) + text


# ---- frame integrity (docs/protocol.md section 2, "Frame integrity") ----------------------------

HELLO_INTEGRITY = 1  # HELLO flags bit 0
FRAME_KEY_LABEL = b"RSV2-FRAME-KEY"
TO_REDUCER, TO_WORKER = 0, 1  # dir
TAG_BYTES = 16


def frame_key(k_job: bytes, direction: int, worker_nonce: bytes, challenge_nonce: bytes) -> bytes:
    """K_dir = HMAC-SHA256(K_job, "RSV2-FRAME-KEY" || dir || worker_nonce || challenge_nonce)."""
    return _hmac(k_job, FRAME_KEY_LABEL + bytes([direction]) + worker_nonce + challenge_nonce)


def gmac(key: bytes, direction: int, part: bytes, n: int, aad: bytes) -> bytes:
    """AES-256-GCM tag over `aad` with an empty plaintext, nonce dir || part || 0x0000 || n (LE)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = bytes([direction]) + part + b"\0\0" + struct.pack("<Q", n)
    return AESGCM(key).encrypt(nonce, b"", aad)  # = the 16-byte tag


def seal(key: bytes, direction: int, n: int, header: bytes, payload: bytes) -> bytes:
    """Frame n of a protected direction: header || header tag || payload || trailer."""
    return header + gmac(key, direction, b"H", n, header) + payload + gmac(key, direction, b"P", n, header + payload)


# ---- raw sockets --------------------------------------------------------------------------------


def connect(port: int, source: str = "127.0.0.1", timeout: float = 10.0) -> socket.socket:
    """A TCP connection to 127.0.0.1:port from `source` (any 127.0.0.0/8 address)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
    except BaseException:
        s.close()
        raise
    return s


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def recv_exact_into(sock: socket.socket, buf: bytearray) -> None:
    """Fills `buf` from the socket (no allocation: for large payloads)."""
    view = memoryview(buf)
    got = 0
    while got < len(buf):
        n = sock.recv_into(view[got:])
        if not n:
            raise ConnectionError(f"closed after {got} of {len(buf)} bytes")
        got += n


def closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    """True if the peer closes (or resets) the connection within `timeout` s; data is discarded."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            sock.settimeout(left)
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


class RawWorker:
    """One worker connection speaking the protocol by hand.

    key: K_job to sign the hello with (None: zero MAC, as without authentication).
    send_hello=False stops after reading the challenge (send self.hello_bytes yourself).
    """

    def __init__(
        self,
        port: int,
        rank: int = 0,
        world: int = 1,
        group: bytes = b"raw",
        job: bytes = b"j",
        key: bytes | None = None,
        chunk: int = 1 << 20,
        streams: int = 1,
        stream: int = 0,
        version: int = VERSION,
        source: str = "127.0.0.1",
        send_hello: bool = True,
        timeout: float = 10.0,
    ) -> None:
        self.sock = connect(port, source, timeout)
        try:
            self.challenge = Challenge.parse(recv_exact(self.sock, CHALLENGE.size))
            self.worker_nonce = os.urandom(32)
            self.key = key
            self.hello_bytes = encode_hello(
                self.challenge.nonce,
                world=world,
                rank=rank,
                job=job,
                group=group,
                key=key,
                stream=stream,
                streams=streams,
                chunk=chunk,
                version=version,
                worker_nonce=self.worker_nonce,
            )
            if send_hello:
                self.sock.sendall(self.hello_bytes)
        except BaseException:
            self.sock.close()
            raise

    def reply(self, timeout: float | None = None) -> Reply:
        if timeout is not None:
            self.sock.settimeout(timeout)
        fixed = recv_exact(self.sock, REPLY.size)
        magic, status, n, mac = REPLY.unpack(fixed)
        assert magic == MAGIC, f"bad magic in reply: {magic:#x}"
        assert n <= MAX_MESSAGE
        raw = recv_exact(self.sock, n)
        return Reply(status, raw.decode("utf-8", "replace"), raw, mac, fixed)

    def reply_mac_ok(self, r: Reply) -> bool:
        assert self.key is not None
        return r.mac_ok(self.key, self.worker_nonce, self.challenge.nonce)

    def send_data(
        self,
        payload: bytes,
        round_: int = 0,
        dtype: int = F32,
        op: int = SUM,
        flags: int = LAST,
        total: int | None = None,
        offset: int = 0,
    ) -> None:
        total = len(payload) if total is None else total
        self.sock.sendall(
            frame(DATA, len(payload), dtype=dtype, op=op, flags=flags, round_=round_, total=total, offset=offset)
            + payload
        )

    def frame(self, timeout: float | None = None):
        """(type, flags, round, offset, payload) of the next frame."""
        if timeout is not None:
            self.sock.settimeout(timeout)
        t, _dt, _op, fl, length, rnd, _total, _shard, off, _tag = FRAME.unpack(recv_exact(self.sock, FRAME.size))
        return t, fl, rnd, off, recv_exact(self.sock, length)

    def close(self) -> None:
        self.sock.close()


def close_all(socks: Sequence[socket.socket]) -> None:
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def open_nonblocking(port: int, sources: Sequence[str], count: int) -> list[socket.socket]:
    """`count` connections (round-robin over `sources`) whose connect may still be in progress.

    Never blocks: once the reducer's backlog is full the kernel simply holds the SYNs.
    """
    socks: list[socket.socket] = []
    for i in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((sources[i % len(sources)], 0))
            err = s.connect_ex(("127.0.0.1", port))
        except OSError:
            s.close()
            break
        if err not in (0, errno.EINPROGRESS):
            s.close()
            continue
        socks.append(s)
    return socks


def peers(n: int, first: int = 2) -> list[str]:
    """n loopback addresses 127.0.0.<first>.. acting as distinct peers (at most 127.0.0.9)."""
    assert first + n - 1 <= 9, "only 127.0.0.2..127.0.0.9 are used as extra peers"
    return [f"127.0.0.{first + i}" for i in range(n)]


def closed_within(socks: Sequence[socket.socket], seconds: float) -> list[bool]:
    """For each socket: did the peer close (or reset) it within `seconds`? Data received is discarded."""
    closed = [False] * len(socks)
    sel = selectors.DefaultSelector()
    for i, s in enumerate(socks):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
    deadline = time.monotonic() + seconds
    try:
        while not all(closed):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(min(left, 0.2)):
                i = key.data
                try:
                    data = socks[i].recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    closed[i] = True
                    sel.unregister(socks[i])
    finally:
        sel.close()
    return closed


class HalfHelloFlood:
    """Keeps up to `count` connections (round-robin over `sources`) that each read the challenge,
    send the first `sent` bytes of a valid hello and then say nothing more (slowloris).

    reopen=True replaces every connection the reducer closes, for `seconds` at most. Runs in a
    thread (one selector over all sockets); .opened/.closed count connections, .max_open is
    the largest number held at once, .open_now the current number.
    """

    def __init__(
        self, port: int, sources: Sequence[str], count: int, seconds: float, reopen: bool = False, sent: int = 40
    ) -> None:
        self.port, self.sources, self.count, self.seconds, self.reopen = port, list(sources), count, seconds, reopen
        self.sent = sent
        self.opened = self.closed = self.max_open = self.open_now = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started = threading.Event()

    def _open(self, sel: selectors.BaseSelector) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((self.sources[self.opened % len(self.sources)], 0))
            err = s.connect_ex(("127.0.0.1", self.port))
        except OSError:
            s.close()
            return
        if err not in (0, errno.EINPROGRESS):
            s.close()
            return
        self.opened += 1
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        sel.register(s, selectors.EVENT_READ, bytearray())

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        deadline = time.monotonic() + self.seconds
        try:
            for _ in range(self.count):
                self._open(sel)
            self.started.set()
            while not self._stop.is_set() and time.monotonic() < deadline and self.open_now:
                for key, _ in sel.select(0.1):
                    s, got = key.fileobj, key.data
                    try:
                        data = s.recv(4096)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if data and len(got) < CHALLENGE.size:
                        got += data
                        if len(got) >= CHALLENGE.size:
                            nonce = Challenge.parse(bytes(got[: CHALLENGE.size])).nonce
                            hello = encode_hello(nonce, world=2, rank=0, job=b"slow", group=b"loris")
                            try:
                                s.send(hello[: self.sent])
                            except OSError:
                                pass
                        continue
                    if data:
                        continue  # a reply: wait for the close
                    sel.unregister(s)
                    s.close()
                    self.closed += 1
                    self.open_now -= 1
                    if self.reopen and time.monotonic() < deadline and not self._stop.is_set():
                        self._open(sel)
        finally:
            self.started.set()
            for key in list(sel.get_map().values()):
                key.fileobj.close()
            sel.close()

    def start(self) -> HalfHelloFlood:
        self._thread.start()
        self.started.wait(60)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def __enter__(self) -> HalfHelloFlood:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FakeReducer:
    """A listener that plays a reducer which does NOT know the secret: it sends a challenge
    (auth_required as given), reads the hello and answers Ok with a MAC it cannot compute
    (`reply_mac`, random by default). Serves at most `max_conns` connections."""

    def __init__(self, auth_required: bool, reply_mac: bytes | None = None, max_conns: int = 16) -> None:
        self.auth_required, self.reply_mac, self.max_conns = auth_required, reply_mac, max_conns
        self.hellos: list[bytes] = []
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        served = 0
        while not self._stop.is_set() and served < self.max_conns:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            served += 1
            self._conns.append(conn)
            try:
                conn.settimeout(5)
                conn.sendall(encode_challenge(os.urandom(32), self.auth_required))
                fixed = recv_exact(conn, HELLO.size)
                fields = HELLO.unpack(fixed)
                names = recv_exact(conn, fields[8] + fields[9])
                self.hellos.append(fixed + names)
                mac = os.urandom(32) if self.reply_mac is None else self.reply_mac
                conn.sendall(encode_reply(Status.OK, b"welcome", mac=mac))
            except (OSError, ConnectionError, struct.error):
                continue

    def __enter__(self) -> FakeReducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        close_all(self._conns + [self.listener])


# ---- resource probes ---------------------------------------------------------------------------


def close_wait_count(port: int) -> int:
    """Sockets of the reducer's port in CLOSE-WAIT (the peer closed, the reducer has not)."""
    out = subprocess.run(
        ["ss", "-tanH", "state", "close-wait", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    return sum(1 for line in out.splitlines() if line.strip())


def rss_bytes(pid: int | None = None) -> int:
    with open(f"/proc/{pid or 'self'}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


class PeakSampler:
    """Samples fn() every `interval` s in a thread; .peak is the largest value seen."""

    def __init__(self, fn: Callable[[], int], interval: float = 0.02) -> None:
        self.fn, self.interval = fn, interval
        self.peak = fn()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.fn())
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.peak = max(self.peak, self.fn())


_SERVE_SCRIPT = r"""
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
import reducer
srv = reducer.ReducerServer(**json.loads(sys.argv[1])).start()
print(srv.port, flush=True)
sys.stdin.read()          # serve until the test closes our stdin
srv.stop()
"""


class ReducerProcess:
    """A reducer in a subprocess (ReducerServer kwargs), optionally under RLIMIT_NOFILE = nofile.

    Its log (stderr) goes to a file: .log_text(). Stop by leaving the context.
    """

    def __init__(
        self, tmp_dir: str, nofile: int | None = None, env: dict[str, str] | None = None, **kwargs: object
    ) -> None:
        kwargs.setdefault("host", "127.0.0.1")
        kwargs.setdefault("port", 0)
        self.log_path = os.path.join(tmp_dir, f"reducer-{time.monotonic_ns()}.log")
        self._log = open(self.log_path, "wb")
        full_env = dict(os.environ)
        full_env.update(env or {})

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE_SCRIPT, json.dumps(kwargs)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=full_env,
            preexec_fn=limit,
        )
        try:  # its first line: the port
            line = ChildLines(self.proc.stdout, "reducer").wait_for(lambda text: text.strip() != "", 30)
        except AssertionError:
            log = self.log_text()
            self.stop()
            raise RuntimeError(f"reducer subprocess did not start:\n{log[-3000:]}") from None
        self.port = int(line)
        self.address = f"127.0.0.1:{self.port}"
        self.pid = self.proc.pid

    def log_text(self) -> str:
        self._log.flush()
        with open(self.log_path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(15)
            except (subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()

    def __enter__(self) -> ReducerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(**kwargs: object) -> reducer.ReducerServer:
    """A started ReducerServer on 127.0.0.1 (any free port) with the given settings; use as a context."""
    kwargs.setdefault("host", "127.0.0.1")
    kwargs.setdefault("port", 0)
    return reducer.ReducerServer(**kwargs).start()


# ---- a well-behaved group -----------------------------------------------------------------------


def expected_sum(world: int, n: int, round_: int) -> np.ndarray:
    """The reference for GoodGroup's data: sum over ranks r of arange(n) * (r + 1) + round."""
    base = np.arange(n, dtype=np.int64)
    return sum(base * (r + 1) + round_ for r in range(world)).astype(np.int64)


class GoodGroup:
    """`world` real workers (reducer.Communicator, one thread each) doing `rounds` all-reduces.

    comm_kwargs go to every rank's Communicator, rank_kwargs[r] to rank r's only.

    Each rank contributes arange(n) * (rank + 1) + round as int32; every result is compared
    exactly with expected_sum. `timeout` is the workers' normal progress timeout, so a
    starved reducer shows up as ReductionTimeout. join() re-raises the first failure.
    """

    def __init__(
        self,
        address: str,
        group: str,
        rounds: int = 20,
        world: int = 2,
        n: int = 4096,
        timeout: float = 10.0,
        connect_timeout: float = 10.0,
        rank_kwargs: Sequence[dict[str, object]] | None = None,
        **comm_kwargs: object,
    ) -> None:
        self.address, self.group, self.rounds, self.world, self.n = address, group, rounds, world, n
        self.timeout, self.connect_timeout, self.comm_kwargs = timeout, connect_timeout, comm_kwargs
        self.rank_kwargs = list(rank_kwargs) if rank_kwargs is not None else [{}] * world
        self.errors: list[BaseException] = []
        self.done_rounds = [0] * world
        self.connected = threading.Barrier(world + 1)
        self._threads = [threading.Thread(target=self._rank, args=(r,), daemon=True) for r in range(world)]

    def _rank(self, rank: int) -> None:
        signalled = False
        try:
            kwargs = dict(self.comm_kwargs, **self.rank_kwargs[rank])
            with reducer.Communicator(
                [self.address],
                rank,
                self.world,
                group=self.group,
                timeout=self.timeout,
                connect_timeout=self.connect_timeout,
                **kwargs,
            ) as comm:
                try:
                    self.connected.wait(self.connect_timeout + 5)
                except threading.BrokenBarrierError:
                    pass
                signalled = True
                base = np.arange(self.n, dtype=np.int32)
                for rnd in range(self.rounds):
                    a = base * (rank + 1) + rnd
                    comm.allreduce(a)
                    want = expected_sum(self.world, self.n, rnd)
                    if not np.array_equal(a.astype(np.int64), want):
                        raise AssertionError(f"rank {rank} round {rnd}: wrong sum {a[:4]} != {want[:4]}")
                    self.done_rounds[rank] += 1
        except BaseException as exc:  # reported by join()
            self.errors.append(exc)
            if not signalled:
                self.connected.abort()

    def start(self) -> GoodGroup:
        for t in self._threads:
            t.start()
        return self

    def wait_connected(self) -> None:
        """Blocks until every rank has joined the group (raises if one failed to)."""
        try:
            self.connected.wait(self.connect_timeout + 10)
        except threading.BrokenBarrierError:
            self.join()
            raise

    def join(self, timeout: float = 120.0) -> None:
        for t in self._threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in self._threads), "a worker of the good group hangs"
        if self.errors:
            raise self.errors[0]
        assert self.done_rounds == [self.rounds] * self.world

    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def __enter__(self) -> GoodGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        for t in self._threads:
            t.join(120)


def run_good_group(address: str, group: str, rounds: int = 3, **kw: object) -> None:
    """A well-behaved group forms, all-reduces `rounds` times correctly and leaves."""
    g = GoodGroup(address, group, rounds=rounds, **kw).start()
    g.wait_connected()
    g.join()


class Flood:
    """Runs `step()` in `threads` threads until stopped or `seconds` pass; counts calls and errors."""

    def __init__(
        self, step: Callable[[int], None], threads: int = 1, seconds: float = 10.0, max_calls: int = 1_000_000
    ) -> None:
        self.step, self.seconds, self.max_calls = step, seconds, max_calls
        self.calls = 0
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, index: int) -> None:
        deadline = time.monotonic() + self.seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            with self._lock:
                if self.calls >= self.max_calls:
                    return
                self.calls += 1
            try:
                self.step(index)
            except (OSError, ConnectionError) as exc:
                with self._lock:
                    self.errors.append(exc)

    def start(self) -> Flood:
        for t in self._threads:
            t.start()
        return self

    def join(self) -> None:
        """Waits until the flood has run its course (max_calls made or `seconds` passed)."""
        for t in self._threads:
            t.join(self.seconds + 30)

    def stop(self) -> None:
        self._stop.set()
        self.join()

    def __enter__(self) -> Flood:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
