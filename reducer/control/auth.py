"""Control-plane authentication: HMAC-SHA256 over a single-use server nonce, keyed by the data plane's token.

The token never crosses the network (the control port is plain gRPC, like the data port):
the client asks Challenge for a nonce, then sends with its request
    Drain:    mac = HMAC-SHA256(token, b"reduction_server.v1.Drain\\x00" + nonce + float64_le(timeout_s))
    GetStats: mac = HMAC-SHA256(token, b"reduction_server.v1.GetStats\\x00" + nonce)
The reducer accepts each nonce once, for NONCE_TTL seconds, and compares MACs in constant time;
the labels keep a proof for one RPC from being used for the other. Pure Python (hmac, secrets):
no grpc here.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

LABEL = b"reduction_server.v1.Drain\x00"
STATS_LABEL = b"reduction_server.v1.GetStats\x00"
NONCE_BYTES = 32
NONCE_TTL = 60.0  # seconds a nonce stays valid
MAX_NONCES = 1024  # outstanding nonces kept; the oldest is dropped past this


def drain_mac(token: str, nonce: bytes, timeout_s: float) -> bytes:
    """The MAC a Drain request carries (both sides compute it the same way)."""
    message = LABEL + bytes(nonce) + struct.pack("<d", float(timeout_s))
    return hmac.new(token.encode("utf-8"), message, hashlib.sha256).digest()


def stats_mac(token: str, nonce: bytes) -> bytes:
    """The MAC a GetStats request carries on a reducer that has a token."""
    return hmac.new(token.encode("utf-8"), STATS_LABEL + bytes(nonce), hashlib.sha256).digest()


class NonceBook:
    """Issues random nonces and accepts each one once, within NONCE_TTL seconds."""

    def __init__(self, ttl: float = NONCE_TTL, limit: int = MAX_NONCES) -> None:
        self.ttl = ttl
        self.limit = limit
        self._issued: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def issue(self) -> bytes:
        nonce = secrets.token_bytes(NONCE_BYTES)
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            self._issued[nonce] = now + self.ttl
            while len(self._issued) > self.limit:
                self._issued.popitem(last=False)
        return nonce

    def take(self, nonce: bytes) -> bool:
        """True if `nonce` was issued, has not expired and was not used yet (it is used now)."""
        with self._lock:
            self._expire(time.monotonic())
            return self._issued.pop(bytes(nonce), None) is not None

    def _expire(self, now: float) -> None:
        while self._issued:
            nonce, deadline = next(iter(self._issued.items()))
            if deadline > now:
                break
            del self._issued[nonce]


def check_drain(token: str | None, book: NonceBook, nonce: bytes, mac: bytes, timeout_s: float) -> str | None:
    """None if the Drain request proves the token (or there is no token), else why not (for the
    UNAUTHENTICATED status). Whether a reducer without a token takes Drain at all is the
    service's decision (--allow-unauthenticated-drain)."""
    if not token:
        return None
    return _check("Drain", book, nonce, mac, lambda n: drain_mac(token, n, timeout_s))


def check_stats(token: str | None, book: NonceBook, nonce: bytes, mac: bytes) -> str | None:
    """None if the GetStats request proves the token (or there is no token), else why not."""
    if not token:
        return None
    return _check("GetStats", book, nonce, mac, lambda n: stats_mac(token, n))


def _check(rpc: str, book: NonceBook, nonce: bytes, mac: bytes, expected: Callable[[bytes], bytes]) -> str | None:
    if not nonce or not mac:
        return (
            f"this reducer requires authentication: {rpc} needs a nonce from Challenge and its HMAC "
            "(the reducer's shared secret: --auth-token-file, RS_AUTH_TOKEN, RS_AUTH_TOKEN_FILE)"
        )
    if not book.take(nonce):
        return "unknown, expired or already used nonce: call Challenge again"
    if not hmac.compare_digest(expected(bytes(nonce)), bytes(mac)):
        return "authentication failed: the MAC does not match this reducer's token"
    return None
