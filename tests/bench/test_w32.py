"""W=32 workers x R=32 reducers on emulated 0.025 Gbit/s links (issue 31): the case where a round
stopped for good (`ReductionTimeout: all-reduce round 7 made no progress for 60 s ... sent 4/32
chunks, got 0/32 results` on 23 reducers at once).

Opt-in (64 emulated hosts on this machine's 2 cores: 1-2 minutes when they are quiet, much longer when not):
`pytest -m soak tests/bench/test_w32.py`. Needs root and iproute2 (skipped otherwise). Fails on a stall
or any other error of the bench (the stall's message names each stuck link's TCP state:
docs/operations.md, "A stalled round") and on a sum that is not exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from conftest import child_env_in_tree
from paths import ROOT

from reducer.bench import emulate

_REASON = emulate.unavailable_reason()

# The command; --iters 2 --warmup 1: three 16 MiB rounds per worker.
ARGS = ["--workers", "32", "--reducers", "32", "--sizes", "16M", "--algos", "rs", "--emulate-gbps", "0.025"]
ARGS += ["--iters", "2", "--warmup", "1", "--iters-bytes", "0", "--warmup-bytes", "0", "--no-progress"]


@pytest.mark.soak
@pytest.mark.netns
@pytest.mark.timeout(2700)
@pytest.mark.skipif(_REASON is not None, reason=str(_REASON))
def test_w32_r32_rounds_finish_exactly(request, tmp_path):
    if "soak" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("opt-in (64 emulated hosts, minutes): pytest -m soak tests/bench/test_w32.py")
    prefix = "w" + uuid.uuid4().hex[:6]
    out_json = tmp_path / "w32.json"
    cmd = [sys.executable, "-m", "reducer.cli.main", "bench", *ARGS, "--netns-prefix", prefix, "--json", str(out_json)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=2400, cwd=ROOT, env=child_env_in_tree())
    finally:
        emulate.cleanup_stale(prefix)
    out = res.stdout + res.stderr
    tail = out[-6000:]
    assert "made no progress" not in out and "ReductionTimeout" not in out, f"a round stalled:\n{tail}"
    assert res.returncode == 0, f"bench exit status {res.returncode}:\n{tail}"
    rows = json.loads(out_json.read_text())
    assert [(r["algo"], r["size"], r["workers"], r["reducers"]) for r in rows] == [("rs", 16 << 20, 32, 32)], rows
    assert all(r["wrong"] == 0 for r in rows), f"sums not exact: {rows}"
