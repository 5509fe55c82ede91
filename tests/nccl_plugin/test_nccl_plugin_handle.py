"""The NCCL plugin's CollNet handle codec, as a C++ unit test (tests/cpp/test_collnet_handle.cc):
layout, round trip, and null / short / corrupted handles refused with a Protocol error."""

from __future__ import annotations

import ctypes as C

import nccl_harness as H
import pytest
from cpp_build import build_and_run

SOURCES = ["tests/cpp/test_collnet_handle.cc", "csrc/nccl_plugin/collnet_handle.cc"]


def test_collnet_handle_codec(tmp_path):
    build_and_run(tmp_path, "test_collnet_handle", SOURCES)


def test_collnet_handle_codec_under_sanitizers(tmp_path):
    build_and_run(
        tmp_path,
        "test_collnet_handle_asan",
        SOURCES,
        flags=["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g"],
    )


def _connect_with(monkeypatch, mutate) -> tuple[int, str]:
    """One head: listen (v12), then connect with its own handle changed by `mutate` (bytes ->
    bytes or None for a NULL pointer). Nothing reaches the reducers: the handles are refused first."""
    for k in H.CLUSTER_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RS_NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("RS_REDUCERS", "127.0.0.1:9")
    plugin = H.Plugin()
    try:
        H.init_net(plugin, 12)
        coll, ctx = H.init_coll(plugin, 12, comm_id=77)
        handle, lcomm = H.listen(plugin, coll, 12, ctx)
        raw = mutate(bytes(handle.raw))
        buf = C.create_string_buffer(raw, H.HANDLE_BYTES) if raw is not None else None
        handles = (C.c_void_p * 1)(C.addressof(buf) if buf is not None else None)
        ccomm = C.c_void_p()
        rc = coll.connect(handles, 1, 0, lcomm, C.byref(ccomm))
        assert not ccomm.value
        H.check(coll.closeListen(lcomm), "closeListen", plugin)
        H.check(coll.finalize(ctx), "finalize", plugin)
        return rc, plugin.log_text()
    finally:
        plugin.close()


@pytest.mark.parametrize(
    "mutate, why",
    [
        (lambda b: b"\x00" + b[1:], "bad magic"),
        (lambda b: b[:4] + b"\x02" + b[5:], "version 2, expected 1"),
        (lambda b: b[:120] + b"\x01" + b[121:], "reserved bytes set"),
        (lambda b: None, "no handle"),
    ],
)
def test_connect_refuses_a_corrupted_handle_through_the_abi(monkeypatch, mutate, why):
    rc, log = _connect_with(monkeypatch, mutate)
    assert rc != H.SUCCESS
    assert f"connect: the handle of head 0 is not a CollNet handle of this plugin version ({why}" in log, log


def test_listen_writes_the_documented_layout(monkeypatch):
    """listen's handle (v12, communicator id 77): magic, version, the id little-endian at 24, one
    reducer at 40, zeros after the host name (collnet_handle.h). Not connected: a good handle would
    make connect dial the (absent) reducer."""
    seen = {}

    def keep(b: bytes) -> None:
        seen["raw"] = b
        return None  # connect then sees a NULL handle and refuses at once

    rc, _ = _connect_with(monkeypatch, keep)
    raw = seen["raw"]
    assert raw[:8] == b"RNCH\x01\x00\x00\x00" and int.from_bytes(raw[24:32], "little") == 77
    assert int.from_bytes(raw[40:44], "little") == 1 and raw[108:] == bytes(20)
    assert rc != H.SUCCESS


def test_a_peer_host_name_reaches_the_log_escaped(monkeypatch):
    """Head 1's handle (another job's pool, as a peer can make it) names its host with a newline,
    a forged log line and an ESC sequence: the refusal quotes it escaped, one line, no control byte."""
    for k in H.CLUSTER_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RS_NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("RS_REDUCERS", "127.0.0.1:9")
    evil = b"node\nNCCL WARN forged line\x1b[2J\x1b]0;title\x07\\end"
    plugin = H.Plugin()
    try:
        H.init_net(plugin, 12)
        coll, ctx = H.init_coll(plugin, 12, comm_id=77)
        handle, lcomm = H.listen(plugin, coll, 12, ctx)
        other = bytearray(handle.raw)
        other[32] ^= 1  # another reducer pool's fingerprint
        other[44:108] = evil.ljust(64, b"\0")
        bufs = [C.create_string_buffer(handle.raw, H.HANDLE_BYTES), C.create_string_buffer(bytes(other), 128)]
        handles = (C.c_void_p * 2)(*(C.addressof(b) for b in bufs))
        ccomm = C.c_void_p()
        rc = coll.connect(handles, 2, 0, lcomm, C.byref(ccomm))
        assert rc != H.SUCCESS and not ccomm.value
        H.check(coll.closeListen(lcomm), "closeListen", plugin)
        H.check(coll.finalize(ctx), "finalize", plugin)
    finally:
        plugin.close()
    (line,) = [t for _, t in plugin.log if "has a different reducer pool" in t]
    assert "head 1 (node\\nNCCL WARN forged line\\x1b[2J\\x1b]0;title\\x07\\\\end)" in line, line
    assert all(0x20 <= ord(ch) < 0x7F for ch in line), repr(line)
