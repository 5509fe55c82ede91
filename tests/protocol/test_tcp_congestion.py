"""RS_TCP_CONGESTION / reducer.set_tcp_congestion: the TCP congestion control of the data connections.

The setting is process-wide (csrc/net/socket.cc applies it in tune_socket to every data connection:
client, reducer, ring); every test restores the process's setting when it ends.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading

import numpy as np
import pytest

import reducer
from reducer.bench.emulate import available_congestion, parse_ss_congestion
from reducer.errors import ConfigError

KERNEL_DEFAULT = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
# reno is always built in and always allowed; pick the other side of the A/B so the check can fail
OTHER = "reno" if KERNEL_DEFAULT != "reno" else next((a for a in available_congestion() if a != "reno"), None)


@pytest.fixture
def core():
    from reducer._native import core

    before = core.tcp_congestion()
    yield core
    core.set_tcp_congestion(before)


def _cc(s: socket.socket) -> str:
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0")[0].decode()


@pytest.mark.skipif(OTHER is None, reason="only one congestion control in this kernel")
def test_tuned_sockets_get_the_setting(core):
    assert reducer.set_tcp_congestion(OTHER) == OTHER
    assert core.tcp_congestion() == OTHER
    with socket.socket() as s:
        assert _cc(s) == KERNEL_DEFAULT  # an untuned socket: the kernel's default
        core.tune_socket(s.fileno())
        assert _cc(s) == OTHER == core.socket_congestion(s.fileno())
    assert reducer.set_tcp_congestion("") == ""  # back to the kernel's default: tune_socket leaves it alone
    with socket.socket() as s:
        core.tune_socket(s.fileno())
        assert _cc(s) == KERNEL_DEFAULT


def test_refused_names_are_config_errors(core, monkeypatch):
    with pytest.raises(ConfigError, match="'nosuchcc' is not available in this kernel"):
        reducer.set_tcp_congestion("nosuchcc")
    with pytest.raises(ConfigError, match="not an algorithm name"):
        reducer.set_tcp_congestion("cubic; rm")
    before = core.tcp_congestion()
    with pytest.raises(ConfigError, match="'nosuchcc' is not available in this kernel"):
        reducer.set_tcp_congestion("nosuchcc")
    assert core.tcp_congestion() == before  # a refused name changes nothing
    monkeypatch.setenv("RS_TCP_CONGESTION", "nosuchcc")
    with pytest.raises(ConfigError, match="RS_TCP_CONGESTION='nosuchcc'"):
        reducer.set_tcp_congestion()


def _may_use(name: str) -> bool:
    with socket.socket() as s:
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
            return True
        except OSError:
            return False


def test_default_is_auto_cubic_where_allowed_else_the_kernels(core, monkeypatch):
    """The measured default (docs/performance.md): cubic if this process may use it, else the
    kernel's default, quietly; 'default' and '' keep the kernel's."""
    auto = "cubic" if _may_use("cubic") else ""
    monkeypatch.delenv("RS_TCP_CONGESTION", raising=False)
    assert reducer.set_tcp_congestion() == auto == core.tcp_congestion()
    monkeypatch.setenv("RS_TCP_CONGESTION", "  ")  # blank = unset: the default
    assert reducer.set_tcp_congestion() == auto
    assert reducer.set_tcp_congestion("auto") == auto
    assert reducer.set_tcp_congestion("default") == "" == core.tcp_congestion()
    assert reducer.set_tcp_congestion("auto") == auto
    assert reducer.set_tcp_congestion("") == ""
    if auto:
        with socket.socket() as s:
            reducer.set_tcp_congestion("auto")
            core.tune_socket(s.fileno())
            assert _cc(s) == "cubic"


@pytest.mark.skipif(OTHER is None, reason="only one congestion control in this kernel")
@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
@pytest.mark.timeout(60)
def test_ring_connections_use_it_on_both_ends(core):
    """Both the connecting and the accepting end of the ring's data connections, as `ss` sees them,
    and the all-reduce over them is still right."""
    reducer.set_tcp_congestion(OTHER)
    rings = [core.Ring(r, 2, "127.0.0.1", 0, 20.0) for r in range(2)]
    addrs = [f"127.0.0.1:{r.port}" for r in rings]
    errors = []

    def connect(r):
        try:
            r.connect(addrs, 20.0)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=connect, args=(r,)) for r in rings]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert not errors and not any(t.is_alive() for t in threads), errors
        ports = " or ".join(f"sport = :{r.port} or dport = :{r.port}" for r in rings)
        out = subprocess.run(["ss", "-tin", f"( {ports} )"], capture_output=True, text=True, timeout=10).stdout
        flows = parse_ss_congestion(out)
        # each rank connects to its right neighbour: 2 connections, seen from both ends = 4 sockets
        assert flows == {OTHER: 4}, out
        xs = [np.arange(1000, dtype=np.float32) * (r + 1) for r in range(2)]
        threads = [threading.Thread(target=rg.allreduce, args=(x, "float32", "sum")) for rg, x in zip(rings, xs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for x in xs:
            np.testing.assert_array_equal(x, np.arange(1000, dtype=np.float64) * 3)
    finally:
        for r in rings:
            r.close()


@pytest.mark.skipif(OTHER is None, reason="only one congestion control in this kernel")
@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
@pytest.mark.timeout(60)
def test_listeners_have_it_before_any_connection(core):
    """Connections must run under the setting from their first packet: a connection accepted under
    the kernel's default and switched afterwards keeps state of the old algorithm (BBR's pacing
    stays on after a switch to cubic: 64 KiB rounds 2-3x slower, docs/performance.md). Accepted
    sockets inherit their listener's algorithm, so the reducer's and the ring's listening sockets
    must carry the setting already (as `ss` shows them, before anything connects)."""
    reducer.set_tcp_congestion(OTHER)
    srv = reducer.ReducerServer(host="127.0.0.1", port=0).start()
    ring = core.Ring(0, 2, "127.0.0.1", 0, 20.0)
    try:
        for port in (srv.port, ring.port):
            out = subprocess.run(["ss", "-tlni", f"sport = :{port}"], capture_output=True, text=True, timeout=10).stdout
            info = [ln.split() for ln in out.splitlines() if ln[:1].isspace()]  # the TCP_INFO line
            assert len(info) == 1 and [w for w in info[0] if ":" not in w][-1:] == [OTHER], out
    finally:
        ring.close()
        srv.stop()
