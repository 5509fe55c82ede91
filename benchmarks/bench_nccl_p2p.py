#!/usr/bin/env python3
"""The NCCL plugin's point-to-point net vs a plain multi-stream TCP baseline, in the same run.

One sender and one receiver process move `--count` messages of `--size` bytes (4 MiB by
default), first through the plugin's v12 net table (tests/nccl_harness.py's ctypes tables: the
calls NCCL's proxy makes, `--depth` requests in flight, test() polled), then through a baseline
of plain TCP: the same number of sockets, one thread per socket that sends (MSG_WAITALL-receives)
its contiguous stripe of every message with blocking calls. Per run it prints throughput, the
CPU seconds of the threads that move the data (the plugin's progress threads / the baseline's
socket threads, read from /proc/self/task before the comms close; the polling main thread is
NCCL's proxy in a real job and is reported apart as process CPU), bytes per data-thread
CPU-second, the plugin/baseline ratios, and the load average before and after.

    # loopback (no root): bytes per CPU-second
    python benchmarks/bench_nccl_p2p.py --nsocks 2 --threads 1
    # two emulated hosts, 1 Gbit/s each way (network namespaces + tc; root):
    python benchmarks/bench_nccl_p2p.py --emulate-gbps 1 --count 100

Every received message is checked (its first and last 8 bytes carry the message number).
"""

from __future__ import annotations

import argparse
import ctypes as C
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

from reducer.bench import emulate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")  # the ranks import tests/nccl_harness.py (their PYTHONPATH, below)

TCP_PAYLOAD = 0.956  # TCP payload share of tbf's rate (reducer/bench/emulate.py)


# -- per-thread CPU ----------------------------------------------------------------------------


def thread_cpu(tids: list[int]) -> float:
    """CPU seconds (user + system) of these threads of this process."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        except FileNotFoundError:
            pass
    return total / tick


def tasks() -> list[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]


def stamp(buf: Any, i: int) -> None:
    buf[:8] = memoryview(i.to_bytes(8, "little"))
    buf[-8:] = memoryview(i.to_bytes(8, "little"))


def stamped(buf: Any, i: int) -> bool:
    return bytes(buf[:8]) == i.to_bytes(8, "little") == bytes(buf[-8:])


# -- the plugin -----------------------------------------------------------------------------------


def plugin_side(role: str, rdv: str, size: int, count: int, depth: int) -> dict[str, Any]:
    import nccl_harness as H  # noqa: PLC0415 (tests/nccl_harness.py: on the ranks' PYTHONPATH only, not the parent's)

    before = set(tasks())
    plugin = H.Plugin()
    net = H.init_net(plugin, 12)
    handle, lcomm = H.listen(plugin, net, 12, None) if role == "recv" else (None, None)
    comm = C.c_void_p()
    if role == "recv":
        H.publish(rdv, "handle", handle.raw)
        H._wait(
            lambda: H.check(net.accept(lcomm, C.byref(comm), None), "accept", plugin) or bool(comm.value), "accept", 120
        )
    else:
        (raw,) = H.gather(rdv, ["handle"], 120)
        peer = C.create_string_buffer(raw, H.HANDLE_BYTES)
        H._wait(
            lambda: H.check(net.connect(None, 0, peer, C.byref(comm), None), "connect", plugin) or bool(comm.value),
            "connect",
            120,
        )
    data_tids = [t for t in tasks() if t not in before]
    bufs = [np.zeros(size, dtype=np.uint8) for _ in range(depth)]
    inflight: list[tuple] = []
    done_flag, got = C.c_int(), C.c_int()
    bad, nxt, finished = 0, 0, 0
    cpu0, t_cpu0, t0 = os.times(), thread_cpu(data_tids), time.perf_counter()
    while finished < count:
        while nxt < count and len(inflight) < depth:
            buf = bufs[nxt % depth]
            req = C.c_void_p()
            if role == "send":
                stamp(buf, nxt)
                H.check(net.isend(comm, buf.ctypes.data, size, 0, None, None, C.byref(req)), "isend", plugin)
            else:
                ptrs, sizes = (C.c_void_p * 1)(buf.ctypes.data), (C.c_size_t * 1)(size)
                H.check(net.irecv(comm, 1, ptrs, sizes, None, None, None, C.byref(req)), "irecv", plugin)
            if not req.value:
                break
            inflight.append((nxt, req))
            nxt += 1
        i, req = inflight[0]
        H.check(net.test(req, C.byref(done_flag), C.byref(got)), "test", plugin)
        if done_flag.value:
            inflight.pop(0)
            finished += 1
            if role == "recv" and (got.value != size or not stamped(bufs[i % depth], i)):
                bad += 1
        else:
            time.sleep(0.0002)  # NCCL's proxy would go on with other work
    wall = time.perf_counter() - t0
    data_cpu = thread_cpu(data_tids) - t_cpu0
    cpu1 = os.times()
    H.check(net.closeSend(comm) if role == "send" else net.closeRecv(comm), "close", plugin)
    if lcomm is not None:
        H.check(net.closeListen(lcomm), "closeListen", plugin)
    plugin.close()
    return {
        "wall_s": wall,
        "data_cpu_s": data_cpu,
        "proc_cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
        "bad": bad,
        "data_threads": len(data_tids),
    }


# -- plain multi-stream TCP -------------------------------------------------------------------------


def stripes(size: int, n: int) -> list[tuple]:
    chunk = -(-size // n)
    return [(min(size, s * chunk), min(size, (s + 1) * chunk) - min(size, s * chunk)) for s in range(n)]


def tcp_side(role: str, rdv: str, size: int, count: int, nsocks: int, host: str) -> dict[str, Any]:
    socks: list[socket.socket] = []
    if role == "recv":
        lst = socket.create_server((host, 0), backlog=nsocks)
        H_publish(rdv, "port", str(lst.getsockname()[1]).encode())
        conns = [lst.accept()[0] for _ in range(nsocks)]
        order = [int.from_bytes(c.recv(1, socket.MSG_WAITALL), "little") for c in conns]
        socks = [c for _, c in sorted(zip(order, conns), key=lambda x: x[0])]
        lst.close()
    else:
        port = int(H_gather(rdv, "port"))
        for s in range(nsocks):
            c = socket.create_connection((host, port))
            c.sendall(bytes([s]))
            socks.append(c)
    for c in socks:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(size)
    view = memoryview(buf)
    parts = stripes(size, nsocks)
    cpu: list[float] = []
    bad = [0]
    barrier = threading.Barrier(nsocks)

    def worker(s: int) -> None:
        c0 = time.thread_time()
        off, n = parts[s]
        for i in range(count):
            if role == "send":
                socks[s].sendall(view[off : off + n])  # returns once the kernel holds a copy
            else:
                got = socks[s].recv_into(view[off : off + n], n, socket.MSG_WAITALL)
                if got != n:
                    raise RuntimeError(f"socket {s}: short receive {got} of {n}")
            barrier.wait()  # message i complete on every socket (the plugin's per-message completion)
            if s == 0:
                if role == "recv":
                    bad[0] += not stamped(view, i)
                else:
                    stamp(view, i + 1)
            barrier.wait()
        cpu.append(time.thread_time() - c0)

    if role == "send":
        stamp(view, 0)
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(nsocks)]
    cpu0, t0 = os.times(), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu1 = os.times()
    for c in socks:
        c.close()
    return {
        "wall_s": wall,
        "data_cpu_s": sum(cpu),
        "proc_cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
        "bad": bad[0],
        "data_threads": nsocks,
    }


def H_publish(rdv: str, name: str, data: bytes) -> None:
    import nccl_harness as H  # noqa: PLC0415 (tests/nccl_harness.py: on the ranks' PYTHONPATH only, not the parent's)

    H.publish(rdv, name, data)


def H_gather(rdv: str, name: str) -> bytes:
    import nccl_harness as H  # noqa: PLC0415 (tests/nccl_harness.py: on the ranks' PYTHONPATH only, not the parent's)

    return H.gather(rdv, [name], 120)[0]


# -- orchestration ----------------------------------------------------------------------------------


def side_main(args: argparse.Namespace) -> int:
    kind, role = args.role.split("-")
    if kind == "plugin":
        out = plugin_side(role, args.rdv, args.size, args.count, args.depth)
    else:
        out = tcp_side(role, args.rdv, args.size, args.count, args.nsocks, args.host)
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def result_of(kind: str, out: str, err: str, returncode: int) -> dict[str, Any]:
    """The JSON a side printed after "RESULT "."""
    found = [x[len("RESULT ") :] for x in out.splitlines() if x.startswith("RESULT ")]
    if returncode != 0 or not found:
        raise RuntimeError(f"{kind} side failed (exit {returncode}):\n{err[-3000:]}")
    return json.loads(found[0])


def run_pair(kind: str, args: argparse.Namespace, hosts: Any | None) -> dict[str, Any]:
    """One sender + one receiver of `kind`; the receiver's result with the sender's CPU added."""
    with tempfile.TemporaryDirectory(prefix="rs-p2p-bench-") as rdv:
        procs = []
        for i, role in enumerate(("recv", "send")):
            host = hosts.hosts[0].ip if hosts else "127.0.0.1"
            argv = [
                sys.executable,
                os.path.abspath(__file__),
                "--role",
                f"{kind}-{role}",
                "--rdv",
                rdv,
                "--size",
                str(args.size),
                "--count",
                str(args.count),
                "--depth",
                str(args.depth),
                "--nsocks",
                str(args.nsocks),
                "--host",
                host,
            ]
            env = {
                "PYTHONPATH": os.pathsep.join([ROOT, TESTS]),
                "OMP_NUM_THREADS": "1",
                "RS_NCCL_NSOCKS": str(args.nsocks),
                "NCCL_SOCKET_NTHREADS": str(args.threads),
                "RS_NCCL_SOCKET_IFNAME": "eth0" if hosts else "lo",
            }
            if hosts:
                procs.append(hosts.popen(i, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            else:
                procs.append(
                    subprocess.Popen(
                        argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                    )
                )
        try:
            outputs = [(p.communicate(timeout=args.timeout), p.returncode) for p in procs]
        except subprocess.TimeoutExpired as exc:
            for q in procs:
                q.kill()
            raise RuntimeError(f"{kind}: no result within {args.timeout} s") from exc
    recv, send = (result_of(kind, out, err, rc) for (out, err), rc in outputs)
    return {
        "gbps": args.size * args.count * 8 / recv["wall_s"] / 1e9,
        "bad": recv["bad"] + send["bad"],
        "data_cpu_s": recv["data_cpu_s"] + send["data_cpu_s"],
        "proc_cpu_s": recv["proc_cpu_s"] + send["proc_cpu_s"],
        "bytes_per_cpu_s": args.size * args.count / max(1e-9, recv["data_cpu_s"] + send["data_cpu_s"]),
        "data_threads": recv["data_threads"],
    }


def measure(args: argparse.Namespace, hosts: Any | None) -> list[dict[str, Any]]:
    rows = []
    for rep in range(args.reps):
        load = os.getloadavg()[0]
        order = ("plugin", "tcp") if rep % 2 == 0 else ("tcp", "plugin")
        got = {kind: run_pair(kind, args, hosts) for kind in order}
        p, t = got["plugin"], got["tcp"]
        row = {
            "rep": rep,
            "load_before": round(load, 2),
            "load_after": round(os.getloadavg()[0], 2),
            "plugin": p,
            "tcp": t,
            "throughput_ratio": p["gbps"] / t["gbps"],
            "bytes_per_cpu_ratio": p["bytes_per_cpu_s"] / t["bytes_per_cpu_s"],
        }
        if args.emulate_gbps:
            bound = args.emulate_gbps * TCP_PAYLOAD
            row.update(
                plugin_of_link=p["gbps"] / args.emulate_gbps,
                plugin_of_tcp_bound=p["gbps"] / bound,
                tcp_of_link=t["gbps"] / args.emulate_gbps,
            )
        rows.append(row)
        print(fmt_row(row, args), flush=True)
    return rows


def fmt_row(r: dict[str, Any], args: argparse.Namespace) -> str:
    p, t = r["plugin"], r["tcp"]
    text = (
        f"rep {r['rep']}: plugin {p['gbps']:.3f} Gbit/s ({p['bytes_per_cpu_s'] / 2**30:.2f} GiB per "
        f"data-CPU-s, data CPU {p['data_cpu_s']:.2f} s, process CPU {p['proc_cpu_s']:.2f} s, "
        f"{p['data_threads']} thread(s)) | "
        f"tcp {t['gbps']:.3f} Gbit/s ({t['bytes_per_cpu_s'] / 2**30:.2f} GiB per data-CPU-s, data CPU "
        f"{t['data_cpu_s']:.2f} s) | plugin/tcp throughput {r['throughput_ratio']:.3f}, bytes/CPU-s "
        f"{r['bytes_per_cpu_ratio']:.3f} | load {r['load_before']}->{r['load_after']} | "
        f"wrong {p['bad'] + t['bad']}"
    )
    if args.emulate_gbps:
        text += (
            f" | plugin {100 * r['plugin_of_link']:.1f}% of the {args.emulate_gbps:g} Gbit/s link "
            f"({100 * r['plugin_of_tcp_bound']:.1f}% of its TCP payload bound), "
            f"tcp {100 * r['tcp_of_link']:.1f}%"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=4 << 20, help="bytes per message (default 4 MiB)")
    ap.add_argument("--count", type=int, default=200, help="messages per run")
    ap.add_argument("--depth", type=int, default=8, help="plugin requests in flight")
    ap.add_argument("--nsocks", type=int, default=2, help="sockets per connection (both sides)")
    ap.add_argument("--threads", type=int, default=1, help="plugin progress threads per comm (NCCL_SOCKET_NTHREADS)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--emulate-gbps", type=float, default=0.0, help="two emulated hosts at this rate (root)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--rdv", help=argparse.SUPPRESS)
    ap.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        return side_main(args)
    print(
        f"# NCCL plugin p2p vs plain TCP: {args.count} x {args.size} B, {args.nsocks} socket(s), plugin "
        f"{args.threads} thread(s), depth {args.depth}, {os.cpu_count()} CPUs, "
        + (f"emulated {args.emulate_gbps:g} Gbit/s" if args.emulate_gbps else "loopback"),
        flush=True,
    )
    if args.emulate_gbps:
        reason = emulate.unavailable_reason()
        if reason:
            print(f"emulated hosts unavailable: {reason}", file=sys.stderr)
            return 2
        with emulate.EmulatedHosts(2, args.emulate_gbps, prefix="rsp2p") as hosts:
            rows = measure(args, hosts)
    else:
        rows = measure(args, None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any(r["plugin"]["bad"] or r["tcp"]["bad"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
