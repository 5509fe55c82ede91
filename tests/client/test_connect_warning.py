"""A worker whose reducer refuses connections says so early, once, at WARNING.

With the default connect timeout (minutes) a worker used to print nothing until it gave up.
"""

from __future__ import annotations

import logging
import socket

import pytest

import reducer
from reducer.errors import ConnectError


def _refusing_address() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connects are refused
    return f"127.0.0.1:{port}"


def test_unreachable_reducer_is_named_once_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="reducer.core")
    address = _refusing_address()
    with pytest.raises(ConnectError, match="cannot connect to reducer " + address):
        reducer.Communicator([address], rank=0, world_size=1, connect_timeout=6.0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and address in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    text = warnings[0].getMessage()
    assert "cannot reach reducer" in text and "retrying for up to" in text and "RS_CONNECT_TIMEOUT" in text
