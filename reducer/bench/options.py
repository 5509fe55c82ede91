"""What a benchmark run is asked to do (BenchConfig) and the checks and facts it is built from:
the sizes, the algorithms available here, the wire dtype of each, the machine's description."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import platform
from dataclasses import dataclass, field

from .. import config as rs_config
from ..errors import ConfigError
from ..wording import install_hint
from . import control_ab
from .poller import DEFAULT_INTERVAL_S

ALL_ALGOS = ("rs", "ring", "gloo")
# Also available: gloo all-reducing a bfloat16 copy (as torch's bf16 hook); run by default with --compression.
EXTRA_ALGOS = ("gloo-bf16",)


# ------------------------------------------------------------------------ configuration
# Start-up allowance per emulated host (BenchConfig.start_timeout): W = R = 32 on a busy 2-core
# machine took more than the flat 120 s (ranks not ready); 64 hosts now get 120 + 192 s.
START_SECONDS_PER_HOST = 3.0


@dataclass
class BenchConfig:
    workers: int = 4
    reducers: int = 4
    sizes: list[int] = field(default_factory=lambda: parse_sizes("4K:256M"))
    dtype: str = "float32"
    op: str = "sum"
    iters: int = 10
    iters_bytes: int = 4 << 20  # and at least this many bytes of timed rounds per size
    warmup: int = 3
    warmup_bytes: int = 32 << 20  # and at least this many bytes of untimed rounds per size
    algos: list[str] | None = None  # None: every available one
    emulate_gbps: float | None = None
    # A long path (issue 31 point 2; needs emulate_gbps): each direction of every path delay_ms +-
    # jitter_ms later (uniform), loss of its packets dropped (reducer.bench.emulate's delay relay),
    # and one bulk TCP stream's rate on it measured first (reducer.bench.bulk).
    emulate_delay_ms: float = 0.0
    emulate_jitter_ms: float = 0.0
    emulate_loss: float = 0.0
    json_path: str | None = None
    plot_path: str | None = None
    timeout: float = 60.0  # per all-reduce, seconds without progress
    connect_timeout: float = 120.0
    chunk_bytes: int | None = None  # ring pipeline chunk (default: RS_CHUNK_BYTES, rs's largest chunk)
    compression: str | None = None  # rs only: 'bf16' / 'fp16' sends the float32 buffer as 16-bit
    netns_prefix: str = "rsb"
    # TCP congestion control(s) to run under, each a full pass over the algorithms: an algorithm name
    # ('cubic', 'bbr', ...) or 'default' (the kernel's). Emulated hosts: every connection of every
    # host (the namespaces' routes); always: rs's and the ring's sockets (RS_TCP_CONGESTION).
    congestion: list[str] | None = None
    progress: bool = True
    cpu_warn_percent: float = 70.0
    # training steps (reducer.bench.steps): set `model` to measure steps instead of sizes
    model: str | None = None
    bucket_cap_mb: list[float] = field(default_factory=lambda: [25.0])
    first_bucket_mb: float = 1.0  # DDP's first_bucket_bytes_cap (torch's default: 1 MiB)
    compute_ms: str = "0"  # backward time(s), ms, comma list; 'gloo' = gloo's comm time
    scale: float = 1.0  # shrink every tensor and bucket limit (tests)
    # the reducers' control plane (reducer.bench.control_ab): off, on (polled), or ab (rs both ways)
    control_plane: str = "off"
    poll_interval: float = DEFAULT_INTERVAL_S  # seconds between the poller's GetStats + /metrics rounds
    ab_passes: int = 2  # with ab: passes of each variant (A B B A for 2)

    def start_timeout(self) -> float:
        """Seconds the ranks of a pass get to start, connect and say 'ready' (the runner's wait and
        the ranks' connect_timeout): connect_timeout plus START_SECONDS_PER_HOST for every host. The
        start-up grows with the host count: every rank is a Python process that imports numpy and
        the core, and every worker connects to every reducer (W x R handshakes, each a few round
        trips, through links that drop packets while 64 processes start on 2 cores)."""
        return self.connect_timeout + START_SECONDS_PER_HOST * (self.workers + self.reducers)


def parse_sizes(text: str) -> list[int]:
    """'4K:256M' (doubling from 4 KiB to 256 MiB), '4K:1M:4' (x4 steps), or a list '4K,64K,1M'."""
    text = text.strip()
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ConfigError(f"bad size range {text!r}: expected MIN:MAX or MIN:MAX:FACTOR")
        lo, hi = rs_config.parse_size(parts[0]), rs_config.parse_size(parts[1])
        factor = int(parts[2]) if len(parts) == 3 else 2
        if lo < 1 or hi < lo or factor < 2:
            raise ConfigError(f"bad size range {text!r}: need 1 <= MIN <= MAX and FACTOR >= 2")
        sizes, s = [], lo
        while s <= hi:
            sizes.append(s)
            s *= factor
        return sizes
    sizes = [rs_config.parse_size(p) for p in text.split(",") if p.strip()]
    if not sizes:
        raise ConfigError("no sizes given")
    return sizes


def available_algos(steps: bool = False) -> dict[str, str | None]:
    """algo -> None if it can run here, else the reason it cannot. steps: the training-step
    algorithms, whose rs variants go through reducer.torch's DDP hooks."""
    out: dict[str, str | None] = {"rs": None, "ring": None, "gloo": None, "gloo-bf16": None}
    if steps:
        out = {"rs": None, "rs+bf16": None, "ring": None, "gloo": None}
    if importlib.util.find_spec("torch") is None:
        missing = f"torch is not installed ({install_hint('torch', 'torch')})"
        for a in out:
            if a != "ring" and (a.startswith("gloo") or steps):
                out[a] = missing
    return out


def wire_dtype(algo: str, cfg: BenchConfig) -> str | None:
    """The 16-bit type `algo` puts the float32 buffer on the wire as (None: the buffer's own)."""
    if algo == "gloo-bf16":
        return "bfloat16"
    if control_ab.base_algo(algo) == "rs" and cfg.compression:
        return rs_config.compression_wire(cfg.compression)
    return None


def _check_compression(cfg: BenchConfig) -> BenchConfig:
    """cfg with compression normalised to None, 'bf16' or 'fp16'; ConfigError if it cannot apply."""
    comp = rs_config.compression_name(cfg.compression)
    if comp and cfg.dtype != "float32":
        raise ConfigError(f"--compression {comp} compresses float32 buffers: use --dtype float32 (not {cfg.dtype})")
    if cfg.dtype != "float32" and cfg.algos and "gloo-bf16" in cfg.algos:
        raise ConfigError("gloo-bf16 all-reduces a bfloat16 copy of a float32 buffer: use --dtype float32")
    return dataclasses.replace(cfg, compression=comp)


def machine_description() -> str:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({model}), Linux {platform.release()}, Python {platform.python_version()}"
