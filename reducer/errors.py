"""Exception hierarchy. Every error raised by the library is a ReductionError.

The C++ core raises the same classes (the bindings translate its exceptions
into these), so callers only ever catch what is defined here.
"""

from __future__ import annotations


class ReductionError(RuntimeError):
    """Base class of every error raised by reduction-server."""


class ConfigError(ReductionError, ValueError):
    """Bad or missing configuration: arguments, environment, cluster description."""


class ConnectError(ReductionError, ConnectionError):
    """A reducer could not be reached (after bounded retries)."""


class AuthError(ReductionError):
    """The reducer rejected our credentials, or we sent none where it requires them."""


class ProtocolError(ReductionError):
    """A peer sent something that does not follow docs/protocol.md (or a wrong version)."""


class PeerLostError(ReductionError):
    """A reducer, or another worker of the group, went away in the middle of a round."""


class MismatchError(ReductionError):
    """Workers of one round disagree on size, dtype, op or contents (fusion fingerprint)."""


class ReductionTimeout(ReductionError, TimeoutError):
    """No progress within the configured timeout."""


__all__ = [
    "ReductionError",
    "ConfigError",
    "ConnectError",
    "AuthError",
    "ProtocolError",
    "PeerLostError",
    "MismatchError",
    "ReductionTimeout",
]
