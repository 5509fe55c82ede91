"""The pipeline parameters the simulator models, read from the code's own rules in one place.

rs: how a round is cut (csrc/protocol/plan.h: ``reducers_for``, even shards, ``chunk_for``), the
window of chunks in flight per link (csrc/client/schedule.cc ``Schedule::fill``: RS_WINDOW, halved
while R < W) and the reducer's group slots (csrc/server/server.h ``group_slots``). The ring:
csrc/ring (segments of S/n, streamed in chunks of RS_CHUNK_BYTES). On a long path the client
widens a link's window to what the path needs (protocol/plan.h ``path_window``, from TCP_INFO:
``Schedule::window_of``): ``with_path_window`` applies the same bound rule. The defaults are the settings
table's (reducer/config.py, csrc/common/settings.h) and the bound C++ functions, so a change of the
pipeline's chunking or windows reaches the simulator through ``rs_pipeline`` / ``ring_pipeline``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import _core, config

ELEM = 4  # float32: the bench's all-reduce (plan_round splits elements, not bytes)
GROUP_SLOTS = 4  # csrc/server/server.h ServerOptions::group_slots (RS_GROUP_SLOTS unset)


@dataclass(frozen=True)
class Settings:
    """The knobs of one simulated job (None: the code's default)."""

    chunk_bytes: int | None = None  # RS_CHUNK_BYTES: the largest chunk
    window: int | None = None  # RS_WINDOW: chunks in flight per link
    group_slots: int | None = None  # RS_GROUP_SLOTS: chunk slots per group stream on a reducer
    socket_buffer: int | None = None  # RS_SOCKET_BUFFER: bounds a connection's TCP window
    path_window: bool = True  # False: the window above alone (the client before issue 31 point 2)


DEFAULTS = Settings()


@dataclass(frozen=True)
class RsPipeline:
    shards: list[tuple[int, int]]  # per reducer: (shard bytes, chunk bytes); (0, 0) = unused
    window: int
    slots: int
    socket_buffer: int


@dataclass(frozen=True)
class RingPipeline:
    segment: int  # bytes per step
    steps: int  # 2(n - 1)
    chunk: int
    socket_buffer: int


def _even(units: int, parts: int) -> list[int]:
    base, rem = divmod(units, parts)
    return [base + (1 if j < rem else 0) for j in range(parts)]


def _setting(name: str, value: int | None) -> int:
    """An explicit value, else the code's default (the shell's RS_* variables are not read)."""
    return int(config.get(name, value, env={}))


def rs_pipeline(nbytes: int, workers: int, reducers: int, s: Settings = DEFAULTS) -> RsPipeline:
    """Shards, chunks, window and slots of one rs round of `nbytes` (round 0)."""
    max_chunk = _setting("chunk_bytes", s.chunk_bytes)
    window_setting = _setting("window", s.window)
    used = int(_core.reducers_for(nbytes, reducers, workers))
    counts = _even(nbytes // ELEM, used) + [0] * (reducers - used)
    shards = []
    window = max(window_setting, 1)
    for n in counts:
        b = n * ELEM
        if not b:
            shards.append((0, 0))
            continue
        # The client's own rule (protocol/plan.h pipeline_for): the chunk from the shard and the
        # number of workers, the window halved while there are fewer reducers than workers.
        chunk, window = _core.pipeline_for(b, max_chunk, workers, reducers, window_setting)
        shards.append((b, int(chunk)))
    slots = s.group_slots or GROUP_SLOTS
    return RsPipeline(shards, window, slots, _setting("socket_buffer", s.socket_buffer))


def with_path_window(pipe: RsPipeline, rtt: float, rate_Bps: float, s: Settings = DEFAULTS) -> RsPipeline:
    """`pipe` with the window a link grows to on a path of round trip `rtt` seconds (tcpi_min_rtt)
    delivering `rate_Bps` (its share of the links): the client's rule, ``_core.path_window``
    (protocol/plan.h), from the largest shard's chunk. The client reaches it after its first
    measurements; the model applies it from the first chunk."""
    chunk = max((c for b, c in pipe.shards if b), default=0)
    if not s.path_window or not chunk:
        return pipe
    window = int(_core.path_window(pipe.window, chunk, round(rtt * 1e6), int(rate_Bps)))
    return replace(pipe, window=window)


def ring_pipeline(nbytes: int, ranks: int, s: Settings = DEFAULTS) -> RingPipeline:
    """Segment, steps and chunk of one ring all-reduce of `nbytes` over `ranks` ranks."""
    segment = (nbytes // ELEM + ranks - 1) // ranks * ELEM  # the largest segment
    chunk = _setting("chunk_bytes", s.chunk_bytes)
    return RingPipeline(segment, 2 * (ranks - 1), chunk, _setting("socket_buffer", s.socket_buffer))
