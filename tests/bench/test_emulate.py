"""Tests of reducer/bench/emulate.py (network namespaces + tbf) and reducer/bench/cpu_monitor.py.

The netns tests need root and iproute2; they are skipped otherwise.  Every run
uses its own random prefix, so parallel runs never clash.  Traffic only goes
between the test's own namespaces (10.77.0.0/24 inside them) or loopback.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from paths import ROOT

from reducer.bench import emulate, tcp_counters
from reducer.bench.cpu_monitor import CpuMonitor
from reducer.bench.emulate import EmulatedHosts, EmulationError, cleanup_stale

_REASON = emulate.unavailable_reason()
needs_netns = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))


@pytest.fixture
def prefix():
    p = "t" + uuid.uuid4().hex[:6]
    yield p
    cleanup_stale(p)  # whatever a failing test left behind


def _alive(pid):
    return emulate._pid_alive(pid)


PY_SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 7000)); s.listen(8); print("ready", flush=True)
    for _ in range(int(sys.argv[2])):
        c, _ = s.accept(); c.sendall(c.recv(100).upper()); c.close()
""")
PY_CLIENT = textwrap.dedent("""
    import socket, sys
    for ip in sys.argv[1:]:
        c = socket.create_connection((ip, 7000), timeout=5); c.sendall(b"hi " + ip.encode())
        print(c.recv(100).decode(), flush=True); c.close()
""")


@pytest.mark.netns
@pytest.mark.timeout(20)
@needs_netns
def test_hosts_connect_and_are_isolated(prefix):
    with EmulatedHosts(3, gbps=1.0, prefix=prefix) as hosts:
        assert [h.ip for h in hosts] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
        assert hosts[1].netns == f"{prefix}-h1" and hosts[1].ifname == "eth0"
        assert hosts.env_for(2)["GLOO_SOCKET_IFNAME"] == "eth0"
        # host 1 serves its eth0 address (2 clients), host 2 serves loopback (1 client)
        s1 = hosts.popen(1, [sys.executable, "-c", PY_SERVER, hosts[1].ip, "2"], stdout=subprocess.PIPE, text=True)
        s2 = hosts.popen(2, [sys.executable, "-c", PY_SERVER, "127.0.0.1", "1"], stdout=subprocess.PIPE, text=True)
        assert s1.stdout.readline().strip() == "ready" and s2.stdout.readline().strip() == "ready"
        out = hosts.run(0, [sys.executable, "-c", PY_CLIENT, hosts[1].ip], timeout=10)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"HI {hosts[1].ip}"
        out = hosts.run(2, [sys.executable, "-c", PY_CLIENT, "127.0.0.1", hosts[1].ip], timeout=10)
        assert out.stdout.split("\n")[:2] == ["HI 127.0.0.1", f"HI {hosts[1].ip}"], out.stderr
        assert s1.wait(5) == 0 and s2.wait(5) == 0
        # tbf on both ends of every link
        q = hosts.run(0, ["tc", "qdisc", "show", "dev", "eth0"]).stdout
        assert "tbf" in q and "rate 1Gbit" in q, q
        q = subprocess.run(
            ["ip", "netns", "exec", f"{prefix}-sw", "tc", "qdisc", "show", "dev", f"{prefix}-v0"],
            capture_output=True,
            text=True,
        ).stdout
        assert "tbf" in q, q
        # isolated: only the emulated subnet is routed, no default route
        routes = hosts.run(0, ["ip", "-4", "route", "show"]).stdout
        assert "default" not in routes and "10.77.0.0/24" in routes, routes
        r = hosts.run(0, ["ip", "route", "get", "192.0.2.1"])
        assert r.returncode != 0 and "unreachable" in r.stderr.lower(), r
        # every other host's ARP entry is permanent: the kernel's neighbour table, one for all
        # namespaces, overflowed with 64 hosts' learned entries and ARP went unanswered
        neigh = hosts.run(0, ["ip", "neigh", "show", "dev", "eth0"]).stdout
        for h in hosts[1], hosts[2]:
            assert f"{h.ip} lladdr {emulate._mac(h.ip)} PERMANENT" in neigh, neigh
        # nothing of the emulation in the root namespace
        assert not [n for n in emulate._list_links() if n.startswith(prefix + "-")]
    assert emulate.leftovers(prefix) == []


@pytest.mark.netns
@pytest.mark.timeout(20)
@needs_netns
def test_throughput_is_shaped(prefix):
    gbps = 0.2
    with EmulatedHosts(2, gbps=gbps, prefix=prefix) as hosts:
        (rate,) = emulate.measure_tcp(hosts, [(0, 1)], seconds=1.5)
    # functional check of the shaping (expected ~95.6% of the rate), not a perf assertion
    assert 0.6 * gbps * 1e9 < rate < 1.10 * gbps * 1e9, f"{rate / 1e6:.1f} Mbit/s at {gbps} Gbit/s"


@pytest.mark.netns
@pytest.mark.timeout(20)
@needs_netns
def test_tcp_counters_count_the_hosts_own_segments(prefix):
    """EmulatedHosts.tcp_counters sums the namespaces' own counters: a TCP stream between the two
    hosts shows up in them (at least its bytes' worth of segments)."""
    with EmulatedHosts(2, gbps=0.2, prefix=prefix) as hosts:
        before = hosts.tcp_counters()
        assert before is not None
        assert set(before) == {"sent", "retransmitted", "timeouts", "loss_probes", "host_drops", "switch_drops"}
        (rate,) = emulate.measure_tcp(hosts, [(0, 1)], seconds=0.5)
        after = hosts.tcp_counters()
    assert after is not None
    assert after["sent"] - before["sent"] >= rate * 0.5 / 8 / 65536  # GSO segments count once each
    assert hosts.tcp_counters() is None  # the namespaces are gone


_BLAST = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)  # more than the queue: it overflows
t = time.monotonic()
while time.monotonic() - t < 0.3:
    try:
        s.sendto(b"x" * 1400, (sys.argv[1], 9))
    except OSError:  # ENOBUFS: the host's own queue is full
        pass
"""


@pytest.mark.netns
@pytest.mark.timeout(20)
@needs_netns
def test_tcp_counters_say_where_packets_were_dropped(prefix):
    """A host that sends faster than its link drops in its own queue (host_drops), not at the
    switch: what found the path-window defect of 2026-11-28 (docs/performance.md)."""
    with EmulatedHosts(2, gbps=0.01, prefix=prefix, burst_bytes=16384, latency_ms=2) as hosts:
        before = hosts.tcp_counters()
        hosts.run(0, [sys.executable, "-c", _BLAST, hosts[1].ip], timeout=15)
        after = hosts.tcp_counters()
    d = tcp_counters.delta(before, after)
    assert d is not None and d["host_drops"] > 0 and d["switch_drops"] == 0, d
    line = tcp_counters.describe("rs", {**d, "sent": 1})
    assert (
        line is not None
        and f"packets dropped by the hosts' own queues {d['host_drops']}, by the switch's ports 0" in line
    )


def test_parse_drops_sums_every_qdisc():
    text = (
        "qdisc tbf 8001: root refcnt 2 rate 50Mbit burst 256Kb lat 20ms\n"
        " Sent 44627054 bytes 30000 pkt (dropped 13, overlimits 173 requeues 0)\n"
        "qdisc noqueue 0: dev lo root refcnt 2\n"
        " Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0)\n"
        "qdisc tbf 8002: dev rsb-v1 root\n"
        " Sent 1 bytes 1 pkt (dropped 29, overlimits 0 requeues 0)\n"
    )
    assert tcp_counters.parse_drops(text) == 42


@pytest.mark.netns
@pytest.mark.timeout(20)
@needs_netns
@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_cleanup_on_exception_with_running_children(prefix, exc):
    with pytest.raises(exc):
        with EmulatedHosts(2, gbps=1.0, prefix=prefix) as hosts:
            running = hosts.popen(0, ["sleep", "60"])
            killed = hosts.popen(1, ["sleep", "60"])
            killed.kill()
            killed.wait(5)
            # started behind the object's back: found through `ip netns pids`
            stray = subprocess.Popen(["ip", "netns", "exec", hosts[1].netns, "sleep", "60"])
            time.sleep(0.2)
            assert emulate.leftovers(prefix)
            raise exc("boom")
    assert running.poll() is not None
    stray.wait(5)
    assert emulate.leftovers(prefix) == []


@pytest.mark.netns
@pytest.mark.timeout(20)
@needs_netns
def test_stale_objects_of_killed_run_are_removed(prefix):
    ip = emulate._tool("ip")
    subprocess.run([ip, "netns", "add", f"{prefix}-h0"], check=True)
    subprocess.run([ip, "netns", "add", f"{prefix}-h7"], check=True)
    subprocess.run([ip, "link", "add", f"{prefix}-br", "type", "bridge"], check=True)
    subprocess.run([ip, "link", "add", f"{prefix}-v5", "type", "veth", "peer", "name", f"{prefix}-p5"], check=True)
    stale_proc = subprocess.Popen([ip, "netns", "exec", f"{prefix}-h7", "sleep", "60"])
    time.sleep(0.2)
    with EmulatedHosts(2, gbps=1.0, prefix=prefix) as hosts:
        names = emulate._list_netns()
        assert f"{prefix}-h7" not in names and f"{prefix}-h0" in names
        assert stale_proc.wait(5) is not None
        root_links = emulate._list_links()
        assert not {f"{prefix}-br", f"{prefix}-v5", f"{prefix}-p5"} & set(root_links)
        assert hosts.run(0, ["ip", "-4", "addr", "show", "eth0"]).stdout.count("10.77.0.1/24") == 1
    assert emulate.leftovers(prefix) == []


@pytest.mark.netns
@pytest.mark.timeout(20)
@needs_netns
def test_sigterm_cleans_up(prefix):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from reducer.bench.emulate import EmulatedHosts
        with EmulatedHosts(2, 1.0, prefix={prefix!r}) as h:
            h.popen(0, ["sleep", "60"])
            print("ready", flush=True)
            time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 128 + signal.SIGTERM
    assert emulate.leftovers(prefix) == []


@pytest.mark.netns
@pytest.mark.timeout(10)
def test_not_root_error_message(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(EmulationError) as ei:
        with EmulatedHosts(2, gbps=1.0, prefix="tnoroot"):
            pass
    msg = str(ei.value)
    assert "emulated hosts need root and iproute2 (ip, tc)" in msg and "not running as root" in msg


@pytest.mark.timeout(10)
def test_missing_tools_error_message(monkeypatch):
    monkeypatch.setattr(emulate, "_which", lambda tool: None if tool == "tc" else "/usr/sbin/ip")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(EmulationError, match=r"need root and iproute2 \(ip, tc\): 'tc' not found"):
        emulate.check_prerequisites()


def test_bad_arguments():
    with pytest.raises(ValueError):
        EmulatedHosts(2, 1.0, prefix="much-too-long-prefix")
    with pytest.raises(ValueError):
        EmulatedHosts(300, 1.0, prefix="t")
    with pytest.raises(ValueError):
        EmulatedHosts(2, 0.0)


@pytest.mark.timeout(10)
def test_cpu_monitor(caplog):
    with CpuMonitor(interval=0.05) as cpu:
        end = time.perf_counter() + 0.4
        while time.perf_counter() < end:
            pass  # keep one core busy
    assert 0.0 <= cpu.mean_percent <= 100.0 and cpu.max_percent >= cpu.mean_percent - 1e-9
    assert len(cpu.samples) >= 3
    log = logging.getLogger("test_cpu")
    with caplog.at_level(logging.WARNING, logger="test_cpu"):
        assert cpu.warn_if_over(-1.0, log) is True
        assert cpu.warn_if_over(101.0, log) is False
    assert "CPU busy" in caplog.text


# ------------------------------------------------------------------ congestion control per host
SS_SAMPLE = textwrap.dedent("""\
    State  Recv-Q Send-Q  Local Address:Port   Peer Address:Port Process
    ESTAB  0      0           10.77.0.1:40000     10.77.0.5:2222
    \t ts sack cubic wscale:7,7 rto:204 rtt:0.5/0.2 mss:1448 cwnd:10
    ESTAB  0      0           10.77.0.1:40002     10.77.0.6:2222
    \t cubic wscale:7,7 rto:204 rtt:0.5/0.2 mss:1448 cwnd:10
    ESTAB  0      0           10.77.0.1:40004     10.77.0.7:2222
    \t ts sack ecn bbr wscale:7,7 rto:204 mss:1448 cwnd:10 bbr:(bw:1Gbps,mrtt:0.1)
    TIME-WAIT 0   0           10.77.0.1:40006     10.77.0.8:2222
    \t cubic wscale:7,7 rto:204
    LISTEN 0      1024          0.0.0.0:7000        0.0.0.0:*
    \t cubic cwnd:10
""")


def test_parse_ss_congestion():
    assert emulate.parse_ss_congestion(SS_SAMPLE) == {"cubic": 2, "bbr": 1}
    assert emulate.parse_ss_congestion("State Recv-Q Send-Q Local Address:Port Peer Address:Port\n") == {}


def _flows_after_connect(hosts):
    """Connect host 0 -> host 1 and return each end's {algorithm: count} while connected."""
    server = hosts.popen(
        1,
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import socket, sys
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((sys.argv[1], 7001)); s.listen(1); print("ready", flush=True)
        c, _ = s.accept(); c.recv(1)
    """),
            hosts[1].ip,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout.readline().strip() == "ready"
    client = hosts.popen(
        0,
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import socket, sys
        c = socket.create_connection((sys.argv[1], 7001), timeout=5); print("up", flush=True); sys.stdin.read()
        c.sendall(b"x")
    """),
            hosts[1].ip,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout.readline().strip() == "up"
        return hosts.flow_congestion(0), hosts.flow_congestion(1)
    finally:
        client.stdin.close()
        assert client.wait(5) == 0 and server.wait(5) == 0


@pytest.mark.netns
@pytest.mark.timeout(30)
@needs_netns
def test_congestion_control_per_host(prefix):
    avail = emulate.available_congestion()
    assert "reno" in avail  # always built in
    default = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    other = "reno" if default != "reno" else next(a for a in avail if a != "reno")
    with EmulatedHosts(2, gbps=1.0, prefix=prefix, congestion=other) as hosts:
        assert hosts.congestion == other
        # both ends of a connection (the connecting and the accepting side) use it
        assert _flows_after_connect(hosts) == ({other: 1}, {other: 1})
        hosts.set_congestion(None)  # back to the namespace's default, inherited from the machine
        assert hosts.congestion is None
        assert _flows_after_connect(hosts) == ({default: 1}, {default: 1})
        with pytest.raises(EmulationError, match="not available"):
            hosts.set_congestion("nosuchcc")
    assert emulate.leftovers(prefix) == []
