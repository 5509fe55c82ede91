"""The pipeline at scale: every round's chunk and window come from the shard each reducer gets and
the group's size (proto::pipeline_for), so W senders keep a bounded number of bytes in flight
toward one reducer (incast), and many small chunks still sum exactly."""

from __future__ import annotations

import pytest
from exact_rounds import run_exact_rounds

from reducer._native import core
from reducer.bench import emulate

_REASON = emulate.unavailable_reason()
needs_netns = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))

KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize(
    "shard, workers, chunk, window",
    [
        (256 * KiB, 4, 16 * KiB, 2),  # chunk_for: shard/64, at least 16 KiB (fan-in 4 x 2 x 16 KiB = 128 KiB)
        # chunk_for's 128 KiB x 4 would put 2 MiB on a reducer's link at once: 512 KiB / (4 x 4) = 32 KiB
        # x 4 within the budget, the same 128 KiB in flight as 64 KiB x 2 (fewer frames)
        (16 * MiB, 4, 64 * KiB, 2),
        (4 * MiB, 8, 32 * KiB, 2),  # 16 KiB x 4 -> 32 KiB x 2
        (256 * KiB, 16, 8 * KiB, 2),  # W = 16, 4 MiB rounds: 32 chunks per shard, window 2: 256 KiB of fan-in
        (1 * MiB, 16, 16 * KiB, 2),  # W = 16, 16 MiB rounds: 8 KiB x 4 -> 16 KiB x 2
        (512 * KiB, 32, 8 * KiB, 2),  # W = 32, 16 MiB rounds: 8 KiB x a window of 2
        (512 * KiB, 1024, 8 * KiB, 2),  # the floor
        (64 * KiB, 32, 64 * KiB, 4),  # small shards keep chunk_for's (one chunk, latency-bound) and RS_WINDOW
    ],
)
def test_pipeline_chunk_follows_the_shard_and_the_group(shard, workers, chunk, window):
    assert core.pipeline_for(shard, 1 * MiB, workers, workers, 4) == (chunk, window)


def _fan_in_chunk(workers: int) -> int:
    """The chunk the fan-in budget alone gives (protocol/plan.h): 512 KiB / (W x 4), whole 4 KiB, at least 8 KiB."""
    return max(8 * KiB, 512 * KiB // (4 * workers) // (4 * KiB) * (4 * KiB))


def test_pipeline_bounds_the_fan_in_and_keeps_the_pipeline_deep():
    """W senders' windows stay within 512 KiB unless the window is at its floor of 2, a shard of
    128 KiB and more has at least 8 chunks to overlap upload, reduction and download, every size
    is a multiple of 4 KiB within max_chunk and at least 8 KiB, a window's bytes stay within
    shard / 32 (the fill and drain of a round) or 2 fan-in chunks, those bytes go in as few
    chunks as chunk_for's size allows (never fewer than 2), and the window halves only with fewer
    reducers than workers."""
    for workers in (1, 2, 3, 4, 8, 16, 32, 64, 128, 1024):
        for shard in [k * 64 * KiB for k in range(2, 40)] + [16 * MiB, 64 * MiB, 256 * MiB]:
            for max_chunk in (8 * KiB, 64 * KiB, 1 * MiB):
                chunk, window = core.pipeline_for(shard, max_chunk, workers, workers, 4)
                most = min(core.chunk_for(shard, max_chunk), max_chunk)
                assert chunk <= max_chunk and chunk % (4 * KiB) == 0
                assert chunk <= most
                assert chunk >= min(8 * KiB, max_chunk)
                if window > 2:
                    assert workers * window * chunk <= 512 * KiB
                assert shard // chunk >= 8 or chunk == max_chunk
                assert 2 <= window <= 4
                assert window * chunk <= max(shard // 32, 2 * min(_fan_in_chunk(workers), most))
                assert window < 4 or 2 * chunk > most  # fewest frames for the bytes
            assert core.pipeline_for(64 * KiB, 1 * MiB, workers, workers, 4)[1] == 4  # small shards: RS_WINDOW
            chunk, window = core.pipeline_for(256 * MiB, 1 * MiB, workers, workers, 64)  # large ones: up to it
            base = min(_fan_in_chunk(workers), 1 * MiB)
            bytes_ = base * max(2, min(256 * MiB // (32 * base), 512 * KiB // (workers * base), 64))
            assert chunk * window == bytes_ and (window < 4 or window % 2 or 2 * chunk > 1 * MiB)
    assert core.pipeline_for(4 * MiB, 1 * MiB, 8, 4, 4) == (16 * KiB, 2)  # 4, halved for R < W: no fewer
    assert core.pipeline_for(256 * KiB, 1 * MiB, 16, 15, 4)[1] == 2  # 2: large shards not below 2
    assert core.pipeline_for(64 * KiB, 1 * MiB, 8, 4, 4)[1] == 2  # small shards: RS_WINDOW halved
    assert core.pipeline_for(1 * MiB, 1 * MiB, 8, 4, 1)[1] == 1
    assert core.pipeline_for(256 * KiB, 1 * MiB, 16, 16, 1)[1] == 1  # RS_WINDOW=1 stays 1
    assert core.pipeline_for(768 * KiB, 1 * MiB, 16, 16, 4) == (8 * KiB, 3)  # an odd window cannot halve: it stays
    # RS_WINDOW=8 at W = 4 on a 16 MiB shard: 32 KiB x 4 (512 KiB / (4 x 32 KiB)) -> 64 KiB x 2
    assert core.pipeline_for(16 * MiB, 1 * MiB, 4, 4, 8) == (64 * KiB, 2)
    assert core.pipeline_for(16 * MiB, 32 * KiB, 4, 4, 8) == (32 * KiB, 4)  # RS_CHUNK_BYTES caps the doubling


@pytest.mark.timeout(120)
def test_many_workers_small_chunks_sum_exactly(reducers):
    """W = 8 workers (threads) on R = 2 reducers: 4 MiB rounds in 16 KiB chunks (the fan-in rule:
    512 KiB / (8 x 4)), windows halved (R < W), float32 and int64, back to back: exact sums."""

    W = 8
    addrs = [s.address for s in reducers(2)]
    n = (4 * MiB) // 4
    assert core.pipeline_for(2 * MiB, 1 * MiB, W, 2, 4) == (16 * KiB, 2)  # 4 (2 MiB / 32 = 4 chunks), halved for R < W
    errors = run_exact_rounds(addrs, W, n, 110, group="many", timeout=60, connect_timeout=60)
    assert not errors, errors
