"""Drain authentication: HMAC-SHA256 over a single-use server nonce, keyed by the data plane's token.

The token never crosses the network (the control port is plain gRPC, like the data port):
the client asks Challenge for a nonce, then sends
    mac = HMAC-SHA256(token, b"reduction_server.v1.Drain\\x00" + nonce + float64_le(timeout_s))
with its Drain request. The reducer accepts each nonce once, for NONCE_TTL seconds, and compares
MACs in constant time. Pure Python (hmac, secrets): no grpc here.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import threading
import time
from collections import OrderedDict
from typing import Optional

LABEL = b"reduction_server.v1.Drain\x00"
NONCE_BYTES = 32
NONCE_TTL = 60.0         # seconds a nonce stays valid
MAX_NONCES = 1024        # outstanding nonces kept; the oldest is dropped past this


def drain_mac(token: str, nonce: bytes, timeout_s: float) -> bytes:
    """The MAC a Drain request carries (both sides compute it the same way)."""
    message = LABEL + bytes(nonce) + struct.pack("<d", float(timeout_s))
    return hmac.new(token.encode("utf-8"), message, hashlib.sha256).digest()


class NonceBook:
    """Issues random nonces and accepts each one once, within NONCE_TTL seconds."""

    def __init__(self, ttl: float = NONCE_TTL, limit: int = MAX_NONCES) -> None:
        self.ttl = ttl
        self.limit = limit
        self._issued: "OrderedDict[bytes, float]" = OrderedDict()
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


def check_drain(token: Optional[str], book: NonceBook, nonce: bytes, mac: bytes, timeout_s: float) -> Optional[str]:
    """None if the Drain request may proceed, else why not (for the UNAUTHENTICATED status)."""
    if not token:
        return None
    if not nonce or not mac:
        return "this reducer requires authentication: Drain needs a nonce from Challenge and its HMAC"
    if not book.take(nonce):
        return "unknown, expired or already used nonce: call Challenge again"
    if not hmac.compare_digest(drain_mac(token, nonce, timeout_s), bytes(mac)):
        return "authentication failed: the MAC does not match this reducer's token"
    return None
