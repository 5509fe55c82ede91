"""Plays NCCL's part for the plugin library: dlopen, the exported tables, and NCCL's proxy calls.

Written from NCCL's plugin API independently of csrc/nccl_plugin/nccl_abi.h (so the two
cross-check each other: tests/nccl_plugin/test_nccl_abi_layout.py checks that every struct's size
and every member's offset here are the header's). Head processes meet through files in a shared directory (NCCL would
all-gather the 128-byte handles over its bootstrap network).
"""

from __future__ import annotations

import ctypes as C
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HANDLE_BYTES = 128
PTR_HOST, PTR_CUDA = 1, 2
SUCCESS, SYSTEM_ERROR, INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR = 0, 2, 3, 4, 5, 6

# ncclDataType_t -> numpy dtype name (None: not a reducer type)
NCCL_DTYPES = {
    0: "int8",
    1: "uint8",
    2: "int32",
    3: "uint32",
    4: "int64",
    5: "uint64",
    6: "float16",
    7: "float32",
    8: "float64",
    9: "bfloat16",
    10: "fp8e4m3",
    11: "fp8e5m2",
}
NCCL_OPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
SUPPORTED_DTYPES = {2: "int32", 4: "int64", 6: "float16", 7: "float32", 8: "float64", 9: "bfloat16"}
SUPPORTED_OPS = {0: "sum", 2: "max", 3: "min"}

R = C.c_int
P = C.c_void_p
PP = C.POINTER(C.c_void_p)
LOGGER = C.CFUNCTYPE(None, C.c_int, C.c_ulong, C.c_char_p, C.c_int, C.c_char_p, C.c_char_p)


class PropsV7(C.Structure):
    _fields_ = [
        ("name", C.c_char_p),
        ("pciPath", C.c_char_p),
        ("guid", C.c_uint64),
        ("ptrSupport", C.c_int),
        ("speed", C.c_int),
        ("port", C.c_int),
        ("latency", C.c_float),
        ("maxComms", C.c_int),
        ("maxRecvs", C.c_int),
        ("netDeviceType", C.c_int),
        ("netDeviceVersion", C.c_int),
    ]


class PropsV8(C.Structure):
    _fields_ = [
        ("name", C.c_char_p),
        ("pciPath", C.c_char_p),
        ("guid", C.c_uint64),
        ("ptrSupport", C.c_int),
        ("regIsGlobal", C.c_int),
        ("speed", C.c_int),
        ("port", C.c_int),
        ("latency", C.c_float),
        ("maxComms", C.c_int),
        ("maxRecvs", C.c_int),
        ("netDeviceType", C.c_int),
        ("netDeviceVersion", C.c_int),
    ]


def _props_v9_on(ndevs: int, multi: bool, rail: bool) -> list[tuple[str, Any]]:
    """v9/v10 (4 virtual devices, no maxMultiRequestSize), v11 (+ maxMultiRequestSize), v12 (8, + rail/plane)."""
    fields = [
        ("name", C.c_char_p),
        ("pciPath", C.c_char_p),
        ("guid", C.c_uint64),
        ("ptrSupport", C.c_int),
        ("regIsGlobal", C.c_int),
        ("forceFlush", C.c_int),
        ("speed", C.c_int),
        ("port", C.c_int),
        ("latency", C.c_float),
        ("maxComms", C.c_int),
        ("maxRecvs", C.c_int),
        ("netDeviceType", C.c_int),
        ("netDeviceVersion", C.c_int),
        ("vNdevs", C.c_int),
        ("vDevs", C.c_int * ndevs),
        ("maxP2pBytes", C.c_size_t),
        ("maxCollBytes", C.c_size_t),
    ]
    if multi:
        fields += [("maxMultiRequestSize", C.c_int)]
    if rail:
        fields += [("railId", C.c_int16), ("planeId", C.c_int16)]
    return fields


class PropsV10(C.Structure):  # v9 has the same layout
    _fields_ = _props_v9_on(4, False, False)


class PropsV11(C.Structure):
    _fields_ = _props_v9_on(4, True, False)


class PropsV12(C.Structure):
    _fields_ = _props_v9_on(8, True, True)


PROPS = {7: PropsV7, 8: PropsV8, 9: PropsV10, 10: PropsV10, 11: PropsV11, 12: PropsV12}
assert [C.sizeof(PROPS[v]) for v in (7, 8, 10, 11, 12)] == [56, 64, 104, 112, 128]
# The versions the library exports (there is no net v9: NCCL 2.24-2.25 take net v8 through their adapter).
NET_VERSIONS = (7, 8, 10, 11, 12)
COLL_VERSIONS = (7, 8, 9, 10, 11, 12)
# The net table NCCL holds next to each CollNet table (the newest net version it knows that the library has).
NET_FOR_COLL = {7: 7, 8: 8, 9: 8, 10: 10, 11: 11, 12: 12}


def has_ctx(v: int) -> bool:
    """v11+: init makes a context, listen takes it, finalize frees it (net and CollNet alike)."""
    return v >= 11


def _fn(*args: Any) -> Any:
    return C.CFUNCTYPE(R, *args)


def _net_fields(v: int) -> list[tuple[str, Any]]:
    props = C.POINTER(PROPS[v])
    reg_size = C.c_int if v == 7 else C.c_size_t
    listen = _fn(P, C.c_int, P, PP) if has_ctx(v) else _fn(C.c_int, P, PP)
    if v <= 8:
        init = _fn(LOGGER)
        connect = _fn(C.c_int, P, PP, PP)
        isend = _fn(P, P, C.c_int, C.c_int, P, PP)
        irecv = _fn(P, C.c_int, PP, C.POINTER(C.c_int), C.POINTER(C.c_int), PP, PP)
    else:
        # v10: init(logger, profiler), connect(dev, config, handle, ...); v11+: a context first.
        init = _fn(PP, C.c_uint64, P, LOGGER, P) if has_ctx(v) else _fn(LOGGER, P)
        connect = _fn(P, C.c_int, P, PP, PP) if has_ctx(v) else _fn(C.c_int, P, P, PP, PP)
        isend = _fn(P, P, C.c_size_t, C.c_int, P, P, PP)
        irecv = _fn(P, C.c_int, PP, C.POINTER(C.c_size_t), C.POINTER(C.c_int), PP, PP, PP)
    fields = [
        ("name", C.c_char_p),
        ("init", init),
        ("devices", _fn(C.POINTER(C.c_int))),
        ("getProperties", _fn(C.c_int, props)),
        ("listen", listen),
        ("connect", connect),
        ("accept", _fn(P, PP, PP)),
        ("regMr", _fn(P, P, reg_size, C.c_int, PP)),
        ("regMrDmaBuf", _fn(P, P, C.c_size_t, C.c_int, C.c_uint64, C.c_int, PP)),
        ("deregMr", _fn(P, P)),
        ("isend", isend),
        ("irecv", irecv),
        ("iflush", P),
        ("test", _fn(P, C.POINTER(C.c_int), C.POINTER(C.c_int))),
        ("closeSend", _fn(P)),
        ("closeRecv", _fn(P)),
        ("closeListen", _fn(P)),
        ("getDeviceMr", P),
        ("irecvConsumed", P),
    ]
    if v > 8:
        fields += [("makeVDevice", P)]
    if has_ctx(v):
        fields += [("finalize", _fn(P)), ("setNetAttr", P)]
    return fields


def _coll_fields(v: int) -> list[tuple[str, Any]]:
    props = C.POINTER(PROPS[v])
    if has_ctx(v):
        init, listen = _fn(PP, C.c_uint64, LOGGER), _fn(P, C.c_int, P, PP)
    else:
        init, listen = _fn(LOGGER), _fn(C.c_int, P, PP)
    iallreduce = _fn(P, P, P, C.c_int if v <= 8 else C.c_size_t, C.c_int, C.c_int, P, P, PP)
    fields = [
        ("name", C.c_char_p),
        ("init", init),
        ("devices", _fn(C.POINTER(C.c_int))),
        ("getProperties", _fn(C.c_int, props)),
        ("listen", listen),
        ("connect", _fn(PP, C.c_int, C.c_int, P, PP)),
        ("reduceSupport", _fn(C.c_int, C.c_int, C.POINTER(C.c_int))),
        ("regMr", _fn(P, P, C.c_int if v == 7 else C.c_size_t, C.c_int, PP)),
        ("regMrDmaBuf", _fn(P, P, C.c_size_t, C.c_int, C.c_uint64, C.c_int, PP)),
        ("deregMr", _fn(P, P)),
        ("iallreduce", iallreduce),
    ]
    if v != 7:  # v7 has no all-gather / reduce-scatter members
        fields += [("iallgather", P), ("ireducescatter", P)]
    fields += [
        ("iflush", _fn(P, P, C.c_int, P, PP)),
        ("test", _fn(P, C.POINTER(C.c_int), C.POINTER(C.c_int))),
        ("closeColl", _fn(P)),
        ("closeListen", _fn(P)),
    ]
    if v > 8:
        fields += [("makeVDevice", P)]
    if has_ctx(v):
        fields += [("finalize", _fn(P))]
    return fields


NET_TABLES = {v: type(f"Net_v{v}", (C.Structure,), {"_fields_": _net_fields(v)}) for v in NET_VERSIONS}
COLL_TABLES = {v: type(f"CollNet_v{v}", (C.Structure,), {"_fields_": _coll_fields(v)}) for v in COLL_VERSIONS}
assert [C.sizeof(NET_TABLES[v]) for v in NET_VERSIONS] == [19 * 8, 19 * 8, 20 * 8, 22 * 8, 22 * 8]
assert [C.sizeof(COLL_TABLES[v]) for v in COLL_VERSIONS] == [15 * 8, 17 * 8, 18 * 8, 18 * 8, 19 * 8, 19 * 8]


def library_path() -> str:
    from reducer.cli.nccl_plugin import plugin_path

    return str(plugin_path())


class Plugin:
    """The dlopened library, with NCCL's logger collecting the plugin's lines."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or library_path()
        self.lib = C.CDLL(self.path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        self.log: list[tuple[int, str]] = []
        self.logger = LOGGER(self._log)

    def _log(self, level: int, flags: int, file: bytes, line: int, fmt: bytes, text: bytes) -> None:
        # The plugin always logs with fmt "%s" and one string argument.
        assert fmt == b"%s", fmt
        self.log.append((level, text.decode(errors="replace")))

    def log_text(self) -> str:
        return "\n".join(t for _, t in self.log)

    def net(self, v: int) -> Any:
        return NET_TABLES[v].in_dll(self.lib, f"ncclNetPlugin_v{v}")

    def coll(self, v: int) -> Any:
        return COLL_TABLES[v].in_dll(self.lib, f"ncclCollNetPlugin_v{v}")

    def close(self) -> None:
        import _ctypes

        _ctypes.dlclose(self.lib._handle)


def loaded(path: str) -> bool:
    """Whether `path` is mapped in this process (after dlclose it must not be)."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return any(real in line for line in f)


def check(rc: int, what: str, plugin: Plugin | None = None) -> None:
    if rc != SUCCESS:
        log = plugin.log_text() if plugin else ""
        raise RuntimeError(f"{what} returned {rc}; plugin log:\n{log}")


# -- rendezvous through files -----------------------------------------------------------------


def publish(dirpath: str, name: str, data: bytes) -> None:
    tmp = Path(dirpath) / f".{name}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, Path(dirpath) / name)


def gather(dirpath: str, names: Sequence[str], timeout: float = 60.0) -> list[bytes]:
    deadline = time.monotonic() + timeout
    while True:
        paths = [Path(dirpath) / n for n in names]
        if all(p.exists() for p in paths):
            return [p.read_bytes() for p in paths]
        if time.monotonic() > deadline:
            raise TimeoutError(f"rendezvous: missing {[n for n, p in zip(names, paths) if not p.exists()]}")
        time.sleep(0.01)


def with_env(env: dict[str, str | None], fn: Callable[[], Any]) -> Any:
    """Run fn with os.environ changed (pool processes are shared between tests)."""
    old = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return fn()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


CLUSTER_VARS = ("CLUSTER_SPEC", "TF_CONFIG", "RS_REDUCERS", "RS_PORT", "RS_JOB_ID", "CLOUD_ML_JOB_ID")


def init_net(plugin: Plugin, v: int) -> Any:
    net = plugin.net(v)
    if v <= 8:
        check(net.init(plugin.logger), "net init", plugin)
    elif not has_ctx(v):
        check(net.init(plugin.logger, None), "net init", plugin)
    else:
        ctx = C.c_void_p()
        check(net.init(C.byref(ctx), 0x1234, None, plugin.logger, None), "net init", plugin)
    return net


def init_coll(plugin: Plugin, v: int, comm_id: int) -> tuple[Any, C.c_void_p]:
    coll = plugin.coll(v)
    ctx = C.c_void_p()
    if not has_ctx(v):
        check(coll.init(plugin.logger), "collnet init", plugin)
    else:
        check(coll.init(C.byref(ctx), comm_id, plugin.logger), "collnet init", plugin)
    return coll, ctx


def listen(plugin: Plugin, table: Any, version: int, ctx: C.c_void_p | None) -> tuple[Any, C.c_void_p]:
    """listen() of a net or CollNet table: (the 128-byte handle buffer, the listen comm)."""
    handle = C.create_string_buffer(HANDLE_BYTES)
    lcomm = C.c_void_p()
    if not has_ctx(version):
        check(table.listen(0, handle, C.byref(lcomm)), "listen", plugin)
    else:
        check(table.listen(ctx, 0, handle, C.byref(lcomm)), "listen", plugin)
    return handle, lcomm


# -- point-to-point ---------------------------------------------------------------------------


def listen_address(handle: Any) -> tuple[int, str, int]:
    """(family, host, port) in a point-to-point listen handle (csrc/nccl_plugin/p2p_net.cc layout)."""
    import socket

    raw = bytes(handle.raw)
    family, port = int.from_bytes(raw[6:8], "little"), int.from_bytes(raw[8:10], "little")
    host = socket.inet_ntop(family, raw[24:28] if family == socket.AF_INET else raw[24:40])
    return family, host, port


def payload(seed: int, size: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def _wait(fn: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.0005)


def p2p_peer(
    rank: int,
    world: int,
    rdv: str,
    version: int,
    sizes: Sequence[int],
    nsocks: int = 2,
    extra: int = 100,
    env: dict[str, str | None] | None = None,
    check_unloaded: Sequence[str] = (),
) -> dict[str, Any]:
    """Two peers (rank 0, 1) each send `sizes` to the other and receive the other's messages.

    Messages go out with up to 32 requests in flight per direction (the slot ring: the 33rd
    isend must come back NULL); receive buffers are `extra` bytes larger than the message
    (test() must report the real size). Every received byte is compared. `env`: more variables
    (None unsets); check_unloaded: libraries that must be unmapped after the plugin's dlclose
    (result "unloaded_others").
    """
    variables: dict[str, str | None] = {
        "RS_NCCL_NSOCKS": str(nsocks),
        "RS_NCCL_SOCKET_IFNAME": "lo",
        "RS_NCCL_P2P_PLUGIN": None,
    }
    variables.update(env or {})
    result = with_env(variables, lambda: _p2p_peer(rank, rdv, version, sizes, extra))
    result["unloaded_others"] = [not loaded(p) for p in check_unloaded]
    return result


def _p2p_peer(rank: int, rdv: str, version: int, sizes: Sequence[int], extra: int) -> dict[str, Any]:
    tasks_before = len(os.listdir("/proc/self/task"))
    plugin = Plugin()
    try:
        net = init_net(plugin, version)
    except BaseException:
        # Unload it: a pool process keeps its state otherwise, and the next test's Plugin() would
        # get the same, already initialized library back (its RS_* settings read once).
        plugin.close()
        raise
    ndev = C.c_int()
    check(net.devices(C.byref(ndev)), "devices", plugin)
    props = PROPS[version]()
    check(net.getProperties(0, C.byref(props)), "getProperties", plugin)
    handle, lcomm = listen(plugin, net, version, None)
    listen_magic = bytes(handle.raw[:4])
    publish(rdv, f"p2p.{rank}", handle.raw)
    (other,) = gather(rdv, [f"p2p.{1 - rank}"])
    peer_handle = C.create_string_buffer(other, HANDLE_BYTES)
    scomm, rcomm = C.c_void_p(), C.c_void_p()
    calls = {"connect": 0, "accept": 0}

    def step() -> bool:
        if not scomm.value:
            calls["connect"] += 1
            if version <= 8:
                check(net.connect(0, peer_handle, C.byref(scomm), None), "connect", plugin)
            elif not has_ctx(version):
                check(net.connect(0, None, peer_handle, C.byref(scomm), None), "connect", plugin)
            else:
                check(net.connect(None, 0, peer_handle, C.byref(scomm), None), "connect", plugin)
        if not rcomm.value:
            calls["accept"] += 1
            check(net.accept(lcomm, C.byref(rcomm), None), "accept", plugin)
        return bool(scomm.value and rcomm.value)

    _wait(step, "connect/accept")
    check(net.closeListen(lcomm), "closeListen", plugin)
    threads_added = len(os.listdir("/proc/self/task")) - tasks_before  # the two comms' progress threads

    total = sum(sizes) + extra * len(sizes)
    region = np.zeros(max(total, 1), dtype=np.uint8)
    mh = C.c_void_p()
    check(net.regMr(rcomm, region.ctypes.data, region.nbytes, PTR_HOST, C.byref(mh)), "regMr", plugin)
    bad = C.c_void_p()
    cuda_rc = net.regMr(rcomm, region.ctypes.data, region.nbytes, PTR_CUDA, C.byref(bad))

    outgoing = [payload(1000 * rank + i, s) for i, s in enumerate(sizes)]
    offsets = np.concatenate([[0], np.cumsum([s + extra for s in sizes])])[:-1].astype(int)
    send_reqs: list[tuple[int, C.c_void_p]] = []
    recv_reqs: list[tuple[int, C.c_void_p]] = []
    next_recv = 0
    got_sizes: dict[int, int] = {}
    done_flag, size_out = C.c_int(), C.c_int()

    def post_send(i: int) -> C.c_void_p | None:
        req = C.c_void_p()
        buf = outgoing[i]
        if version <= 8:
            rc = net.isend(scomm, buf.ctypes.data, int(buf.nbytes), 7, None, C.byref(req))
        else:
            rc = net.isend(scomm, buf.ctypes.data, int(buf.nbytes), 7, None, None, C.byref(req))
        check(rc, "isend", plugin)
        return req if req.value else None

    def post_recv(i: int) -> C.c_void_p | None:
        req = C.c_void_p()
        data = (C.c_void_p * 1)(region.ctypes.data + int(offsets[i]))
        tags = (C.c_int * 1)(7)
        if version <= 8:
            sz = (C.c_int * 1)(sizes[i] + extra)
            rc = net.irecv(rcomm, 1, data, sz, tags, None, C.byref(req))
        else:
            szs = (C.c_size_t * 1)(sizes[i] + extra)
            rc = net.irecv(rcomm, 1, data, szs, tags, None, None, C.byref(req))
        check(rc, "irecv", plugin)
        return req if req.value else None

    def post_until(
        post: Callable[[int], C.c_void_p | None], reqs: list[tuple[int, C.c_void_p]], nxt: int, limit: int
    ) -> tuple[int, bool]:
        """Post messages nxt, nxt + 1, ... while fewer than `limit` are outstanding; (next, got a NULL)."""
        while nxt < len(sizes) and len(reqs) < limit:
            req = post(nxt)
            if req is None:
                return nxt, True
            reqs.append((nxt, req))
            nxt += 1
        return nxt, False

    # Fill the send ring without testing anything: the 33rd request must be refused (NULL).
    next_send, refused = post_until(post_send, send_reqs, 0, 33)
    ring_full_null = len(send_reqs) == 32 and refused
    deadline = time.monotonic() + 120
    while send_reqs or recv_reqs or next_send < len(sizes) or next_recv < len(sizes):
        if time.monotonic() > deadline:
            raise TimeoutError(f"p2p stuck: sent {next_send}, received {next_recv}")
        next_recv, _ = post_until(post_recv, recv_reqs, next_recv, 32)
        next_send, _ = post_until(post_send, send_reqs, next_send, 32)
        for reqs in (send_reqs, recv_reqs):
            if reqs:
                i, req = reqs[0]  # NCCL's proxy tests its oldest request
                check(net.test(req, C.byref(done_flag), C.byref(size_out)), "test", plugin)
                if done_flag.value:
                    reqs.pop(0)
                    if reqs is recv_reqs:
                        got_sizes[i] = size_out.value
    # Compare every received message with what the peer sent.
    mismatched = []
    for i, s in enumerate(sizes):
        expect = payload(1000 * (1 - rank) + i, s)
        got = region[offsets[i] : offsets[i] + s]
        if got_sizes.get(i) != s or not np.array_equal(got, expect):
            mismatched.append(i)
    check(net.deregMr(rcomm, mh), "deregMr", plugin)
    check(net.closeSend(scomm), "closeSend", plugin)
    check(net.closeRecv(rcomm), "closeRecv", plugin)
    if has_ctx(version):
        check(net.finalize(None), "finalize", plugin)
    name = props.name.decode() if props.name else ""
    result = {
        "ndev": ndev.value,
        "name": name,
        "ptrSupport": props.ptrSupport,
        "maxRecvs": props.maxRecvs,
        "speed": props.speed,
        "mismatched": mismatched,
        "ring_full_null": ring_full_null,
        "cuda_rc": cuda_rc,
        "connect_calls": calls["connect"],
        "log": plugin.log_text(),
        "maxP2pBytes": getattr(props, "maxP2pBytes", None),
        "listen_magic": listen_magic,
        "threads_added": threads_added,
    }
    path = plugin.path
    plugin.close()
    result["unloaded"] = not loaded(path)
    return result


# -- CollNet ----------------------------------------------------------------------------------


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def head_input(seed: int, head: int, call: int, dtype: str, count: int, exact: bool) -> np.ndarray:
    rng = np.random.default_rng([seed, head, call])
    if exact or dtype.startswith("int"):
        # small integers: every sum of a few heads is exact in every dtype
        return rng.integers(-8, 9, count).astype(np_dtype(dtype))
    return rng.standard_normal(count).astype(np_dtype(dtype))


def reference(seed: int, heads: int, call: int, dtype: str, op: str, count: int, exact: bool) -> np.ndarray:
    xs = np.stack([head_input(seed, h, call, dtype, count, exact).astype(np.float64) for h in range(heads)])
    out = {"sum": xs.sum(axis=0), "max": xs.max(axis=0), "min": xs.min(axis=0)}[op]
    return out


def collnet_head(
    rank: int,
    world: int,
    rdv: str,
    version: int,
    reducers: str,
    calls: Sequence[tuple[int, int, int]],
    seed: int = 1,
    comm_id: int = 77,
    timeout: float = 10.0,
    stream_until_error: float = 0.0,
    extra_env: dict[str, str] | None = None,
    count_skew: int = 0,
    delay: float = 0.0,
    stall: tuple[int, float] | None = None,
    abandon: int = 0,
) -> dict[str, Any]:
    """One head: NCCL's CollNet calls from init to finalize + dlclose, `calls` = (dtype, op, count).

    Calls are issued with many outstanding (polling the oldest with test(), retrying NULL
    requests) and every result is compared with a float64 reference computed from all heads'
    inputs (exact for integers and for the small-integer passes). stream_until_error > 0 keeps
    issuing calls until test() fails (at most that many seconds); count_skew makes head r send
    r * count_skew more elements (a mismatch every head must see as an error).

    delay > 0: before a call, the head pauses now and then (1 call in 20) for a random time up to
    `delay` seconds, its own random sequence: the other heads run ahead with many calls
    outstanding. stall = (call index, seconds): the head stops calling the plugin at all for that
    long once it has issued that call (a peer that stalls). Every test() call is timed
    (test_max_s, test_p50_s): the plugin must never block NCCL's proxy thread. abandon > 0: once that many
    calls are issued the head closes the communicator with them outstanding (close_s: how long
    closeColl + finalize + dlclose took).
    """
    calls = [(t, o, c + rank * count_skew) for t, o, c in calls]
    env: dict[str, str | None] = {k: None for k in CLUSTER_VARS}
    env.update(
        {
            "RS_REDUCERS": reducers,
            "RS_TIMEOUT": str(timeout),
            "RS_CONNECT_TIMEOUT": "30",
            "RS_NCCL_SOCKET_IFNAME": "lo",
            "RS_JOB_ID": f"nccl-test-{seed}",
        }
    )
    env.update(extra_env or {})
    return with_env(
        env,
        lambda: _collnet_head(
            rank, world, rdv, version, calls, seed, comm_id, stream_until_error, delay, stall, abandon
        ),
    )


class CallTimes:
    """Wall-clock durations of calls into the plugin (test() must never block NCCL's proxy thread)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.gaps: list[float] = []  # from the end of one call to the start of the next
        self._end = 0.0

    def time(self, fn: Callable[[], int]) -> int:
        t0 = time.perf_counter()
        if self._end:
            self.gaps.append(t0 - self._end)
        rc = fn()
        self._end = time.perf_counter()
        self.samples.append(self._end - t0)
        return rc

    def summary(self, name: str) -> dict[str, float]:
        xs, gaps = self.samples or [0.0], self.gaps or [0.0]
        return {
            f"{name}_max_s": float(max(xs)),
            f"{name}_p50_s": float(np.median(xs)),
            f"{name}_calls": len(self.samples),
            f"{name}_gap_p50_s": float(np.median(gaps)),
            f"{name}_gap_p99_s": float(np.percentile(gaps, 99)),
        }


SLOT_BYTES = 256 << 10
NSLOTS = 80  # more than the plugin's 64 rounds in flight: the harness sees NULL requests


def collnet_connect(
    plugin: Plugin, version: int, rank: int, heads: int, rdv: str, comm_id: int
) -> tuple[Any, C.c_void_p, C.c_void_p, dict[str, Any]]:
    """NCCL's CollNet set-up on one head: init (after the net), devices, properties, reduceSupport
    table, listen, handle exchange through `rdv`, connect. (table, ctx, collComm, facts); the
    collComm is NULL if connect failed (facts["connect_rc"])."""
    init_net(plugin, NET_FOR_COLL[version])  # NCCL loads the point-to-point net first
    coll, ctx = init_coll(plugin, version, comm_id)
    ndev = C.c_int()
    check(coll.devices(C.byref(ndev)), "collnet devices", plugin)
    props = PROPS[version]()
    check(coll.getProperties(0, C.byref(props)), "collnet getProperties", plugin)
    support = {}
    flag = C.c_int()
    for t in range(12):
        for o in range(5):
            check(coll.reduceSupport(t, o, C.byref(flag)), "reduceSupport", plugin)
            support[(t, o)] = flag.value
    handle, lcomm = listen(plugin, coll, version, ctx)
    publish(rdv, f"coll.{rank}", handle.raw)
    raw = gather(rdv, [f"coll.{h}" for h in range(heads)])
    bufs = [C.create_string_buffer(b, HANDLE_BYTES) for b in raw]
    handles = (C.c_void_p * heads)(*[C.addressof(b) for b in bufs])
    ccomm = C.c_void_p()
    rc = coll.connect(handles, heads, rank, lcomm, C.byref(ccomm))
    facts: dict[str, Any] = {
        "ndev": ndev.value,
        "support": support,
        "ptrSupport": props.ptrSupport,
        "maxCollBytes": getattr(props, "maxCollBytes", None),
        "connect_rc": rc,
    }
    check(coll.closeListen(lcomm), "collnet closeListen", plugin)
    return coll, ctx, ccomm, facts


def collnet_close(
    plugin: Plugin, version: int, coll: Any, ctx: C.c_void_p, ccomm: C.c_void_p, mhs: Sequence[C.c_void_p]
) -> dict[str, Any]:
    """deregMr (if mhs), closeColl, finalize, dlclose: {"log", "unloaded"}."""
    for mh in mhs:
        check(coll.deregMr(ccomm, mh), "deregMr", plugin)
    check(coll.closeColl(ccomm), "closeColl", plugin)
    if has_ctx(version):
        check(coll.finalize(ctx), "collnet finalize", plugin)
    out: dict[str, Any] = {"log": plugin.log_text()}
    path = plugin.path
    plugin.close()
    out["unloaded"] = not loaded(path)
    return out


def _collnet_head(
    rank: int,
    heads: int,
    rdv: str,
    version: int,
    calls: Sequence[tuple[int, int, int]],
    seed: int,
    comm_id: int,
    stream_until_error: float,
    delay: float,
    stall: tuple[int, float] | None,
    abandon: int = 0,
) -> dict[str, Any]:
    plugin = Plugin()
    coll, ctx, ccomm, result = collnet_connect(plugin, version, rank, heads, rdv, comm_id)
    if result["connect_rc"] != SUCCESS:
        # finalize and unload as after a run: this pool process runs the next test's heads too
        if has_ctx(version):
            check(coll.finalize(ctx), "collnet finalize", plugin)
        result["log"] = plugin.log_text()
        path = plugin.path
        plugin.close()
        result["unloaded"] = not loaded(path)
        return result

    # NCCL's staging region: send half and receive half, registered twice (as per channel).
    region = np.zeros(2 * NSLOTS * SLOT_BYTES, dtype=np.uint8)
    mhs = [C.c_void_p(), C.c_void_p()]
    for mh in mhs:
        check(coll.regMr(ccomm, region.ctypes.data, region.nbytes, PTR_HOST, C.byref(mh)), "regMr", plugin)
    recv_base = NSLOTS * SLOT_BYTES

    def issue(i: int, slot: int, t: int, o: int, count: int, exact: bool) -> C.c_void_p:
        x = head_input(seed, rank, i, SUPPORTED_DTYPES[t], count, exact)
        send = region[slot * SLOT_BYTES : slot * SLOT_BYTES + x.nbytes]
        send[:] = x.view(np.uint8)
        req = C.c_void_p()
        rc = coll.iallreduce(
            ccomm,
            region.ctypes.data + slot * SLOT_BYTES,
            region.ctypes.data + recv_base + slot * SLOT_BYTES,
            count,
            t,
            o,
            mhs[0],
            mhs[1],
            C.byref(req),
        )
        if rc != SUCCESS:
            raise RuntimeError(f"iallreduce rc {rc}\n{plugin.log_text()}")
        return req

    outstanding: list[tuple[int, int, C.c_void_p]] = []  # (call index, slot, request)
    free_slots = list(range(NSLOTS))
    nulls = 0
    mismatches: list[tuple[int, str, str, float]] = []
    done_flag, size_out = C.c_int(), C.c_int()
    error_rc = SUCCESS
    error_at = 0.0
    i = 0
    n_done = 0
    deadline = time.monotonic() + max(120.0, stream_until_error)
    rng = np.random.default_rng([seed, rank, 999])
    # NCCL keeps up to 64 requests per collComm: issue 64 without testing any, then one more,
    # which the plugin must refuse with a NULL request (NCCL retries it later).
    ring_full_null = None
    max_outstanding = 0
    test_times = CallTimes()
    test_pending = 0
    stalled_at = 0.0
    pause_rng = np.random.default_rng([seed, rank, 4242])
    if len(calls) > 64 and not stream_until_error and not delay and not stall:
        for _ in range(64):
            t, o, count = calls[i]
            req = issue(i, free_slots[0], t, o, count, True)
            assert req.value, "iallreduce refused a request below 64 in flight"
            outstanding.append((i, free_slots.pop(0), req))
            i += 1
        t, o, count = calls[i]
        ring_full_null = not issue(i, free_slots[0], t, o, count, True).value
    while True:
        streaming = stream_until_error > 0
        more = i < len(calls) or streaming
        if (not more and not outstanding) or (abandon and i >= abandon):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"collnet head {rank}: no end after {i} calls ({len(outstanding)} outstanding)")
        progressed = False
        if stall and i == stall[0] + 1 and not stalled_at:
            stalled_at = time.time()
            time.sleep(stall[1])
        if more and free_slots and delay and pause_rng.random() < 0.05:
            time.sleep(float(pause_rng.uniform(0, delay)))
        if more and free_slots:
            t, o, count = calls[i % len(calls)]
            exact = (i // max(1, len(calls))) % 2 == 0 or SUPPORTED_DTYPES[t].startswith("int")
            slot = free_slots[0]
            req = issue(i, slot, t, o, count, exact)
            if req.value:
                free_slots.pop(0)
                outstanding.append((i, slot, req))
                max_outstanding = max(max_outstanding, len(outstanding))
                i += 1
                progressed = True
            else:
                nulls += 1
        if outstanding:
            ci, slot, req = outstanding[0]
            rc = test_times.time(lambda: coll.test(req, C.byref(done_flag), C.byref(size_out)))
            test_pending += rc == SUCCESS and not done_flag.value
            if rc != SUCCESS:
                error_rc, error_at = rc, time.time()
                break
            if done_flag.value:
                outstanding.pop(0)
                t, o, count = calls[ci % len(calls)]
                exact = (ci // max(1, len(calls))) % 2 == 0 or SUPPORTED_DTYPES[t].startswith("int")
                name = SUPPORTED_DTYPES[t]
                dt = np_dtype(name)
                off = recv_base + slot * SLOT_BYTES
                got = region[off : off + count * dt.itemsize].view(dt).astype(np.float64)
                ref = reference(seed, heads, ci, name, SUPPORTED_OPS[o], count, exact)
                ok = _close(got, ref, name, exact, heads)
                if not ok:
                    mismatches.append((ci, name, SUPPORTED_OPS[o], float(np.max(np.abs(got - ref)))))
                free_slots.append(slot)
                n_done += 1
                progressed = True
        if not progressed:
            time.sleep(float(rng.uniform(0, 0.0005)))
    result.update(
        {
            "calls_done": n_done,
            "nulls": nulls,
            "ring_full_null": ring_full_null,
            "mismatches": mismatches,
            "error_rc": error_rc,
            "error_at": error_at,
            "max_outstanding": max_outstanding,
            "test_pending": test_pending,
            "stalled_at": stalled_at,
            **test_times.summary("test"),
        }
    )
    t_close = time.monotonic()
    result.update(collnet_close(plugin, version, coll, ctx, ccomm, mhs if error_rc == SUCCESS else []))
    result["close_s"] = time.monotonic() - t_close
    result["outstanding_at_close"] = len(outstanding)
    return result


def _close(got: np.ndarray, ref: np.ndarray, dtype: str, exact: bool, heads: int) -> bool:
    if exact or dtype.startswith("int"):
        return bool(np.array_equal(got, ref))
    # Random floats: the reducers accumulate float16/bfloat16 in float32 and round once.
    tol = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    return bool(np.all(np.abs(got - ref) <= tol * (1 + np.abs(ref)) * heads))


def collnet_two_comms(
    rank: int, world: int, rdv: str, reducers: str, calls: Sequence[tuple[int, int, int]], delay: float = 0.0
) -> dict[str, Any]:
    """Ranks 0-1 and 2-3 are two communicators (two heads each) of the same job on the same reducers."""
    comm = rank // 2
    sub = os.path.join(rdv, f"comm{comm}")
    os.makedirs(sub, exist_ok=True)
    return collnet_head(
        rank % 2,
        2,
        sub,
        12,
        reducers,
        calls,
        seed=10 + comm,
        comm_id=1000 + comm,
        extra_env={"RS_JOB_ID": "one-job"},
        delay=delay,
    )


# -- streaming (benchmarks/bench_nccl_plugin.py) ----------------------------------------------

STREAM_SLOTS = 64  # NCCL's requests per collComm: one staging slot each


def collnet_stream(
    rank: int,
    world: int,
    rdv: str,
    reducers: str,
    total_bytes: int,
    call_bytes: int,
    passes: int,
    comm_id: int = 91,
    timeout: float = 60.0,
    ifname: str = "lo",
    idle_sleep: float = 2e-4,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`passes` all-reduces of `total_bytes` (float32 sums), each a stream of `call_bytes`
    iallreduce calls the way NCCL's proxy issues them (up to 64 outstanding, the oldest polled
    with test(), NULL requests retried; `idle_sleep` seconds of pause when nothing moved, 0: a
    sched_yield as NCCL's proxy thread does). Passes
    are drained one by one; "times" has each pass's seconds on this head, from its first call to
    its last result. Every result is compared exactly with the sum of all heads' inputs (small
    integers, per staging slot)."""
    env: dict[str, str | None] = {k: None for k in CLUSTER_VARS}
    env.update(
        {
            "RS_REDUCERS": reducers,
            "RS_TIMEOUT": str(timeout),
            "RS_CONNECT_TIMEOUT": "120",
            "RS_NCCL_SOCKET_IFNAME": ifname,
            "RS_JOB_ID": "nccl-stream",
        }
    )
    env.update(extra_env or {})
    return with_env(
        env, lambda: _collnet_stream(rank, world, rdv, total_bytes, call_bytes, passes, comm_id, idle_sleep)
    )


def _stream_input(head: int, slot: int, count: int) -> np.ndarray:
    return ((np.arange(count) + 7 * slot) % 17 - 8 + head).astype(np.float32)


def _collnet_stream(
    rank: int, heads: int, rdv: str, total_bytes: int, call_bytes: int, passes: int, comm_id: int, idle_sleep: float
) -> dict[str, Any]:
    if call_bytes % 4 or total_bytes % call_bytes:
        raise ValueError("call_bytes must be a multiple of 4 and divide total_bytes")
    plugin = Plugin()
    coll, ctx, ccomm, result = collnet_connect(plugin, 12, rank, heads, rdv, comm_id)
    check(result["connect_rc"], "collnet connect", plugin)
    count, ncalls = call_bytes // 4, total_bytes // call_bytes
    nslots = min(STREAM_SLOTS, ncalls)
    send = np.stack([_stream_input(rank, s, count) for s in range(nslots)])
    recv = np.zeros_like(send)
    expect = np.stack([sum(_stream_input(h, s, count) for h in range(heads)) for s in range(nslots)])
    mhs = [C.c_void_p(), C.c_void_p()]
    for mh, arr in zip(mhs, (send, recv)):
        check(coll.regMr(ccomm, arr.ctypes.data, arr.nbytes, PTR_HOST, C.byref(mh)), "regMr", plugin)
    done_flag, size_out = C.c_int(), C.c_int()
    times: list[float] = []
    wrong = nulls = 0
    test_times = CallTimes()
    cpu0 = time.process_time()
    for _ in range(passes):
        outstanding: list[tuple[int, C.c_void_p]] = []
        issued = finished = 0
        t0 = time.perf_counter()
        while finished < ncalls:
            moved = False
            while issued < ncalls and len(outstanding) < nslots:
                slot = issued % nslots  # in-order completion: this slot's previous call is done
                req = C.c_void_p()
                check(
                    coll.iallreduce(
                        ccomm, send[slot].ctypes.data, recv[slot].ctypes.data, count, 7, 0, mhs[0], mhs[1], C.byref(req)
                    ),
                    "iallreduce",
                    plugin,
                )
                if not req.value:
                    nulls += 1
                    break
                outstanding.append((slot, req))
                issued += 1
                moved = True
            while outstanding:
                slot, req = outstanding[0]
                check(test_times.time(lambda: coll.test(req, C.byref(done_flag), C.byref(size_out))), "test", plugin)
                if not done_flag.value:
                    break
                wrong += int(np.count_nonzero(recv[slot] != expect[slot]))
                outstanding.pop(0)
                finished += 1
                moved = True
            if not moved:
                if idle_sleep > 0:
                    time.sleep(idle_sleep)
                else:
                    os.sched_yield()  # NCCL's proxy thread, idle, yields and polls again
        times.append(time.perf_counter() - t0)
    result.update(
        {
            "times": times,
            "wrong": wrong,
            "nulls": nulls,
            "calls": ncalls,
            "cpu_s": time.process_time() - cpu0,
            **test_times.summary("test"),
        }
    )
    result.update(collnet_close(plugin, 12, coll, ctx, ccomm, mhs))
    result.pop("support", None)
    return result
