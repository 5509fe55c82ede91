r"""Emulated hosts: one network namespace per worker/reducer, joined by a
software switch, each with a rate-limited full-duplex "NIC".

Layout for ``EmulatedHosts(n, gbps, prefix="rsb")``::

    netns rsb-h0: eth0 10.77.0.1/24 --veth-- rsb-v0 \
    netns rsb-h1: eth0 10.77.0.2/24 --veth-- rsb-v1  +-- bridge rsb-br (netns rsb-sw)
    ...                                              /

* Each link is shaped by a ``tbf`` qdisc of ``gbps`` Gbit/s on BOTH ends:
  egress of the host's ``eth0`` (what the host sends) and egress of the
  switch-side ``rsb-v{i}`` (what the host receives), so every host has a
  full-duplex NIC of ``gbps`` in each direction, like a real cluster whose
  bottleneck is the NIC.
* The bridge lives in its own namespace (``{prefix}-sw``), not in the root
  namespace: nothing of the emulation is visible from, or routed to, the
  machine's real network; the host namespaces have no default route, there
  is no NAT and no IP outside ``subnet``.  (A bridge in the root namespace
  would also have bridged frames pass the root namespace's iptables through
  ``br_netfilter``, costing CPU and exposed to the machine's firewall rules.)
* tbf counts every byte of the IP packet plus the 14-byte Ethernet header but
  not the preamble/IFG/FCS of a real wire, so TCP payload reaches about
  1448/1514 = 95.6% of the set rate (the 0.956 factor used in the theory).
* Offloads (TSO/GSO/GRO) stay ON: they are not needed off for accuracy (tbf
  accounts a GSO super-packet as the segments it stands for, headers
  included; iperf3 at 1 Gbit/s both ways gives ~95% of the rate each way
  with them on or off), and switching them off doubles the per-byte CPU of the senders
  and receivers on this 2-core machine.
* Congestion control (``congestion=`` / ``set_congestion``): every host's route to the subnet
  carries ``congctl NAME``, so every TCP connection of the host (whatever program opens it:
  rs, the ring, gloo) uses NAME, set per namespace without touching the machine's settings.
  (``sysctl net.ipv4.tcp_congestion_control`` inside a namespace is refused with EPERM for any
  algorithm not in the global ``net.ipv4.tcp_allowed_congestion_control``: the kernel lets only
  the initial namespace set a restricted default. A route's ``congctl`` has no such rule.)
  ``None``: the namespace's default, inherited from the machine's when the namespace is created.
* tbf ``latency`` (queue length) is ``latency_ms`` (default 20 ms, i.e.
  2.5 MB at 1 Gbit/s).  One stream reaches the full rate with any value
  >= 2 ms, but incast (several hosts sending to one, the reducer pattern)
  with 3 senders at 1 Gbit/s had ~9000 TCP retransmits per sender at 2 ms,
  ~250 at 5 ms and none at 10-20 ms; 7 senders still see some drops at
  20 ms (as on a real shallow-buffered switch) but the link stays full.

* ARP: every host has a permanent neighbour entry for every other (``_neighbours``): the kernel's
  neighbour table is shared by all namespaces, and 64 hosts' learned entries overflowed it.

Cleanup: on exit (normal, exception, KeyboardInterrupt), on SIGTERM while
active, and at interpreter exit, every process still running inside the
namespaces is killed and the namespaces (and so their veths and the bridge)
are deleted.  ``cleanup_stale(prefix)`` removes what a killed run left.

Requires root and iproute2 (``ip``, ``tc``); ``unavailable_reason()`` says whether this machine
can run it.  Standard library only (``measure_tcp`` runs this file as a script in the namespaces).

    python -m reducer.bench.emulate selftest [--gbps G] [--seconds S]   # TCP rates through the links
"""

from __future__ import annotations

import argparse
import atexit
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

__all__ = [
    "EmulationError",
    "EmulatedHosts",
    "Host",
    "cleanup_stale",
    "check_prerequisites",
    "unavailable_reason",
    "leftovers",
    "measure_tcp",
    "available_congestion",
    "parse_ss_congestion",
    "main",
]

_IFNAMSIZ = 15  # max length of a Linux interface name
_ETC_NETNS = "/etc/netns"  # `ip netns exec` bind-mounts /etc/netns/NAME/* over /etc/*
_PREFIX_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class EmulationError(RuntimeError):
    """The emulated hosts cannot be set up (not root, iproute2 missing, ...)."""


@dataclass(frozen=True)
class Host:
    index: int
    ip: str
    netns: str
    ifname: str = "eth0"


# --------------------------------------------------------------------------- helpers
def _which(tool: str) -> str | None:
    """Find `tool` on PATH or in the sbin directories (often not on a user's PATH)."""
    path = os.environ.get("PATH", os.defpath) + os.pathsep + "/usr/sbin:/sbin:/usr/local/sbin"
    return shutil.which(tool, path=path)


def _tool(tool: str) -> str:
    return _which(tool) or tool


def _run(argv: Sequence[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    argv = [_tool(argv[0])] + list(argv[1:])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise EmulationError(f"command failed ({p.returncode}): {' '.join(argv)}: {p.stderr.strip()}")
    return p


def _ip_batch(cmds: list[str], netns: str | None = None) -> None:
    """Run several `ip` commands in one process (much faster than one each)."""
    if not cmds:
        return
    argv = [_tool("ip")] + (["-n", netns] if netns else []) + ["-batch", "-"]
    p = subprocess.run(argv, input="\n".join(cmds) + "\n", capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise EmulationError(f"ip -batch failed: {p.stderr.strip()}\ncommands:\n" + "\n".join(cmds))


def _mac(ip: str) -> str:
    """The emulated host's MAC address: locally administered, its IPv4 address in the low bytes."""
    return "02:00:" + ":".join(f"{b:02x}" for b in ipaddress.ip_address(ip).packed)


def _sum_counters(reads: list[tuple[str, list[str], str]]) -> dict[str, int] | None:
    """EmulatedHosts.tcp_counters: each (namespace, command, key) run in its namespace, its output
    parsed as TCP counters (key '') or as qdisc drops counted under key; None if one fails."""
    from . import tcp_counters  # noqa: PLC0415 (this file also runs as a script: measure_tcp's peers)

    total: dict[str, int] = {}
    for netns, argv, drops in reads:
        try:
            p = _run(["ip", "netns", "exec", netns, *argv], check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        if p.returncode != 0:
            return None
        got = {drops: tcp_counters.parse_drops(p.stdout)} if drops else tcp_counters.parse(p.stdout)
        for k, v in got.items():
            total[k] = total.get(k, 0) + v
    return total


def _write_etc_netns(hosts: Sequence[Host]) -> None:
    """Per-host /etc/hosts (names resolve locally: no reverse-DNS stalls or warnings from gloo/c10d)
    and a resolv.conf without name server, so nothing inside a host ever tries to reach a resolver
    outside."""
    hosts_txt = "127.0.0.1 localhost\n" + "".join(f"{h.ip} {h.netns}\n::ffff:{h.ip} {h.netns}\n" for h in hosts)
    for h in hosts:
        d = os.path.join(_ETC_NETNS, h.netns)
        for attempt in range(5):  # a concurrent run may rmdir an empty /etc/netns
            try:
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, "hosts"), "w") as f:
                    f.write(hosts_txt)
                with open(os.path.join(d, "resolv.conf"), "w") as f:
                    f.write("# emulated host: no DNS (isolated network)\n")
                break
            except FileNotFoundError:
                if attempt == 4:
                    raise


def _neighbours(hosts: Sequence[Host], h: Host) -> list[str]:
    """`ip` commands for host h's permanent ARP entries of every other host. The kernel's neighbour
    table is one for all namespaces (gc_thresh3, default 1024 entries, counts every namespace's
    learned entries, not permanent ones): 64 hosts that each learn 32-63 neighbours overflow it, and
    a host whose table is full answers no ARP request, so whole flows lose their packets and back off
    (the W=32 R=32 stalls of issue 31; /proc/net/stat/arp_cache counted the table_fulls). A real
    cluster has a table per host."""
    return [f"neigh replace {o.ip} lladdr {_mac(o.ip)} dev {h.ifname} nud permanent" for o in hosts if o is not h]


def check_path(delay_ms: float, jitter_ms: float, loss: float) -> None:
    """Raise ValueError unless delay, jitter and loss make an emulated path (one line naming the
    bench flag)."""
    if not 0 <= delay_ms <= 10_000:
        raise ValueError(f"--emulate-delay-ms must be in 0..10000, got {delay_ms:g}")
    if not 0 <= jitter_ms <= delay_ms:
        raise ValueError(f"--emulate-jitter-ms must be in 0..--emulate-delay-ms ({delay_ms:g}), got {jitter_ms:g}")
    if not 0 <= loss < 1:
        raise ValueError(f"--emulate-loss must be in [0, 1), got {loss:g}")


def check_prerequisites() -> None:
    """Raise EmulationError unless we are root and `ip` and `tc` exist."""
    missing = []
    if os.geteuid() != 0:
        missing.append(f"not running as root (euid={os.geteuid()})")
    for tool in ("ip", "tc"):
        if _which(tool) is None:
            missing.append(f"'{tool}' not found (install iproute2)")
    if missing:
        raise EmulationError("emulated hosts need root and iproute2 (ip, tc): " + "; ".join(missing))


def unavailable_reason() -> str | None:
    """None if emulated hosts can run here, else why not: root, iproute2, and a network namespace
    that can really be created (containers may forbid it). Creates and deletes one probe namespace."""
    try:
        check_prerequisites()
    except EmulationError as exc:
        return str(exc)
    probe = f"rsprobe{os.getpid()}x{threading.get_ident() % 10000}"
    p = _run(["ip", "netns", "add", probe], check=False)
    if p.returncode != 0:
        return f"cannot create network namespaces here: {p.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


def available_congestion() -> list[str]:
    """The TCP congestion controls the kernel offers now (built in or loaded as modules)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
            return f.read().split()
    except OSError:
        return []


def parse_ss_congestion(text: str) -> dict[str, int]:
    """Count the congestion controls of the established connections in `ss -tin` output: after
    each connection's line, an indented TCP_INFO line lists flags (ts, sack, ecn, ...), then the
    algorithm, then key:value fields."""
    counts: dict[str, int] = {}
    established = False
    for line in text.splitlines():
        if line and not line[0].isspace():
            established = line.startswith("ESTAB")
            continue
        if not established:
            continue
        words = []
        for word in line.split():
            if ":" in word:
                break
            words.append(word)
        if words:
            counts[words[-1]] = counts.get(words[-1], 0) + 1
        established = False
    return counts


def leftovers(prefix: str) -> list[str]:
    """Everything named ``{prefix}-...`` that exists now: network namespaces, links in this
    namespace, /etc/netns entries (after a run with `prefix` has ended, nothing should be)."""
    names = [n for n in _list_netns() + _list_links() if n.startswith(prefix + "-")]
    if os.path.isdir(_ETC_NETNS):
        names += [n for n in os.listdir(_ETC_NETNS) if n.startswith(prefix + "-")]
    return names


def _list_netns() -> list[str]:
    p = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _list_links() -> list[str]:
    p = _run(["ip", "-o", "link", "show"], check=False)
    names = []
    for line in p.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def _netns_pids(netns: str) -> list[int]:
    p = _run(["ip", "netns", "pids", netns], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit() and int(x) != os.getpid()]


def _kill_pids(pids: list[int], grace: float = 1.0) -> None:
    """SIGTERM, wait up to `grace` s, then SIGKILL whatever is left."""
    if not pids:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
            except PermissionError:
                alive.append(pid)
        if not alive or sig == signal.SIGKILL:
            break
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in alive if _pid_alive(pid)]
            if alive:
                time.sleep(0.02)
        pids = alive
        if not pids:
            break


def _pid_alive(pid: int) -> bool:
    try:
        # reap our own children so they do not linger as zombies
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _names(prefix: str):
    host_ns = re.compile(rf"^{re.escape(prefix)}-h\d+$")
    links = re.compile(rf"^{re.escape(prefix)}-(br|[vp]\d+)$")
    return host_ns, links


def cleanup_stale(prefix: str) -> list[str]:
    """Remove everything a previous (possibly killed) run with `prefix` left:
    processes inside and the namespaces ``{prefix}-h{i}`` / ``{prefix}-sw``,
    and any ``{prefix}-br`` / ``{prefix}-v{i}`` / ``{prefix}-p{i}`` link in the
    root namespace.  Returns the names removed."""
    host_ns_re, link_re = _names(prefix)
    removed = []
    namespaces = [ns for ns in _list_netns() if host_ns_re.match(ns) or ns == f"{prefix}-sw"]
    pids = []
    for ns in namespaces:
        pids += _netns_pids(ns)
    _kill_pids(sorted(set(pids)))
    for ns in namespaces:
        if _run(["ip", "netns", "del", ns], check=False).returncode == 0:
            removed.append(ns)
    for link in _list_links():
        if link_re.match(link):
            if _run(["ip", "link", "del", link], check=False).returncode == 0:
                removed.append(link)
    if os.path.isdir(_ETC_NETNS):
        for name in os.listdir(_ETC_NETNS):
            if host_ns_re.match(name):
                shutil.rmtree(os.path.join(_ETC_NETNS, name), ignore_errors=True)
        try:
            os.rmdir(_ETC_NETNS)  # only if empty (other users may have entries)
        except OSError:
            pass
    return removed


# --------------------------------------------------------------------------- main class
class EmulatedHosts:
    """N network namespaces with rate-limited full-duplex links.

    >>> with EmulatedHosts(4, gbps=1.0) as hosts:
    ...     p = hosts.popen(0, ["python", "server.py"], env=hosts.env_for(0))
    """

    def __init__(
        self,
        n_hosts: int,
        gbps: float,
        prefix: str = "rsb",
        burst_bytes: int = 256 * 1024,
        subnet: str = "10.77.0.0/24",
        latency_ms: float = 20.0,
        mtu: int = 1500,
        congestion: str | None = None,
        delay_ms: float = 0.0,
        jitter_ms: float = 0.0,
        loss: float = 0.0,
    ):
        if n_hosts < 1:
            raise ValueError("n_hosts must be >= 1")
        if not gbps > 0:
            raise ValueError("gbps must be > 0")
        if not _PREFIX_RE.match(prefix):
            raise ValueError(f"prefix must be alphanumeric/underscore starting with a letter: {prefix!r}")
        if len(f"{prefix}-v{n_hosts - 1}") > _IFNAMSIZ or len(f"{prefix}-br") > _IFNAMSIZ:
            raise ValueError(f"prefix {prefix!r} too long for interface names (max {_IFNAMSIZ} chars)")
        net = ipaddress.ip_network(subnet)
        if net.version != 4 or net.num_addresses - 2 < n_hosts:
            raise ValueError(f"subnet {subnet} too small for {n_hosts} hosts")
        check_path(delay_ms, jitter_ms, loss)
        self.delay_ms, self.jitter_ms, self.loss = float(delay_ms), float(jitter_ms), float(loss)
        self.relayed = delay_ms > 0 or jitter_ms > 0 or loss > 0  # a delay relay, not the bridge, joins the hosts
        self.n_hosts = n_hosts
        self.gbps = float(gbps)
        self.prefix = prefix
        self.burst_bytes = int(burst_bytes)
        self.latency_ms = float(latency_ms)
        self.mtu = int(mtu)
        self.subnet = net
        self.congestion: str | None = None
        self._congestion_wanted = congestion
        self.switch_netns = f"{prefix}-sw"
        self.bridge = f"{prefix}-br"
        self.hosts: list[Host] = [
            Host(index=i, ip=str(net.network_address + i + 1), netns=f"{prefix}-h{i}") for i in range(n_hosts)
        ]
        self._procs: list[subprocess.Popen] = []
        self._active = False
        self._lock = threading.RLock()
        self._prev_sigterm: Callable[[int, FrameType | None], Any] | int | None = None
        self._sigterm_installed = False

    # -- sequence-like access
    def __len__(self) -> int:
        return self.n_hosts

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __iter__(self):
        return iter(self.hosts)

    @property
    def rate_bps(self) -> int:
        return int(round(self.gbps * 1e9))

    def tbf_args(self) -> list[str]:
        return [
            "tbf",
            "rate",
            f"{self.rate_bps}bit",
            "burst",
            str(self.burst_bytes),
            "latency",
            f"{self.latency_ms:g}ms",
        ]

    # -- lifecycle
    def __enter__(self) -> EmulatedHosts:
        check_prerequisites()
        cleanup_stale(self.prefix)
        self._active = True
        self._install_handlers()
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def _setup(self) -> None:
        sw = self.switch_netns
        p = _run(["ip", "netns", "add", sw], check=False)
        if p.returncode != 0:
            raise EmulationError(
                "emulated hosts need root and iproute2 (ip, tc): cannot create a network "
                f"namespace (missing CAP_SYS_ADMIN/CAP_NET_ADMIN?): {p.stderr.strip()}"
            )
        for h in self.hosts:
            _run(["ip", "netns", "add", h.netns])
        # Switch namespace: bridge without IP, no IPv6 link-local chatter.
        sw_cmds = [
            "link set lo up",
            f"link add {self.bridge} type bridge stp_state 0 forward_delay 0 mcast_snooping 0",
            f"link set {self.bridge} addrgenmode none",
            f"link set {self.bridge} up",
        ]
        for i, h in enumerate(self.hosts):
            v, peer = f"{self.prefix}-v{i}", f"{self.prefix}-p{i}"
            sw_cmds += [
                f"link add {v} mtu {self.mtu} type veth peer name {peer} mtu {self.mtu}",
                f"link set {v} addrgenmode none",
                *([] if self.relayed else [f"link set {v} master {self.bridge}"]),
                f"link set {peer} netns {h.netns}",
                f"link set {v} up",
            ]
        _ip_batch(sw_cmds, netns=sw)
        _write_etc_netns(self.hosts)
        plen = self.subnet.prefixlen
        for i, h in enumerate(self.hosts):
            _ip_batch(
                [
                    "link set lo up",
                    f"link set {self.prefix}-p{i} name {h.ifname}",
                    f"link set {h.ifname} addrgenmode none",  # reset by the move; IPv4 only on the wire
                    f"link set {h.ifname} address {_mac(h.ip)}",
                    f"addr add {h.ip}/{plen} dev {h.ifname}",
                    f"link set {h.ifname} up",
                    *_neighbours(self.hosts, h),
                ],
                netns=h.netns,
            )
            # what the host sends ...
            _run(["tc", "-n", h.netns, "qdisc", "replace", "dev", h.ifname, "root"] + self.tbf_args())
            # ... and what it receives
            _run(["tc", "-n", sw, "qdisc", "replace", "dev", f"{self.prefix}-v{i}", "root"] + self.tbf_args())
        if self.relayed:
            self._procs.append(start_relay(self))
        if self._congestion_wanted:
            self.set_congestion(self._congestion_wanted)

    def set_congestion(self, name: str | None) -> None:
        """Make every host's TCP connections opened from now on use congestion control `name`
        (the subnet route's ``congctl``); None or '' = the namespace's default again."""
        if name and name not in available_congestion():
            raise EmulationError(
                f"TCP congestion control {name!r} is not available in this kernel (available: "
                f"{' '.join(available_congestion()) or '?'}; e.g. `modprobe tcp_{name}`)"
            )
        plen = self.subnet.prefixlen
        for h in self.hosts:
            _run(
                [
                    "ip",
                    "-n",
                    h.netns,
                    "route",
                    "replace",
                    f"{self.subnet.network_address}/{plen}",
                    "dev",
                    h.ifname,
                    "proto",
                    "kernel",
                    "scope",
                    "link",
                    "src",
                    h.ip,
                ]
                + (["congctl", name] if name else [])
            )
        self.congestion = name or None

    def flow_congestion(self, i: int) -> dict[str, int]:
        """Congestion control of host i's established TCP connections now: {algorithm: count}."""
        ss = _which("ss")
        if ss is None:
            return {}
        p = _run(["ip", "netns", "exec", self.hosts[i].netns, ss, "-tin"], check=False)
        return parse_ss_congestion(p.stdout) if p.returncode == 0 else {}

    def tcp_counters(self) -> dict[str, int] | None:
        """TCP counters (reducer.bench.tcp_counters.COUNTERS) summed over every host's namespace now,
        with the packets the hosts' own queues (host_drops) and the switch's ports (switch_drops)
        dropped; None if one cannot be read."""
        reads = [(h.netns, ["cat", "/proc/net/snmp", "/proc/net/netstat"], "") for h in self.hosts]
        reads += [(h.netns, ["tc", "-s", "qdisc", "show", "dev", h.ifname], "host_drops") for h in self.hosts]
        reads.append((self.switch_netns, ["tc", "-s", "qdisc", "show"], "switch_drops"))
        return _sum_counters(reads)

    def close(self) -> None:
        """Kill processes inside the namespaces and delete everything. Idempotent."""
        with self._lock:
            if not self._active:
                return
            try:
                for p in list(self._procs):
                    if p.poll() is None:
                        try:
                            p.terminate()
                        except OSError:
                            pass
                cleanup_stale(self.prefix)
                for p in self._procs:
                    try:
                        p.wait(timeout=2)
                    except Exception:
                        pass
                self._procs.clear()
            finally:
                self._active = False
                self._remove_handlers()

    # -- signals / atexit
    def _install_handlers(self) -> None:
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            try:
                self._prev_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
                self._sigterm_installed = True
            except (ValueError, OSError):
                self._sigterm_installed = False

    def _remove_handlers(self) -> None:
        try:
            atexit.unregister(self.close)
        except Exception:
            pass
        if self._sigterm_installed and threading.current_thread() is threading.main_thread():
            try:
                signal.signal(signal.SIGTERM, self._prev_sigterm if self._prev_sigterm is not None else signal.SIG_DFL)
            except (ValueError, OSError, TypeError):
                pass
            self._sigterm_installed = False

    def _on_sigterm(self, signum, frame) -> None:
        prev = self._prev_sigterm
        self.close()
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_IGN:
            return
        else:
            raise SystemExit(128 + signum)

    # -- running things inside hosts
    def env_for(self, i: int) -> dict[str, str]:
        """Environment additions for processes of host i (socket interface pinning)."""
        h = self.hosts[i]
        return {
            "GLOO_SOCKET_IFNAME": h.ifname,
            "TP_SOCKET_IFNAME": h.ifname,
            "NCCL_SOCKET_IFNAME": h.ifname,
            "RSB_EMU_HOST_INDEX": str(i),
            "RSB_EMU_HOST_IP": h.ip,
        }

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        return [_tool("ip"), "netns", "exec", self.hosts[i].netns] + [str(a) for a in argv]

    def popen(self, i: int, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start `argv` inside host i's namespace.  `env` (if given) is merged
        over os.environ + env_for(i).  The process is killed on exit."""
        if not self._active:
            raise EmulationError("EmulatedHosts is not active (use it as a context manager)")
        env = dict(os.environ)
        env.update(self.env_for(i))
        env.update(kw.pop("env", None) or {})
        p = subprocess.Popen(self.command(i, argv), env=env, **kw)
        self._procs.append(p)
        return p

    def run(self, i: int, argv: Sequence[str], timeout: float = 60.0, **kw) -> subprocess.CompletedProcess:
        """Like subprocess.run inside host i (stdout/stderr captured as text by default)."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        p = self.popen(i, argv, **kw)
        try:
            out, err = p.communicate(timeout=timeout)
        except BaseException:
            p.kill()
            p.wait()
            raise
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)


# --------------------------------------------------------------------------- self-test CLI
# `python -m reducer.bench.emulate selftest --gbps 1` (or `python benchmarks/emulate.py selftest`)
# measures TCP throughput between emulated hosts (one way and both ways at once).  `_recv`/`_send`
# are its helpers, run inside the namespaces as `python .../emulate.py _recv|_send ...`.


def _tcp_recv(port: int) -> None:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept()
    buf = bytearray(1 << 20)
    total, t_first, t_last = 0, None, None
    while True:
        n = c.recv_into(buf)
        if not n:
            break
        now = time.perf_counter()
        if t_first is None:
            t_first, first_n = now, n
        total += n
        t_last = now
    # rate over [first byte, last byte]; the first chunk arrived at t_first
    dt = (t_last - t_first) if t_first is not None and t_last is not None else 0.0
    rate = (total - first_n) * 8 / dt if dt > 0 else 0.0
    print(f"{total} {dt:.6f} {rate:.1f}", flush=True)


def _tcp_send(ip: str, port: int, seconds: float) -> None:
    c = socket.create_connection((ip, port), timeout=10)
    data = memoryview(bytearray(4 << 20))
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        c.sendall(data[: 1 << 20])
    c.shutdown(socket.SHUT_WR)
    c.recv(1)
    c.close()


def measure_tcp(
    hosts: EmulatedHosts, pairs: Sequence[tuple], seconds: float = 2.0, base_port: int = 5201
) -> list[float]:
    """Run one TCP stream per (src, dst) pair at the same time; return the
    payload rate of each in bit/s (measured at the receiver)."""
    me = os.path.abspath(__file__)
    recvs, sends = [], []
    for k, (_src, dst) in enumerate(pairs):
        r = hosts.popen(dst, [sys.executable, me, "_recv", str(base_port + k)], stdout=subprocess.PIPE, text=True)
        assert r.stdout is not None
        if r.stdout.readline().strip() != "ready":
            raise EmulationError("receiver did not start")
        recvs.append(r)
    for k, (src, dst) in enumerate(pairs):
        sends.append(hosts.popen(src, [sys.executable, me, "_send", hosts[dst].ip, str(base_port + k), str(seconds)]))
    rates = []
    for r in recvs:
        out, _ = r.communicate(timeout=seconds + 30)
        rates.append(float(out.split()[2]))
    for s in sends:
        s.wait(timeout=30)
    return rates


def _selftest(argv: list[str]) -> int:
    from reducer.bench.cpu_monitor import CpuMonitor  # noqa: PLC0415 (run as a file inside the namespaces (`python emulate.py _recv`): the standard library only at module level)

    ap = argparse.ArgumentParser(prog="emulate selftest")
    ap.add_argument("--gbps", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--burst", type=int, default=256 * 1024)
    ap.add_argument("--prefix", default=f"rst{os.getpid() % 10000}")
    a = ap.parse_args(argv)
    with EmulatedHosts(2, a.gbps, prefix=a.prefix, burst_bytes=a.burst, latency_ms=a.latency_ms) as hosts:
        rate = a.gbps * 1e9
        for label, pairs in (("one way 0->1", [(0, 1)]), ("both ways", [(0, 1), (1, 0)])):
            with CpuMonitor() as cpu:
                rates = measure_tcp(hosts, pairs, a.seconds)
            txt = ", ".join(f"{r / 1e6:.1f} Mbit/s ({100 * r / rate:.1f}%)" for r in rates)
            print(f"{label}: {txt}; cpu mean {cpu.mean_percent:.0f}% max {cpu.max_percent:.0f}%")
    return 0


def start_relay(hosts: EmulatedHosts) -> subprocess.Popen:
    """The latency emulation: core.delay_relay (csrc/emulate/delay_relay.h) in the switch namespace
    forwards frames among the hosts' links, each direction of a path delay_ms +- jitter_ms later
    (one way; a round trip is twice), dropping `loss` of them. This kernel has no sch_netem, and no
    sch_fq for a tc BPF program's departure times."""
    ports = [f"{hosts.prefix}-v{i}" for i in range(hosts.n_hosts)]
    code = (
        "from reducer._native import core; "
        f"core.delay_relay({ports!r}, {int(hosts.delay_ms * 1000)}, {int(hosts.jitter_ms * 1000)}, {hosts.loss!r})"
    )
    proc = subprocess.Popen(
        ["ip", "netns", "exec", hosts.switch_netns, sys.executable, "-c", code],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.3)
    if proc.poll() is not None:
        raise EmulationError(f"the delay relay stopped: {(proc.stderr.read() if proc.stderr else '').strip()}")
    return proc


def main(argv: list[str]) -> int:
    """`selftest [--gbps G] [--seconds S] [--latency-ms L]`, or the `_recv` / `_send` helpers."""
    if len(argv) >= 1 and argv[0] == "_recv":
        _tcp_recv(int(argv[1]))
        return 0
    if len(argv) >= 1 and argv[0] == "_send":
        _tcp_send(argv[1], int(argv[2]), float(argv[3]))
        return 0
    if len(argv) >= 1 and argv[0] == "selftest":
        return _selftest(argv[1:])
    print("usage: python -m reducer.bench.emulate selftest [--gbps G] [--seconds S] [--latency-ms L]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
