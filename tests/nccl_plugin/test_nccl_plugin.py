"""The NCCL plugin library, driven the way NCCL drives it (tests/nccl_harness.py plays NCCL).

No GPU and no NCCL: the harness dlopens the library, calls the exported v8/v11/v12 tables with
host buffers, exchanges listen handles between head processes and checks every byte / every
reduced element against a reference.
"""

from __future__ import annotations

import ctypes as C
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

import nccl_harness as H
import numpy as np
import pytest
from conftest import addresses, run_ranks
from paths import ROOT, TESTS

NET_VERSIONS = H.NET_VERSIONS  # 7, 8, 10, 11, 12
COLL_VERSIONS = H.COLL_VERSIONS  # 7, 8, 9, 10, 11, 12
MIB = 1 << 20

# test() runs on NCCL's proxy thread and must never block: every call is timed (a liveness check,
# not a performance claim). The blocking paths this guards against take seconds: a reconnect
# (waits for the whole group), a wait for a stalled peer (the stall below lasts 3 s), RS_TIMEOUT.
# The bound on the slowest call sits well above what the scheduler alone adds on this shared
# 2-core machine (up to ~220 ms seen at load average 8); the median catches a call that waits a
# little every time.
LIVENESS_MAX_S = 1.0
LIVENESS_P50_S = 0.005


def assert_live(r: dict[str, Any]) -> None:
    assert r["test_max_s"] < LIVENESS_MAX_S and r["test_p50_s"] < LIVENESS_P50_S, (r["test_max_s"], r["test_p50_s"])


def assert_all_correct(r: dict[str, Any], ncalls: int) -> None:
    """A head connected, finished every call with the reference result, and test() never blocked."""
    assert r["connect_rc"] == H.SUCCESS, r.get("log")
    assert r["calls_done"] == ncalls and r["mismatches"] == [], r["mismatches"][:5]
    assert_live(r)


@pytest.fixture
def plugin_env(monkeypatch):
    """A clean cluster environment for in-process plugin calls."""
    for k in H.CLUSTER_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RS_NCCL_SOCKET_IFNAME", "lo")
    return monkeypatch


def test_library_exports_only_nccl_symbols_and_links_no_cuda():
    path = H.library_path()
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf not installed")
    syms = subprocess.run([readelf, "--dyn-syms", "-W", path], capture_output=True, text=True, check=True).stdout
    exported = sorted(
        line.split()[-1]
        for line in syms.splitlines()
        if " GLOBAL " in line and " UND " not in line and "DEFAULT" in line
    )
    assert exported == sorted(
        [f"ncclNetPlugin_v{v}" for v in NET_VERSIONS] + [f"ncclCollNetPlugin_v{v}" for v in COLL_VERSIONS]
    )
    needed = subprocess.run([readelf, "-d", path], capture_output=True, text=True, check=True).stdout
    assert "NEEDED" in needed
    for lib in ("cuda", "nccl", "python"):
        assert lib not in needed.lower(), needed


@pytest.mark.parametrize("version", NET_VERSIONS)
def test_net_properties_and_registration(plugin_env, version):
    plugin = H.Plugin()
    net = H.init_net(plugin, version)
    assert net.name == b"reduction-server"
    ndev = C.c_int(-1)
    assert net.devices(C.byref(ndev)) == H.SUCCESS and ndev.value == 1
    props = H.PROPS[version]()
    assert net.getProperties(0, C.byref(props)) == H.SUCCESS
    assert props.name == b"lo" and props.ptrSupport == H.PTR_HOST and props.maxRecvs == 1
    assert props.speed > 0 and props.maxComms > 0 and props.netDeviceType == 0
    if version > 8:
        assert props.vNdevs == 1 and props.maxP2pBytes == 1 << 30 and 0 < props.maxCollBytes <= 1 << 40
    if version == 12:
        assert props.railId == -1 and props.planeId == -1
    assert net.getProperties(1, C.byref(props)) != H.SUCCESS  # one device only
    buf = np.zeros(4096, dtype=np.uint8)
    mh = C.c_void_p()
    assert net.regMr(None, buf.ctypes.data, buf.nbytes, H.PTR_HOST, C.byref(mh)) == H.SUCCESS and mh.value
    assert net.deregMr(None, mh) == H.SUCCESS
    bad = C.c_void_p()
    assert net.regMr(None, buf.ctypes.data, buf.nbytes, H.PTR_CUDA, C.byref(bad)) != H.SUCCESS
    assert "cannot register CUDA memory" in plugin.log_text()
    plugin.close()


def test_interface_setting_that_matches_nothing_is_an_error_not_a_crash(plugin_env):
    plugin_env.setenv("RS_NCCL_SOCKET_IFNAME", "=no-such-if0")
    # A fresh process: the interface is chosen once per load of the library.
    code = (
        "import ctypes as C, nccl_harness as H\n"
        "p = H.Plugin(); net = p.net(12); ctx = C.c_void_p()\n"
        "rc = net.init(C.byref(ctx), 1, None, p.logger, None)\n"
        "print(rc); print(p.log_text())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=TESTS,
        env=dict(os.environ),
    ).stdout
    rc, log = out.split("\n", 1)
    assert int(rc) != H.SUCCESS
    assert "RS_NCCL_SOCKET_IFNAME='=no-such-if0' matches no usable interface" in log


@pytest.mark.parametrize("version", COLL_VERSIONS)
def test_collnet_reduce_support_and_properties(plugin_env, version):
    plugin_env.setenv("RS_REDUCERS", "127.0.0.1:7001,127.0.0.1:7002")
    plugin = H.Plugin()
    H.init_net(plugin, H.NET_FOR_COLL[version])
    coll, ctx = H.init_coll(plugin, version, comm_id=5)
    ndev = C.c_int()
    assert coll.devices(C.byref(ndev)) == H.SUCCESS and ndev.value == 1
    props = H.PROPS[version]()
    assert coll.getProperties(0, C.byref(props)) == H.SUCCESS
    assert props.ptrSupport == H.PTR_HOST
    if version > 8:
        assert 0 < props.maxCollBytes <= 1 << 40
    flag = C.c_int()
    for t, tname in H.NCCL_DTYPES.items():
        for o, oname in H.NCCL_OPS.items():
            assert coll.reduceSupport(t, o, C.byref(flag)) == H.SUCCESS
            expected = t in H.SUPPORTED_DTYPES and o in H.SUPPORTED_OPS
            assert flag.value == int(expected), (tname, oname)
    # No NCCL in this process: the loading NCCL's version is unknown. v8-v11 are only ever used as
    # they are (each is the newest of the releases that find it) and carry NULL; v12 assumes an
    # adapter and carries refusals (test_nccl_plugin_versions.py has the per-version choice).
    if version != 7:
        assert bool(coll.iallgather) == bool(coll.ireducescatter) == (version == 12)
    assert "127.0.0.1:7001,127.0.0.1:7002" in plugin.log_text()
    if H.has_ctx(version):
        assert coll.finalize(ctx) == H.SUCCESS
    plugin.close()


def _spec(cluster: dict[str, Any], **task: Any) -> str:
    return json.dumps({"cluster": cluster, "task": task})


# (environment, what the answer says): a reducer list "a,b" for a worker that finds its reducers,
# else the text both entry points' errors contain (None: no cluster configured at all).
DISCOVERY_CASES = [
    ({}, None),
    ({"CLUSTER_SPEC": "{not json"}, "CLUSTER_SPEC is not valid JSON"),
    (
        {"CLUSTER_SPEC": _spec({"workerpool0": ["w0:2222"]}, type="workerpool0", index=0)},
        "CLUSTER_SPEC has no workerpool2 (reducers): found pools workerpool0; add a reduction-server pool",
    ),
    (
        {
            "CLUSTER_SPEC": _spec(
                {"workerpool0": ["w0:2222"], "workerpool2": ["r0:2222", "r1:2222"]}, type="workerpool0", index=0
            ),
            "RS_PORT": "4000",
        },
        "r0:4000,r1:4000",
    ),
    ({"TF_CONFIG": _spec({"chief": ["c:1"], "ps": ["[::1]:2222"]}, type="chief")}, "[::1]:2222"),
    # Until the plugin shared the library's reader, it read only the pool and took this one.
    ({"TF_CONFIG": json.dumps({"cluster": {"ps": ["no-port"]}})}, "TF_CONFIG has no 'task' key: found keys cluster"),
    ({"TF_CONFIG": _spec({"chief": ["c:1"], "ps": ["no-port"]}, type="chief")}, "TF_CONFIG: bad reducer address: "),
    ({"RS_REDUCERS": "a:1,a:1"}, "RS_REDUCERS: reducer address 'a:1' is listed twice"),
    # One address parser (csrc/net/address.cc) for both: the same refusal, word for word.
    (
        {"RS_REDUCERS": "r0:2222,fd00::7:2222"},
        "RS_REDUCERS: bad reducer address: address 'fd00::7:2222' looks like an unbracketed IPv6 address",
    ),
    (
        {"CLUSTER_SPEC": _spec({"workerpool0": ["w:1"], "workerpool2": ["r0:70000"]}, type="workerpool0")},
        "CLUSTER_SPEC: bad reducer address: address 'r0:70000': port 70000 is out of range 1-65535",
    ),
    ({"RS_REDUCERS": "r0:22 22"}, "RS_REDUCERS: bad reducer address: address 'r0:22 22' contains whitespace"),
    ({"RS_REDUCERS": "127.0.0.1:7001,[::1]:7002", "RS_JOB_ID": "j7"}, "127.0.0.1:7001,[::1]:7002"),
    ({"RS_REDUCERS": "127.0.0.1:7001", "RS_JOB_ID": " spaced ", "CLOUD_ML_JOB_ID": "v"}, "127.0.0.1:7001"),
    ({"RS_REDUCERS": "127.0.0.1:7001", "RS_JOB_ID": "  ", "CLOUD_ML_JOB_ID": " v2 "}, "127.0.0.1:7001"),
    (
        {
            "CLUSTER_SPEC": " \t",
            "TF_CONFIG": _spec({"worker": ["w:1"], "ps": ["p:2"]}, type="worker", index="0"),
            "CLOUD_ML_JOB_ID": "vertex-9",
        },
        "p:2",
    ),
    (
        {"TF_CONFIG": _spec({"chief": ["c:1"], "master": ["m:1"], "ps": ["p:2"]}, type="chief")},
        "TF_CONFIG has both a 'chief' and a 'master' pool",
    ),
    (
        {"CLUSTER_SPEC": _spec({"workerpool0": "w:1"}, type="workerpool0")},
        "CLUSTER_SPEC pool 'workerpool0' must be a list of 'host:port' strings, found 'w:1'",
    ),
    (
        {"CLUSTER_SPEC": _spec({"workerpool0": ["w:1"], "workerpool2": ["r:1"]}, type="workerpool9")},
        "CLUSTER_SPEC task type 'workerpool9' is unknown",
    ),
    (
        {"CLUSTER_SPEC": _spec({"workerpool0": ["w:1"], "workerpool2": ["r:1"]}, type="workerpool0", index=3)},
        "CLUSTER_SPEC task index 3 is out of range: pool 'workerpool0' has 1 entry",
    ),
    (
        {"CLUSTER_SPEC": '{"cluster": {"workerpool0": ["w\udcff:1"]}, "task": {}}'},
        "CLUSTER_SPEC is not valid JSON (invalid UTF-8 in a string at offset 31)",
    ),
    ({"CLUSTER_SPEC": "[" * 100}, "CLUSTER_SPEC is not valid JSON (nested too deeply"),
]


def _plugin_discovers(plugin_env, env: dict[str, str]) -> dict[str, Any]:
    """What CollNet init decides from `env`: {"reducers", "source", "job"} or {"error"} (None: no cluster)."""
    for k, v in env.items():
        plugin_env.setenv(k, v)
    plugin = H.Plugin()
    coll = plugin.coll(12)
    ctx = C.c_void_p(0x1)  # init must overwrite it
    rc = coll.init(C.byref(ctx), 1, plugin.logger)
    ndev = C.c_int(-1)
    assert coll.devices(C.byref(ndev)) == H.SUCCESS
    # Without a usable pool, init fails and leaves no context (NCCL then disables CollNet and never
    # finalizes it); devices() gives the same answer.
    assert (rc == H.SUCCESS) == bool(ctx.value) == (ndev.value == 1), (rc, ctx.value, ndev.value)
    log = plugin.log_text()
    found = re.search(r"CollNet: \d+ reducer\(s\) from (\w+): (\S+) \(job ([^)]*)\)", log)
    if rc == H.SUCCESS:
        assert found, log
        assert coll.finalize(ctx) == H.SUCCESS
        answer: dict[str, Any] = {"reducers": found.group(2), "source": found.group(1), "job": found.group(3)}
    else:
        assert "NCCL runs without CollNet" in log
        failed = re.search(r"CollNet disabled: (.*) \(CollNet init fails", log)
        answer = {"error": failed.group(1) if failed else None}
        assert failed or "no reducers configured" in log, log
    assert coll.finalize(None) == H.SUCCESS  # what NCCL 2.28.7+ may pass: harmless
    plugin.close()
    return answer


def _library_discovers(env: dict[str, str]) -> dict[str, Any]:
    """The same question to the worker library (reducer.cluster.discover_worker, one process per node)."""
    from reducer.cluster import discover_worker
    from reducer.errors import ConfigError

    full = {**os.environ, "RS_RANK": "0", "RS_WORLD_SIZE": "1"}  # RS_REDUCERS mode also needs a rank
    try:
        info = discover_worker(full)
    except ConfigError as exc:
        return {"error": None if str(exc).startswith("no cluster found") else str(exc)}
    return {"reducers": ",".join(info.reducers), "source": info.source, "job": info.job_id}


@pytest.mark.sanitize
@pytest.mark.parametrize("env, expect", DISCOVERY_CASES)
def test_collnet_and_reducer_init_discover_the_same_reducers(plugin_env, env, expect):
    """The plugin and the worker library read CLUSTER_SPEC / TF_CONFIG with one implementation
    (csrc/cluster/spec.cc, reducer._core.cluster): the same reducers, source and job id from the
    same environment, and the same message when it is malformed."""
    plugin = _plugin_discovers(plugin_env, env)
    library = _library_discovers(env)
    if expect is None:
        assert plugin == library == {"error": None}
    elif "error" in plugin:
        assert expect in plugin["error"] and "error" in library and expect in library["error"], (plugin, library)
        assert library["error"].startswith(plugin["error"]), (plugin, library)  # the library may add a hint
    else:
        assert plugin == library, (plugin, library)
        assert plugin["reducers"] == expect
        ids = [v.strip() for v in (env.get("RS_JOB_ID", ""), env.get("CLOUD_ML_JOB_ID", "")) if v.strip()]
        assert plugin["job"] == (ids + ["local"])[0]


def test_collnet_heads_with_different_reducers_all_refuse(plugin_env):
    """connect() decides from the handles only, so every head takes the same decision."""
    plugin = H.Plugin()
    handles: list[Any] = []
    listens: list[C.c_void_p] = []
    for reducers in ("127.0.0.1:7001", "127.0.0.1:7002"):
        plugin_env.setenv("RS_REDUCERS", reducers)
        coll, ctx = H.init_coll(plugin, 12, comm_id=9)
        h = C.create_string_buffer(H.HANDLE_BYTES)
        lc = C.c_void_p()
        assert coll.listen(ctx, 0, h, C.byref(lc)) == H.SUCCESS
        handles.append(h)
        listens.append(lc)
    arr = (C.c_void_p * 2)(*[C.addressof(h) for h in handles])
    for rank in range(2):
        cc = C.c_void_p()
        assert coll.connect(arr, 2, rank, listens[rank], C.byref(cc)) != H.SUCCESS and not cc.value
    assert "has a different reducer pool or job id than head 0" in plugin.log_text()
    for lc in listens:
        assert coll.closeListen(lc) == H.SUCCESS
    plugin.close()


P2P_SIZES = [0, 1, 7, 4096, 65535, 65536, 65537, MIB, 3 * MIB + 5, 16 * MIB] + [
    int(s) for s in np.random.default_rng(3).integers(0, 300 << 10, 60)
]


@pytest.mark.parametrize("version, nsocks", [(12, 2), (12, 1), (11, 3), (10, 2), (8, 2), (7, 2)])
def test_p2p_net_between_two_processes(pool, tmp_path, version, nsocks):
    sizes = P2P_SIZES if (version, nsocks) == (12, 2) else P2P_SIZES[:8] + P2P_SIZES[10:50]
    results = run_ranks(pool, H.p2p_peer, 2, rdv=str(tmp_path), version=version, sizes=sizes, nsocks=nsocks)
    for r in results:
        assert r["ndev"] == 1 and r["ptrSupport"] == H.PTR_HOST and r["maxRecvs"] == 1
        assert r["mismatched"] == [], r["log"]
        assert r["ring_full_null"], "the 33rd isend with 32 in flight must return a NULL request"
        assert r["cuda_rc"] != H.SUCCESS
        assert r["unloaded"], "the library stayed mapped after close/finalize + dlclose (a thread left?)"


def _calls(itemsize_limit: int = H.SLOT_BYTES) -> list[tuple]:
    calls = []
    for t, name in H.SUPPORTED_DTYPES.items():
        itemsize = H.np_dtype(name).itemsize
        for o in H.SUPPORTED_OPS:
            for count in (1, 1001, (itemsize_limit // itemsize) - 3):
                calls.append((t, o, count))
    return calls


def test_collnet_every_dtype_and_op_through_reducers(pool, reducers, tmp_path):
    servers = reducers(2)
    calls = _calls()  # 6 dtypes x 3 ops x 3 sizes (up to 256 KiB) = 54 calls, issued twice
    results = run_ranks(
        pool, H.collnet_head, 3, rdv=str(tmp_path), version=12, reducers=",".join(addresses(servers)), calls=calls * 2
    )
    for r in results:
        assert r["connect_rc"] == H.SUCCESS, r.get("log")
        assert r["calls_done"] == len(calls) * 2
        assert r["mismatches"] == [], r["mismatches"][:5]
        assert r["ring_full_null"] is True, "the 65th request with 64 in flight must be NULL"
        assert r["unloaded"]
        assert "CollNet connected: head" in r["log"]
        assert "up to 64 rounds in flight, window 8" in r["log"]  # the plugin's default window
    groups = {
        line.split("group ")[1].split(",")[0]
        for r in results
        for line in r["log"].splitlines()
        if "CollNet connected" in line
    }
    assert len(groups) == 1


@pytest.mark.parametrize("version", [7, 8, 9, 10, 11])
def test_collnet_older_versions(pool, reducers, tmp_path, version):
    servers = reducers(1)
    calls = [(7, 0, 1000), (2, 2, 77), (9, 3, 5000), (8, 0, 32768 - 1)] * 3
    results = run_ranks(
        pool,
        H.collnet_head,
        2,
        rdv=str(tmp_path),
        version=version,
        reducers=",".join(addresses(servers)),
        calls=calls,
        extra_env={"RS_WINDOW": "3"},
    )
    for r in results:
        assert r["connect_rc"] == H.SUCCESS, r.get("log")
        assert r["calls_done"] == len(calls) and r["mismatches"] == []
        assert r["unloaded"]
        assert "window 3" in r["log"]  # RS_WINDOW overrides the plugin's default


def test_collnet_refuses_a_chunk_size_the_protocol_refuses(pool, reducers, tmp_path):
    """RS_CHUNK_BYTES goes through the settings table's chunk-size rule (the protocol's, common/settings.h)."""
    servers = reducers(1)
    results = run_ranks(
        pool,
        H.collnet_head,
        2,
        rdv=str(tmp_path),
        version=12,
        reducers=",".join(addresses(servers)),
        calls=[],
        extra_env={"RS_CHUNK_BYTES": "1001"},
    )
    for r in results:
        assert r["connect_rc"] != H.SUCCESS
        assert "RS_CHUNK_BYTES='1001' is not valid: not a multiple of 8" in r["log"]
        assert r["unloaded"]  # nothing of the failed connect stays behind


@pytest.mark.parametrize("mode", ["on", " Required "])
def test_collnet_with_frame_integrity(pool, reducers, tmp_path, mode):
    # RS_INTEGRITY reaches the plugin's clients: a reducer that requires integrity serves them
    # (without the flag it would refuse every hello with IntegrityMismatch). Read as the Python
    # library reads it: trimmed, any case.
    secret = "plugin-integrity"
    servers = reducers(1, auth_token=secret, integrity="required")
    calls = [(7, 0, 1000), (4, 0, 3001), (9, 3, 40000)] * 2
    results = run_ranks(
        pool,
        H.collnet_head,
        2,
        rdv=str(tmp_path),
        version=12,
        reducers=",".join(addresses(servers)),
        calls=calls,
        extra_env={"RS_AUTH_TOKEN": secret, "RS_INTEGRITY": mode},
    )
    for r in results:
        assert r["connect_rc"] == H.SUCCESS, r.get("log")
        assert r["calls_done"] == len(calls) and r["mismatches"] == []
    assert servers[0].stats()["rejected"] == 0


def test_collnet_two_communicators_of_one_job_never_mix(pool, reducers, tmp_path):
    servers = reducers(2)
    calls = [(7, 0, 20000), (4, 0, 3001), (6, 2, 999), (7, 0, 65536)] * 40
    results = run_ranks(
        pool, H.collnet_two_comms, 4, rdv=str(tmp_path), reducers=",".join(addresses(servers)), calls=calls, delay=0.02
    )
    for r in results:
        assert_all_correct(r, len(calls))
    groups = [
        next(line.split("group ")[1].split(",")[0] for line in r["log"].splitlines() if "CollNet connected" in line)
        for r in results
    ]
    assert groups[0] == groups[1] and groups[2] == groups[3] and groups[0] != groups[2]


def _random_calls(seed: int, n: int, max_bytes: int = H.SLOT_BYTES) -> list[tuple]:
    """n calls of random supported dtype / op and random count (1 element .. max_bytes)."""
    rng = np.random.default_rng(seed)
    dtypes, ops = list(H.SUPPORTED_DTYPES), list(H.SUPPORTED_OPS)
    calls = []
    for _ in range(n):
        t = int(rng.choice(dtypes))
        itemsize = H.np_dtype(H.SUPPORTED_DTYPES[t]).itemsize
        calls.append((t, int(rng.choice(ops)), int(rng.integers(1, max_bytes // itemsize + 1))))
    return calls


def test_collnet_many_calls_outstanding_with_random_delays(pool, reducers, tmp_path):
    """Heads pause at random: the others run ahead with many rounds in flight on the reducers."""
    servers = reducers(3)
    calls = _random_calls(5, 400)
    results = run_ranks(
        pool,
        H.collnet_head,
        3,
        rdv=str(tmp_path),
        version=12,
        reducers=",".join(addresses(servers)),
        calls=calls,
        delay=0.08,
    )
    for r in results:
        assert_all_correct(r, len(calls))
    assert max(r["max_outstanding"] for r in results) >= 32, [r["max_outstanding"] for r in results]


def test_collnet_thousands_of_calls_in_a_row(pool, reducers, tmp_path):
    """3000 small calls then 100 up to 256 KiB. A call under 64 KiB goes to one reducer, rotated by
    round number: each of the 3 reducers serves 1000 of the small rounds (plus some large ones)."""
    servers = reducers(3)
    calls = _random_calls(6, 3000, max_bytes=16 << 10) + _random_calls(7, 100)
    results = run_ranks(
        pool,
        H.collnet_head,
        2,
        rdv=str(tmp_path),
        version=12,
        reducers=",".join(addresses(servers)),
        calls=calls,
        timeout=120.0,
    )
    for r in results:
        assert_all_correct(r, len(calls))
    served = [s.stats()["rounds_completed"] for s in servers]
    assert all(1000 <= n <= 1100 for n in served), served


def test_collnet_test_never_blocks_while_a_peer_stalls(pool, reducers, tmp_path):
    """Head 1 stops calling the plugin for 3 s: head 0's test() keeps returning done=0 at once."""
    servers = reducers(2)
    calls = [(7, 0, 4096), (2, 2, 5000), (8, 0, 30000)] * 50
    futs = [
        pool.submit(
            H.collnet_head,
            rank=r,
            world=2,
            rdv=str(tmp_path),
            version=12,
            reducers=",".join(addresses(servers)),
            calls=calls,
            timeout=30.0,
            stall=(40, 3.0) if r == 1 else None,
        )
        for r in range(2)
    ]
    results = [f.result(timeout=120) for f in futs]
    for r in results:
        assert_all_correct(r, len(calls))
    assert results[1]["stalled_at"] > 0
    # Head 0 polled throughout the stall (the harness polls every 0.5 ms at most when idle).
    assert results[0]["test_pending"] > 300, results[0]["test_pending"]


def test_collnet_peer_stalled_beyond_timeout_fails_every_head(pool, reducers, tmp_path):
    """A head that stops for longer than RS_TIMEOUT: the others get an error from test() within the
    timeout (wall clock, though NCCL's proxy only polls), never a hang; the stalled head finds its
    communicator failed when it comes back."""
    servers = reducers(2)
    timeout = 2.0
    futs = [
        pool.submit(
            H.collnet_head,
            rank=r,
            world=2,
            rdv=str(tmp_path),
            version=12,
            reducers=",".join(addresses(servers)),
            calls=[(7, 0, 60000), (2, 0, 3000)],
            timeout=timeout,
            stream_until_error=60.0,
            stall=(30, 3 * timeout) if r == 1 else None,
        )
        for r in range(2)
    ]
    results = [f.result(timeout=120) for f in futs]
    for r in results:
        assert r["error_rc"] == H.REMOTE_ERROR, r["log"]
        assert r["calls_done"] > 0 and r["mismatches"] == []
        assert_live(r)
        assert r["unloaded"]
    stalled_at = results[1]["stalled_at"]
    assert stalled_at > 0
    assert timeout - 0.5 < results[0]["error_at"] - stalled_at < timeout + 3.0
    assert "made no progress" in results[0]["log"]
    # the client's account of its links: the reducers owe results, and what TCP says of each
    assert re.search(r"got \d+/\d+ results, tcp: unacked \d+ segs", results[0]["log"]), results[0]["log"]


def test_collnet_close_abandons_rounds_in_flight(pool, reducers, tmp_path):
    """closeColl with calls outstanding returns at once (nothing waits for the network), the library
    unloads, and the reducers serve a new communicator afterwards."""
    servers = reducers(2)
    addrs = ",".join(addresses(servers))
    calls = [(7, 0, 65536), (8, 0, 1000)] * 40
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    # Head 1 stops issuing at call 30, head 0 at 50: head 0's last rounds can never finish.
    futs = [
        pool.submit(
            H.collnet_head,
            rank=r,
            world=2,
            rdv=str(tmp_path / "a"),
            version=12,
            reducers=addrs,
            calls=calls,
            timeout=30.0,
            abandon=50 - 20 * r,
        )
        for r in range(2)
    ]
    results = [f.result(timeout=120) for f in futs]
    for r in results:
        assert r["connect_rc"] == H.SUCCESS and r["error_rc"] == H.SUCCESS and r["mismatches"] == []
        assert r["outstanding_at_close"] > 0 and r["unloaded"]
        assert r["close_s"] < 5.0, r["close_s"]  # far below RS_TIMEOUT (30 s): it did not wait
    results = run_ranks(
        pool, H.collnet_head, 2, rdv=str(tmp_path / "b"), version=12, reducers=addrs, calls=calls[:20], comm_id=78
    )
    for r in results:
        assert r["calls_done"] == 20 and r["mismatches"] == []


def test_collnet_stream_driver_of_the_benchmark(pool, reducers, tmp_path):
    """The streaming driver benchmarks/bench_nccl_plugin.py runs (256 KiB calls, 64 outstanding)."""
    servers = reducers(2)
    results = run_ranks(
        pool,
        H.collnet_stream,
        3,
        rdv=str(tmp_path),
        reducers=",".join(addresses(servers)),
        total_bytes=8 * MIB,
        call_bytes=256 << 10,
        passes=2,
    )
    for r in results:
        assert r["connect_rc"] == H.SUCCESS and r["calls"] == 32 and len(r["times"]) == 2
        assert r["wrong"] == 0 and r["unloaded"]
        assert_live(r)


def test_collnet_mismatch_fails_on_every_head(pool, reducers, tmp_path):
    servers = reducers(1)
    results = run_ranks(
        pool,
        H.collnet_head,
        2,
        rdv=str(tmp_path),
        version=12,
        reducers=",".join(addresses(servers)),
        calls=[(7, 0, 1000)] * 4,
        count_skew=8,
    )
    for r in results:
        assert r["connect_rc"] == H.SUCCESS
        assert r["error_rc"] == H.REMOTE_ERROR, r["log"]
        assert "CollNet test" in r["log"]


def test_collnet_reducer_killed_mid_stream_fails_within_timeout(pool, reducers, tmp_path):
    servers = reducers(2)
    timeout = 4.0
    futs = [
        pool.submit(
            H.collnet_head,
            rank=r,
            world=2,
            rdv=str(tmp_path),
            version=12,
            reducers=",".join(addresses(servers)),
            calls=[(7, 0, 60000), (2, 0, 3000)],
            timeout=timeout,
            stream_until_error=60.0,
            extra_env={"RS_FAILOVER": "0"},
        )
        for r in range(2)
    ]
    deadline = time.monotonic() + 60
    while servers[1].stats()["rounds_completed"] < 50:
        assert time.monotonic() < deadline, "the heads never started streaming"
        time.sleep(0.05)
    killed_at = time.time()
    servers[1].stop()
    for f in futs:
        r: dict[str, Any] = f.result(timeout=90)
        assert r["error_rc"] == H.REMOTE_ERROR, r["log"]
        assert r["error_at"] - killed_at < timeout + 5.0
        assert r["calls_done"] > 0
        assert r["unloaded"]


def test_collnet_reducer_stopped_mid_stream_fails_over(pool, reducers, tmp_path):
    """With failover (the default) the heads finish every call on the surviving reducer: no error
    reaches NCCL, and every result is exact."""
    servers = reducers(2)
    calls = [(7, 0, 60000), (2, 0, 3000), (4, 3, 20001)] * 500
    futs = [
        pool.submit(
            H.collnet_head,
            rank=r,
            world=2,
            rdv=str(tmp_path),
            version=12,
            reducers=",".join(addresses(servers)),
            calls=calls,
            timeout=10.0,
        )
        for r in range(2)
    ]
    deadline = time.monotonic() + 60
    while servers[1].stats()["rounds_completed"] < 50:
        assert time.monotonic() < deadline, "the heads never started streaming"
        time.sleep(0.02)
    assert not all(f.done() for f in futs), "the heads finished before the reducer stopped"
    served_before = servers[0].stats()["rounds_completed"]
    servers[1].stop()
    for f in futs:
        r: dict[str, Any] = f.result(timeout=180)
        assert r["error_rc"] == H.SUCCESS, r.get("log") or r
        assert r["calls_done"] == len(calls) and r["mismatches"] == [], r
        assert r["unloaded"]
    assert servers[0].stats()["rounds_completed"] > served_before


def test_cli_prints_path_and_installs(tmp_path, capsys):
    """The printed settings load the library by name (test_nccl_plugin_versions.py runs them
    against every NCCL release's loader)."""
    from reducer.cli.main import main
    from reducer.cli.nccl_plugin import plugin_path

    assert main(["nccl-plugin"]) == 0
    out = capsys.readouterr().out
    assert f'export LD_LIBRARY_PATH="{plugin_path().parent}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"' in out
    assert "export NCCL_NET_PLUGIN=reduction-server" in out and "export NCCL_COLLNET_ENABLE=1" in out
    assert "NCCL_ALGO" not in out
    assert main(["nccl-plugin", "--install", str(tmp_path / "lib"), "--conf"]) == 0
    installed = tmp_path / "lib" / "libnccl-net-reduction-server.so"
    assert installed.read_bytes() == plugin_path().read_bytes()
    assert os.readlink(tmp_path / "lib" / "libnccl-net.so") == "libnccl-net-reduction-server.so"
    captured = capsys.readouterr()
    assert captured.out == "NCCL_NET_PLUGIN=reduction-server\nNCCL_COLLNET_ENABLE=1\n"
    assert "must be on the loader's path" in captured.err
    # NCCL loads the installed copy by its default name too.
    plugin = H.Plugin(str(tmp_path / "lib" / "libnccl-net.so"))
    assert plugin.net(12).name == b"reduction-server"
    plugin.close()


def test_worker_image_installs_and_enables_the_plugin():
    text = (ROOT / "docker" / "worker.Dockerfile").read_text()
    assert "reduction-server nccl-plugin --install /usr/local/lib/reduction-server --conf > /etc/nccl.conf" in text
    assert "ldconfig" in text
