"""TCP congestion control for the benchmark's passes (--congestion): the names it takes, whether
this kernel has them, setting them for a pass, and how rows and the report name them."""

from __future__ import annotations

from typing import Any

from .. import config as rs_config
from ..errors import ConfigError
from .emulate import available_congestion

DEFAULT_CONGESTION = "default"


def parse_congestion(text: str) -> list[str]:
    """'cubic,bbr' -> ['cubic', 'bbr'] (in order, without repeats); 'default' = the kernel's."""
    names = list(dict.fromkeys(p.strip().lower() for p in text.split(",") if p.strip()))
    if not names:
        raise ConfigError("--congestion: no algorithm given")
    return names


def kernel_congestion() -> str:
    """The machine's default TCP congestion control (what new namespaces inherit), or '?'."""
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"


def check_congestion(names: list[str] | None) -> None:
    """ConfigError if this kernel lacks one of `names` ('default' always works)."""
    if not names:
        return

    avail = available_congestion()
    bad = [n for n in names if n != DEFAULT_CONGESTION and avail and n not in avail]
    if bad:
        raise ConfigError(
            f"--congestion {','.join(bad)}: not available in this kernel (available: {' '.join(avail)}; "
            f"a module may need loading, e.g. `modprobe tcp_{bad[0]}`)"
        )


def congestion_label(cc: str | None) -> str:
    """The congestion control a pass ran under, as rows record it."""
    if cc is None or cc == DEFAULT_CONGESTION:
        return kernel_congestion()
    return cc


def describe_congestion(ccs: list[str | None], emulated: bool) -> str:
    """The header line's account of the congestion control(s) the passes run under."""
    if ccs == [None]:
        from .._native import core  # noqa: PLC0415 (the C++ core: this module is loaded with the CLI, which must start without it)

        rs_cc = core.tcp_congestion()  # RS_TCP_CONGESTION as this process resolved it ('' = the kernel's)
        return (
            f"the kernel's default ({kernel_congestion()})"
            + (f"; rs and ring sockets: {rs_cc} (RS_TCP_CONGESTION={rs_config.get('tcp_congestion')})" if rs_cc else "")
            + " (--congestion NAME[,NAME] to choose; one pass per name)"
        )
    names = ", ".join(f"{congestion_label(c)}{' (kernel default)' if c == DEFAULT_CONGESTION else ''}" for c in ccs)
    how = (
        "every connection of every emulated host (route congctl in each namespace) and rs/ring sockets "
        "(RS_TCP_CONGESTION)"
        if emulated
        else "rs and ring sockets only (RS_TCP_CONGESTION); gloo keeps the kernel's default on loopback"
    )
    return f"one pass each: {names}; applied to {how}"


def use_congestion(hosts: Any, cc: str | None) -> dict[str, str]:
    """Set the hosts' congestion control for the passes of `cc`; returns the environment that sets
    rs's and the ring's sockets the same."""
    extra_env: dict[str, str] = {}
    if cc is not None:
        # rs's and the ring's sockets get this pass's setting ('default': the kernel's),
        # whatever the caller's environment says
        extra_env[rs_config.SETTINGS["tcp_congestion"].env] = cc
        hosts.set_congestion(None if cc == DEFAULT_CONGESTION else cc)
    return extra_env
