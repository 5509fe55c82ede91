"""Every member of every exported NCCL table holds what it should (issue 30, house 4).

csrc/nccl_plugin/exports_net.cc and exports_collnet.cc set each member of the net tables
(ncclNetPlugin_v7/8/10/11/12) and the CollNet tables (ncclCollNetPlugin_v7..v12) by name. This
states, independently of that code and member by member in nccl_harness.py's layout of NCCL's ABI,
which function each member must be (read off the library's symbol table: the functions are
internal) and which members must be NULL: a member set into its neighbour's slot, or a NULL
iallgather / ireducescatter that became a function (NCCL's tuner would then pick CollNet for
all-gather / reduce-scatter), fails here, naming the table and the member.
"""

from __future__ import annotations

import ctypes as C
import re
import shutil
import subprocess
from typing import Any

import nccl_harness as H
import pytest

pytestmark = pytest.mark.timeout(60)

NAME = b"reduction-server"


def _net_builtin(v: int, member: str) -> str | None:
    """The built-in function behind net member `member` of version `v` (None: must be NULL)."""
    ctx = H.has_ctx(v)
    table = {
        "init": f"net_init_v{v}",
        "devices": "net_devices",
        "getProperties": f"net_get_properties<ncclNetProperties_v{v}_t>",
        "listen": "net_listen_v12" if ctx else "net_listen_v8",
        "connect": "net_connect_v12" if ctx else ("net_connect_v10" if v == 10 else "net_connect_v8"),
        "accept": "net_accept",
        "regMr": "reg_mr_v7" if v == 7 else "reg_mr",
        "regMrDmaBuf": "reg_mr_dmabuf",
        "deregMr": "dereg_mr",
        "isend": "net_isend_v12" if v >= 10 else "net_isend_v8",
        "irecv": "net_irecv_v12" if v >= 10 else "net_irecv_v8",
        "iflush": "net_iflush",
        "test": "net_test",
        "closeSend": "net_close",
        "closeRecv": "net_close",
        "closeListen": "net_close_listen",
        "finalize": "net_finalize",
    }
    # getDeviceMr, irecvConsumed, makeVDevice, setNetAttr: optional, NULL for the built-in net.
    return table.get(member)


def _coll_builtin(v: int, member: str) -> str | None:
    """The function behind CollNet member `member` of version `v` (None: must be NULL)."""
    props = 10 if v == 9 else v  # v9 and v10 share one properties layout
    table = {
        "init": f"coll_init_v{v}",
        "devices": "coll_devices",
        "getProperties": f"coll_get_properties<ncclNetProperties_v{props}_t>",
        "listen": "coll_listen_v12" if H.has_ctx(v) else "coll_listen_v8",
        "connect": "coll_connect",
        "reduceSupport": "coll_reduce_support",
        "regMr": "reg_mr_v7" if v == 7 else "reg_mr",
        "regMrDmaBuf": "reg_mr_dmabuf",
        "deregMr": "dereg_mr",
        "iallreduce": "coll_iallreduce_v12" if v >= 9 else "coll_iallreduce_v8",
        "iflush": "coll_iflush",
        "test": "coll_test",
        "closeColl": "coll_close",
        "closeListen": "coll_close_listen",
        "finalize": "coll_finalize",
    }
    if v == 12:  # until init chooses for the loading NCCL (NULL when it holds the table as it is)
        table.update(iallgather="coll_iallgather", ireducescatter="coll_ireducescatter")
    # iallgather / ireducescatter of v8-v11 and makeVDevice: NULL.
    return table.get(member)


@pytest.fixture(scope="module")
def plugin() -> Any:
    return H.Plugin()


@pytest.fixture(scope="module")
def symbols(plugin: Any) -> dict[str, Any] | None:
    """Address (relative to the library's load address) -> demangled names, from its symbol table;
    None without nm or symbols (a stripped library): then only NULL / not NULL is checked."""
    if shutil.which("nm") is None:
        return None
    out = subprocess.run(
        ["nm", "-C", "--defined-only", plugin.path], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    names: dict[int, list[str]] = {}
    where: dict[str, int] = {}
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTdD":
            names.setdefault(int(parts[0], 16), []).append(parts[2])
            where.setdefault(parts[2], int(parts[0], 16))
    if "ncclNetPlugin_v12" not in where or not any("net_devices" in n for ns in names.values() for n in ns):
        return None
    return {"names": names, "where": where}


def _members(table: Any) -> dict[str, int | None]:
    """Each pointer member of a table by name: its address, None when NULL."""
    words = (C.c_void_p * (C.sizeof(table) // 8)).from_address(C.addressof(table))
    return {name: words[getattr(type(table), name).offset // 8] for name, _ in type(table)._fields_ if name != "name"}


def _check(kind: str, v: int, table: Any, builtin: Any, symbols: dict[str, Any] | None) -> None:
    assert table.name == NAME, f"{kind} v{v}: name {table.name!r}"
    base = None if symbols is None else C.addressof(table) - symbols["where"][f"{kind}Plugin_v{v}"]
    for member, address in _members(table).items():
        want = builtin(v, member)
        if want is None:
            assert address is None, f"{kind} v{v}.{member} must be NULL"
            continue
        assert address is not None, f"{kind} v{v}.{member} is NULL, expected {want}"
        if symbols is None or base is None:
            continue  # no symbol table: NULL or not is all that can be checked
        names = symbols["names"].get(address - base, [])
        if kind == "ncclNet" and member != "init":  # the delegate's member of the same version, else the built-in
            pattern = rf"^rs::nccl::\(anonymous namespace\)::Fwd<&ncclNet_v{v}_t::{member}, .*::{re.escape(want)}[>(]"
        else:
            pattern = rf"(^|::){re.escape(want)}\("
        assert any(re.search(pattern, n) for n in names), f"{kind} v{v}.{member} is {names or hex(address)}, not {want}"


@pytest.mark.parametrize("v", H.NET_VERSIONS)
def test_net_table_members(plugin: Any, symbols: dict[str, Any] | None, v: int) -> None:
    _check("ncclNet", v, plugin.net(v), _net_builtin, symbols)


@pytest.mark.parametrize("v", H.COLL_VERSIONS)
def test_collnet_table_members(plugin: Any, symbols: dict[str, Any] | None, v: int) -> None:
    _check("ncclCollNet", v, plugin.coll(v), _coll_builtin, symbols)


def test_older_collnet_tables_offer_no_gather(plugin: Any) -> None:
    """v8-v11 are only ever held as they are: NULL all-gather / reduce-scatter, so no NCCL release
    picks CollNet for them (v7 has no such members)."""
    for v in (8, 9, 10, 11):
        members = _members(plugin.coll(v))
        assert members["iallgather"] is None and members["ireducescatter"] is None, v
    assert "iallgather" not in _members(plugin.coll(7))


def test_reduce_support_is_where_nccl_calls_it(plugin: Any) -> None:
    """A behavioural check of one member per CollNet table, without any setup: reduceSupport
    answers float32 sum yes and float8 no in every version."""
    for v in H.COLL_VERSIONS:
        table, supported = plugin.coll(v), C.c_int(-1)
        assert table.reduceSupport(7, 0, C.byref(supported)) == H.SUCCESS and supported.value == 1, v
        assert table.reduceSupport(10, 0, C.byref(supported)) == H.SUCCESS and supported.value == 0, v
