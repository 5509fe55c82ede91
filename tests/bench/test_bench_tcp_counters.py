"""The bench's TCP counters (reducer/bench/tcp_counters.py): parsed from the kernel's tables, summed
per pass, described in one line."""

from __future__ import annotations

from reducer.bench import tcp_counters

TCP_NAMES = "RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab"
SNMP = f"""Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 1000
Tcp: {TCP_NAMES} InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 5 3 0 0 8 91234 100000 250 0 2 0
Udp: InDatagrams NoPorts
Udp: 0 0
"""
NETSTAT = """TcpExt: SyncookiesSent SyncookiesRecv TCPTimeouts TCPLossProbes TCPLossProbeRecovery
TcpExt: 0 0 7 31 4
IpExt: InNoRoutes InTruncatedPkts
IpExt: 0 0
"""


def test_parse_reads_the_four_counters_from_both_files() -> None:
    got = tcp_counters.parse(SNMP + NETSTAT)
    assert got == {"sent": 100000, "retransmitted": 250, "timeouts": 7, "loss_probes": 31}


def test_parse_ignores_what_it_does_not_know() -> None:
    assert tcp_counters.parse("") == {}
    assert tcp_counters.parse("Tcp: OutSegs\nUdp: 5\n") == {}  # a values line of another table
    assert tcp_counters.parse("garbage\nmore garbage\n") == {}


def test_delta_and_the_report_line() -> None:
    before = {"sent": 100, "retransmitted": 1, "timeouts": 0, "loss_probes": 0}
    after = {"sent": 10100, "retransmitted": 51, "timeouts": 2, "loss_probes": 3}
    d = tcp_counters.delta(before, after)
    assert d == {"sent": 10000, "retransmitted": 50, "timeouts": 2, "loss_probes": 3}
    line = tcp_counters.describe("rs", d)
    assert line is not None
    assert "10000 segments sent, 50 retransmitted (0.50%), 2 retransmission timeouts, 3 tail-loss probes" in line
    assert tcp_counters.delta(None, after) is None
    assert tcp_counters.describe("rs", None) is None
    assert tcp_counters.describe("rs", {"sent": 0}) is None
