"""The ring baseline's no-progress error (csrc/ring/ring_round.cc) names what TCP says of its link
to the right neighbour, as the worker client's does for each reducer link (docs/operations.md,
"A stalled round")."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

import reducer
from reducer._native import core


@pytest.mark.timeout(60)
def test_a_ring_round_that_stops_names_its_tcp_state():
    rings = [core.Ring(r, 2, "127.0.0.1", 0, 2.0) for r in range(2)]
    addrs = [f"127.0.0.1:{r.port}" for r in rings]
    threads = [threading.Thread(target=r.connect, args=(addrs, 20.0)) for r in rings]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        a = np.ones(1 << 16, dtype=np.float32)
        # Rank 1 never joins the round: rank 0 sends its first steps and hears nothing back.
        with pytest.raises(reducer.ReductionTimeout, match="made no progress for 2.0 s: sent") as info:
            rings[0].allreduce_ptr(int(a.ctypes.data), int(a.nbytes), "float32", "sum")
        text = str(info.value)
        assert "to the right, tcp: unacked " in text, text
        assert re.search(r"nothing unacked: waiting on the right neighbour", text), text
    finally:
        for r in rings:
            r.close()
