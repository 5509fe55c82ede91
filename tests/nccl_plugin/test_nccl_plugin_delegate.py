"""RS_NCCL_P2P_PLUGIN: the plugin forwards every point-to-point call to another net plugin.

The delegate is a second build of this plugin: a copy of the library with its net name and its
listen-handle magic patched (b"reduction-server" -> b"rs-delegate-copy", b"RSNL" -> b"RSNX"), so
its handles, its table and its log lines are told apart from the primary's: a handle with the
patched magic can only come from the delegate's listen(), and only the delegate's connect()
accepts it. The harness plays NCCL for both ranks; every byte is compared.
"""

from __future__ import annotations

import ctypes as C
import shutil
import subprocess
from pathlib import Path

import nccl_harness as H
import pytest
from conftest import run_ranks

MIB = 1 << 20
SIZES = [0, 1, 4096, 65537, MIB, 3 * MIB + 5] + [7919 * k for k in range(1, 40)]
NAME, DELEGATE_NAME = b"reduction-server\0", b"rs-delegate-copy\0"
MAGIC, DELEGATE_MAGIC = b"RSNL", b"RSNX"


@pytest.fixture(scope="module")
def delegate_lib(tmp_path_factory) -> str:
    data = Path(H.library_path()).read_bytes()
    assert data.count(NAME) == 1, "the net name literal moved: update the patch"
    # The magic is an immediate in listen's and connect's code (twice in a plain build, more under
    # the sanitizers); every copy is replaced: the test below sees listen write the new one.
    assert data.count(MAGIC) >= 2, "the handle magic (written by listen, checked by connect) moved"
    data = data.replace(NAME, DELEGATE_NAME).replace(MAGIC, DELEGATE_MAGIC)
    out = tmp_path_factory.mktemp("delegate") / "libnccl-net-delegate-copy.so"
    out.write_bytes(data)
    return str(out)


@pytest.mark.parametrize("version", H.NET_VERSIONS)
def test_p2p_calls_reach_the_delegate_and_data_arrives_exactly(pool, tmp_path, delegate_lib, version):
    results = run_ranks(
        pool,
        H.p2p_peer,
        2,
        rdv=str(tmp_path),
        version=version,
        sizes=SIZES,
        nsocks=2,
        env={"RS_NCCL_P2P_PLUGIN": delegate_lib},
        check_unloaded=[delegate_lib],
    )
    for r in results:
        log = r["log"]
        assert (
            f"delegated to RS_NCCL_P2P_PLUGIN={delegate_lib} (its net 'rs-delegate-copy', ncclNetPlugin_v{version}"
            in log
        ), log
        assert r["listen_magic"] == DELEGATE_MAGIC, "listen() did not reach the delegate"
        assert r["mismatched"] == [], log
        assert r["ring_full_null"] and r["ndev"] == 1 and r["maxRecvs"] == 1
        # The delegate itself saw RS_NCCL_P2P_PLUGIN naming itself: its own init ran, and refused.
        assert "is this library itself" in log
        assert r["unloaded"] and r["unloaded_others"] == [True], "the delegate stayed mapped after the plugin's dlclose"


def test_without_the_setting_the_builtin_net_serves(pool, tmp_path):
    results = run_ranks(pool, H.p2p_peer, 2, rdv=str(tmp_path), version=12, sizes=SIZES[:8])
    for r in results:
        assert r["listen_magic"] == MAGIC and r["mismatched"] == [] and "delegated" not in r["log"]


def _init_and_props(plugin: H.Plugin, version: int) -> str:
    net = H.init_net(plugin, version)
    ndev = C.c_int()
    H.check(net.devices(C.byref(ndev)), "devices", plugin)
    props = H.PROPS[version]()
    H.check(net.getProperties(0, C.byref(props)), "getProperties", plugin)
    handle, lcomm = H.listen(plugin, net, version, None)
    assert bytes(handle.raw[:4]) == MAGIC  # the built-in net's listen
    H.check(net.closeListen(lcomm), "closeListen", plugin)
    return plugin.log_text()


def _tiny_library(tmp_path: Path, name: str, source: str) -> str:
    """A small shared library compiled from C `source` (a delegate that is not a working plugin)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler: the suite needs gcc")
    src, out = tmp_path / f"{name}.c", tmp_path / f"lib{name}.so"
    src.write_text(source)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True, timeout=120)
    return str(out)


ZERO_TABLE = "void* ncclNetPlugin_v{v}[22];\n"  # a table whose members are all NULL


FAILING_INIT = """
static int fail(void) { return 2; }  /* ncclSystemError from every member */
#define F (void*)fail
void* ncclNetPlugin_v12[22] = {"failing", F, F, F, F, F, F, F, F, F, F, F, F, F, F, F, F, F, F, F, F, F};
"""


@pytest.mark.parametrize("case", ["missing", "no_table", "self", "wrong_version", "null_members", "init_fails"])
def test_a_delegate_that_cannot_serve_warns_and_the_builtin_net_serves(monkeypatch, tmp_path, case):
    for k in H.CLUSTER_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RS_NCCL_SOCKET_IFNAME", "lo")
    version = 12
    has_no = "has no ncclNetPlugin_v12 (NCCL loaded this library's v12 net; the delegate exports "
    if case == "missing":
        path, expect = "/nonexistent/libnccl-net-gib.so", "cannot be loaded"
    elif case == "no_table":
        path, expect = (
            _tiny_library(tmp_path, "notable", "int not_a_plugin(void) { return 1; }\n"),
            has_no + "no net table)",
        )
    elif case == "self":
        path, expect = H.library_path(), "is this library itself"
    elif case == "wrong_version":  # a delegate without the version NCCL asked for
        src = ZERO_TABLE.format(v=11) + ZERO_TABLE.format(v=8)
        path, expect = _tiny_library(tmp_path, "v11v8", src), has_no + "v11 v8)"
    elif case == "null_members":
        path, expect = (
            _tiny_library(tmp_path, "nulls", ZERO_TABLE.format(v=12)),
            "its ncclNetPlugin_v12 lacks a required member",
        )
    else:  # loads, has the table, but its init fails (a vendor plugin on a machine without its NICs)
        path, expect = _tiny_library(tmp_path, "failing", FAILING_INIT), "the delegate's init failed (NCCL error 2)"
    monkeypatch.setenv("RS_NCCL_P2P_PLUGIN", path)
    plugin = H.Plugin()
    try:
        log = _init_and_props(plugin, version)
    finally:
        plugin.close()
    assert expect in log and "uses the built-in TCP net" in log, log
    assert any(level == 2 and expect in text for level, text in plugin.log), "not a WARN"
    assert "delegated" not in log or case == "init_fails"
    assert not H.loaded(H.library_path()), "the plugin stayed mapped"
    if case != "self":
        assert not H.loaded(path), "the refused delegate stayed mapped"


def test_collnet_stays_this_projects_under_delegation(monkeypatch, delegate_lib):
    for k in H.CLUSTER_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RS_NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("RS_NCCL_P2P_PLUGIN", delegate_lib)
    monkeypatch.setenv("RS_REDUCERS", "127.0.0.1:1,127.0.0.1:2")
    plugin = H.Plugin()
    try:
        H.init_net(plugin, 12)
        coll, ctx = H.init_coll(plugin, 12, 99)
        ndev = C.c_int()
        H.check(coll.devices(C.byref(ndev)), "collnet devices", plugin)
        assert ndev.value == 1
        assert coll.name == b"reduction-server"
        handle, lcomm = H.listen(plugin, coll, 12, ctx)
        assert bytes(handle.raw[:4]) != DELEGATE_MAGIC
        H.check(coll.closeListen(lcomm), "collnet closeListen", plugin)
        H.check(coll.finalize(ctx), "collnet finalize", plugin)
        assert "delegated to RS_NCCL_P2P_PLUGIN" in plugin.log_text()
    finally:
        plugin.close()
