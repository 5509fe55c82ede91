"""The SimGrid side of the simulator: platform, actors of rs and the ring, run in a child process.

Run as a script (``python sg_actors.py < spec.json``, by reducer.simulate.engine) because a SimGrid
engine is one per process and cannot be reset; it imports nothing of ``reducer`` (the parent derives
every parameter from the code's own rules and passes them in the spec), only the standard library
and simgrid. It prints one JSON object: ``{"seconds": T, "events": N}``.

Network: SimGrid's flow-level TCP model (LV08: max-min fair sharing of every link among the flows
that cross it). Each TCP connection is FIFO: its chunks are transferred one after the other (one
receive posted at a time per connection, the next as soon as one completes), the connections of a
host share its link, and a message is handed over one propagation delay (half the round trip)
after its last byte (Inbox). Hosts: one split-duplex link per host (its NIC, both directions at
full rate) into a non-blocking switch, or a two-level fat tree.
"""

from __future__ import annotations

import glob
import heapq
import importlib.util
import json
import os
import sys
import tempfile
from typing import Any

DEBIAN_DIR = "/usr/lib/python3/dist-packages"


def load_simgrid() -> Any:
    """The simgrid module: installed in this Python, else Debian's python3-simgrid build for the same
    Python version (imported from its file alone, not the whole system site-packages)."""
    try:
        import simgrid  # noqa: PLC0415 (optional: the fallback below loads Debian's build)

        return simgrid
    except ImportError:
        pass
    tag = f"cpython-{sys.version_info.major}{sys.version_info.minor}"
    for path in sorted(glob.glob(os.path.join(os.environ.get("RS_SIMGRID_DIR", DEBIAN_DIR), f"simgrid.{tag}*.so"))):
        spec = importlib.util.spec_from_file_location("simgrid", path)
        if spec is None or spec.loader is None:
            continue
        mod = importlib.util.module_from_spec(spec)
        sys.modules["simgrid"] = mod
        spec.loader.exec_module(mod)
        return mod
    raise ImportError("simgrid")


# ---- platform -------------------------------------------------------------------------------


def _bw(bytes_per_s: float) -> str:
    return f"{bytes_per_s:.6g}Bps"


def star_xml(hosts: list[tuple[str, float]], latency: float, speed: float, cores: dict[str, int]) -> str:
    """Per-host link model: host h's NIC is a split-duplex link of its rate (bytes/s) and half the
    one-way latency; a route crosses the sender's up link and the receiver's down link (a
    non-blocking switch, as the emulation's bridge)."""
    lat = f"{latency / 2:.9f}s"
    out = ['<?xml version="1.0"?>', '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">']
    out.append('<platform version="4.1"><zone id="net" routing="Full">')
    for name, _ in hosts:
        out.append(f'<host id="{name}" speed="{speed:.6g}f" core="{cores.get(name, 1)}"/>')
    for name, rate in hosts:
        out.append(f'<link id="{name}_nic" bandwidth="{_bw(rate)}" latency="{lat}" sharing_policy="SPLITDUPLEX"/>')
    for a, _ in hosts:
        for b, _ in hosts:
            if a != b:
                out.append(
                    f'<route src="{a}" dst="{b}" symmetrical="NO"><link_ctn id="{a}_nic" direction="UP"/>'
                    f'<link_ctn id="{b}_nic" direction="DOWN"/></route>'
                )
    out.append("</zone></platform>")
    return "\n".join(out)


def fat_tree_xml(hosts: list[tuple[str, float]], latency: float, speed: float, leaf: int, uplinks: int) -> str:
    """Two-level fat tree (SimGrid's FAT_TREE cluster): `leaf` hosts per leaf switch, `uplinks`
    spine switches each joined to every leaf by one link; every link has the first host's rate
    (uplinks < leaf oversubscribes the leaves leaf:uplinks). Hosts are named c0..cN-1 in order."""
    n = len(hosts)
    leaves = max(1, -(-n // leaf))
    rate = hosts[0][1]
    lat = f"{latency / 4:.9f}s"
    params = f"2;{leaf},{leaves};1,{uplinks};1,1"
    return "\n".join(
        [
            '<?xml version="1.0"?>',
            '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">',
            '<platform version="4.1">',
            f'<cluster id="ft" prefix="c" suffix="" radical="0-{leaves * leaf - 1}" speed="{speed:.6g}f" '
            f'bw="{_bw(rate)}" lat="{lat}" topology="FAT_TREE" topo_parameters="{params}" '
            'sharing_policy="SPLITDUPLEX"/>',
            "</platform>",
        ]
    )


# ---- actors ---------------------------------------------------------------------------------


class Counter:
    """Simulated events (chunk transfers), reported with the result."""

    events = 0


def _wait_any(sg: Any, comms: list[Any], timeout: float | None) -> int:
    if hasattr(sg.Comm, "wait_any"):  # SimGrid 3.x
        return int(sg.Comm.wait_any(comms) if timeout is None else sg.Comm.wait_any_for(comms, timeout))
    # SimGrid 4.x: ActivitySet (written to its documented API; the tests run on 3.32)
    aset = sg.ActivitySet(comms)
    done = aset.wait_any() if timeout is None else aset.wait_any_for(timeout)
    return next((n for n, c in enumerate(comms) if c is done or c == done), -1)


class Inbox:
    """An actor's TCP connections in: one receive posted per connection (a connection is FIFO),
    the next posted as soon as one completes (the stream goes on), and each message handed over
    one propagation delay after its last byte (`delay`: the links themselves have none, so a
    stream pays the latency once, not per chunk)."""

    def __init__(self, sg: Any, delay: float) -> None:
        self.sg, self.delay = sg, delay
        self.comms: list[Any] = []
        self.datas: list[Any] = []
        self.keys: list[Any] = []
        self.left: dict[Any, int] = {}  # messages still to receive per connection
        self.due: list[tuple[float, int, Any, Any]] = []  # (time, order, key, payload)
        self.order = 0

    def open(self, key: Any, mailbox: str, messages: int) -> None:
        self.left[key] = messages
        self._post(key, mailbox)

    def _post(self, key: Any, mailbox: str) -> None:
        if self.left[key] > 0:
            self.left[key] -= 1
            comm, data = self.sg.Mailbox.by_name(mailbox).get_async()
            self.comms.append(comm)
            self.datas.append(data)
            self.keys.append((key, mailbox))

    def pending(self) -> bool:
        return bool(self.comms or self.due)

    def take(self) -> tuple[Any, Any]:
        """The next message handed over: (its connection's key, its payload)."""
        sg = self.sg
        while True:
            now = sg.Engine.clock
            if self.due and self.due[0][0] <= now + 1e-15:
                _, _, key, payload = heapq.heappop(self.due)
                return key, payload
            timeout = self.due[0][0] - now if self.due else None
            i = _wait_any(sg, self.comms, timeout) if self.comms else -1
            if i < 0:
                if not self.comms:
                    sg.this_actor.sleep_until(self.due[0][0])
                continue
            for lst in (self.comms, self.datas, self.keys):
                lst[i], lst[-1] = lst[-1], lst[i]
            self.comms.pop()
            payload = self.datas.pop().get()
            key, mailbox = self.keys.pop()
            Counter.events += 1
            self._post(key, mailbox)
            self.order += 1
            heapq.heappush(self.due, (sg.Engine.clock + self.delay, self.order, key, payload))


def rs_worker(sg: Any, spec: dict[str, Any], i: int, finish: list[float]) -> None:
    """Worker i: one shard per reducer in chunks, at most `window` chunks per link whose results
    have not come back (csrc/client/schedule.cc, Schedule::fill). The links in spec["late"][i] lost
    their first window to incast: it leaves after one retransmission timeout."""
    shards = spec["shards"]  # per reducer: [bytes, chunk]
    window = spec["window"]
    late = set(spec["late"][i])
    out = [sg.Mailbox.by_name(f"d{j}_{i}") for j in range(len(shards))]
    nchunks = [-(-b // c) if b else 0 for b, c in shards]
    sent = [0] * len(shards)

    def send(j: int) -> None:
        b, c = shards[j]
        k = sent[j]
        out[j].put_init(k, min(c, b - k * c)).detach()
        sent[j] += 1

    def first_window(links: list[int]) -> None:
        for j in links:
            for _ in range(min(window, nchunks[j])):
                send(j)

    first_window([j for j in range(len(shards)) if j not in late])
    if late:
        sg.Actor.create(f"w{i}.rto", sg.this_actor.get_host(), _after, sg, spec["rto"], first_window, sorted(late))
    inbox = Inbox(sg, spec["delay"])
    for j, n in enumerate(nchunks):
        if n:
            inbox.open(j, f"r{i}_{j}", n)
    while inbox.pending():
        j, _k = inbox.take()
        if sent[j] < nchunks[j]:
            send(j)
    finish[i] = sg.Engine.clock


def _after(sg: Any, delay: float, fn: Any, *args: Any) -> None:
    sg.this_actor.sleep_for(delay)
    fn(*args)


class ReducerState:
    """One reducer's group stream: contributions per chunk, its slots (chunk k needs chunk
    k - slots released: Group::slot_for, DataPath::try_claim), the links paused on a slot."""

    def __init__(self, sg: Any, workers: int, nchunks: int, slots: int, threads: int) -> None:
        self.workers = workers
        self.arrived = [0] * nchunks
        self.released = 0  # chunks 0..released-1 are complete (results queued to every worker)
        self.complete = [False] * nchunks
        self.slots = slots
        self.paused: list[tuple[int, int]] = []  # (worker, chunk) whose link waits for a slot
        self.wake = [sg.Semaphore(0) for _ in range(threads)]  # a thread with only paused links sleeps here


def rs_reducer_thread(sg: Any, spec: dict[str, Any], j: int, thread: int, threads: int, state: ReducerState) -> None:
    """One event-loop thread of reducer j: reads the links of its workers (worker i on thread
    i mod threads), folds each contribution in (with a sum rate: an exec of the chunk's bytes on one
    core) and, when a chunk has every worker's, queues its result to every worker; the slot is
    free once the results are queued (the socket buffers take them)."""
    b, c = spec["shards"][j]
    nchunks = -(-b // c)
    workers = spec["workers"]
    mine = range(thread, workers, threads)
    sum_bps = spec["sum_bps"]
    inbox = Inbox(sg, spec["delay"])
    for i in mine:
        inbox.open(i, f"d{j}_{i}", nchunks)

    def fold(i: int, k: int) -> None:
        size = min(c, b - k * c)
        if sum_bps:
            sg.this_actor.execute(size)
        state.arrived[k] += 1
        if state.arrived[k] == workers:
            state.complete[k] = True
            for w in range(workers):
                sg.Mailbox.by_name(f"r{w}_{j}").put_init(k, size).detach()
            while state.released < nchunks and state.complete[state.released]:
                state.released += 1
            wake, state.paused = state.paused, []
            for wi, wk in wake:
                claim(wi, wk)
            for sem in state.wake:
                sem.release()

    def claim(i: int, k: int) -> None:
        if k - state.slots >= state.released:
            state.paused.append((i, k))  # the slot holds an older chunk: this link is not read
        else:
            fold(i, k)

    def paused_here() -> bool:
        return any(w in mine for w, _ in state.paused)

    while inbox.pending() or paused_here():
        if not inbox.pending():  # only paused chunks: another thread's chunk frees the slot
            state.wake[thread].acquire()
            continue
        i, k = inbox.take()
        claim(i, k)


def ring_rank(sg: Any, spec: dict[str, Any], r: int, finish: list[float]) -> None:
    """Rank r of the ring (csrc/ring): 2(n-1) steps of one segment each, streamed in chunks; chunk k
    of step s+1 leaves once chunk k of step s has arrived (and, while reducing, been summed)."""
    n = spec["ranks"]
    steps, seg, c = spec["steps"], spec["segment"], spec["chunk"]
    reduce_steps = steps // 2
    sum_bps = spec["sum_bps"]
    right = sg.Mailbox.by_name(f"ring{(r + 1) % n}")
    sizes = [min(c, seg - k * c) for k in range(-(-seg // c))] if seg else []
    for k, size in enumerate(sizes):
        right.put_init((0, k), size).detach()
    inbox = Inbox(sg, spec["delay"])
    inbox.open(0, f"ring{r}", steps * len(sizes))
    while inbox.pending():
        _, (s, k) = inbox.take()
        if s < reduce_steps and sum_bps:
            sg.this_actor.execute(sizes[k])
        if s + 1 < steps:
            right.put_init((s + 1, k), sizes[k]).detach()
    finish[r] = sg.Engine.clock


# ---- one run --------------------------------------------------------------------------------


def run(spec: dict[str, Any]) -> dict[str, Any]:
    sg = load_simgrid()
    plat = spec["platform"]
    spec["delay"] = plat["latency"] / 2  # one way; the links carry none (Inbox adds it per message)
    algo = spec["algo"]
    speed = spec["sum_bps"] or 1e18
    if algo == "rs":
        workers, reducers = spec["workers"], len(spec["shards"])
        hosts = [(f"w{i}", spec["worker_bps"]) for i in range(workers)]
        hosts += [(f"r{j}", spec["reducer_bps"]) for j in range(reducers)]
    else:
        hosts = [(f"w{i}", spec["worker_bps"]) for i in range(spec["ranks"])]
    cores = {name: spec.get("threads", 1) for name, _ in hosts if name.startswith("r")}
    if plat["kind"] == "fat_tree":
        xml = fat_tree_xml(hosts, 0.0, speed, plat["leaf"], plat["uplinks"])
        names = {name: f"c{idx}" for idx, (name, _) in enumerate(hosts)}
    else:
        xml = star_xml(hosts, 0.0, speed, cores)
        names = {name: name for name, _ in hosts}
    args = [
        "rs-simulate",
        "--log=root.thres:critical",
        "--cfg=network/model:LV08",
        f"--cfg=network/bandwidth-factor:{spec['efficiency']}",
        "--cfg=network/latency-factor:1.0",
        "--cfg=network/weight-S:0",
        f"--cfg=network/TCP-gamma:{spec['gamma']}",
        "--cfg=network/crosstraffic:0",
    ]
    e = sg.Engine(args)
    with tempfile.NamedTemporaryFile("w", suffix=".xml", delete=False) as fh:
        fh.write(xml)
    try:
        e.load_platform(fh.name)
    finally:
        os.unlink(fh.name)
    host = {name: sg.Host.by_name(names[name]) for name, _ in hosts}
    if algo == "rs":
        finish = [0.0] * spec["workers"]
        for i in range(spec["workers"]):
            sg.Actor.create(f"w{i}", host[f"w{i}"], rs_worker, sg, spec, i, finish)
        threads = min(spec.get("threads", 1), spec["workers"]) if spec["sum_bps"] else 1
        for j, (b, c) in enumerate(spec["shards"]):
            if not b:
                continue
            state = ReducerState(sg, spec["workers"], -(-b // c), spec["slots"], threads)
            for t in range(threads):
                sg.Actor.create(f"r{j}.{t}", host[f"r{j}"], rs_reducer_thread, sg, spec, j, t, threads, state)
    else:
        finish = [0.0] * spec["ranks"]
        for r in range(spec["ranks"]):
            sg.Actor.create(f"w{r}", host[f"w{r}"], ring_rank, sg, spec, r, finish)
    e.run()
    return {"seconds": max(finish), "events": Counter.events}


if __name__ == "__main__":
    result = run(json.load(sys.stdin))
    sys.stdout.write(json.dumps(result) + "\n")
