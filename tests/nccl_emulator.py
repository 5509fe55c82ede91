"""Plays NCCL's plugin loader, CollNet set-up, tuner rule and teardown, release by release.

Each Release row is what that NCCL tag's source does (github.com/NVIDIA/nccl, read per tag:
src/net.cc up to 2.25, src/plugin/net.cc and src/plugin/plugin_open.cc from 2.26,
src/graph/tuning.cc, src/init.cc; the table in docs/nccl-plugin.md, "Versions"):

- which file names it dlopens for NCCL_NET_PLUGIN (real dlopen by name here, so the process's
  LD_LIBRARY_PATH decides, as it does for NCCL);
- which ncclNetPlugin_vN / ncclCollNetPlugin_vN it looks up, newest first;
- how often it calls CollNet init and devices, and what it does when they fail;
- whether it holds our CollNet table as it is (its newest version) or its own adapter, whose
  iallgather / ireducescatter are never NULL and call ours unconditionally (2.24-2.25:
  src/net.cc ncclCollNet_v8_as_v9; 2.26-2.27: src/plugin/net/net_v9.cc and net_v8.cc); its tuner
  (src/graph/tuning.cc) rules CollNet out for all-gather / reduce-scatter only when the member it
  holds is NULL;
- 2.26-2.27 only: loading a CollNet v10 table logs its name through the net v10 table pointer
  (src/plugin/net/net_v10.cc, getNcclCollNet_v10: `ncclNet_v10->name`), a NULL dereference when
  the library has ncclCollNetPlugin_v10 but no ncclNetPlugin_v10 (fixed in 2.28.3);
- when it calls finalize: never (v7-v10), `if (collNetContext) comm->ncclCollNet->finalize` (2.28.3,
  through a NULL table when CollNet was disabled after init succeeded), or when CollNet is
  enabled (2.28.7+).

A jump to NULL is recorded as "crash" instead of being made. The loading NCCL's version reaches
the plugin through a stub ncclGetVersion (STUB_SOURCE, compiled once per test session): loaded
RTLD_GLOBAL ("global"), or RTLD_LOCAL with NCCL's logger inside the stub ("logger", the way
PyTorch loads NCCL), or absent ("none").

Run in a fresh process: `python nccl_emulator.py '<json scenario>'` prints one JSON line.
"""

from __future__ import annotations

import ctypes as C
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

import nccl_harness as H

STUB_SOURCE = r"""
#include <stdarg.h>
#include <stdio.h>
static int version_code;
typedef void (*sink_t)(int, unsigned long, const char*, int, const char*, const char*);
static sink_t sink;
int ncclGetVersion(int* v) { if (!v) return 4; if (!version_code) return 3; *v = version_code; return 0; }
void stub_set_version(int v) { version_code = v; }
void stub_set_sink(sink_t s) { sink = s; }
void stub_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char text[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (sink) sink(level, flags, file, line, "%s", text);
}
"""

PER_LOAD, PER_COMM = "per_load", "per_comm"


@dataclass(frozen=True)
class Release:
    tag: str
    code: int  # NCCL_VERSION_CODE
    net: tuple[int, ...]  # table versions looked up, newest first
    coll: tuple[int, ...]
    names: str  # "prefixed": libnccl-net-<v>.so only; "both": <v> then libnccl-net-<v>.so;
    #             "both_unless_path": the second only for a plain name (no '/', not lib*.so)
    plugin_list: bool  # NCCL_NET_PLUGIN is a comma-separated list
    collnet_init: str  # PER_LOAD: init + devices once per load; PER_COMM: init per communicator
    devices_each_init: bool  # PER_COMM: devices() after every init (2.28.3) or only the first
    finalize: str  # "none", "if_context" (2.28.3), "if_enabled" (2.28.7+)
    coll_v10_logs_net_v10: bool = False  # 2.26-2.27: CollNet v10 without net v10 is a NULL dereference


_V5_7, _V5_8, _V5_9 = (7, 6, 5), (8, 7, 6, 5), (9, 8, 7, 6, 5)
_V6_10, _V6_11, _V6_12 = (10, 9, 8, 7, 6), (11, 10, 9, 8, 7, 6), (12, 11, 10, 9, 8, 7, 6)
RELEASES = [
    Release("v2.19.4-1", 21904, _V5_7, _V5_7, "prefixed", False, PER_LOAD, False, "none"),
    Release("v2.20.5-1", 22005, _V5_8, _V5_8, "prefixed", False, PER_LOAD, False, "none"),
    Release("v2.23.4-1", 22304, _V5_8, _V5_8, "both", False, PER_LOAD, False, "none"),
    Release("v2.24.3-1", 22403, _V5_9, _V5_9, "both", False, PER_LOAD, False, "none"),
    Release("v2.25.1-1", 22501, _V5_9, _V5_9, "both", False, PER_LOAD, False, "none"),
    Release("v2.26.2-1", 22602, _V6_10, _V6_10, "both", False, PER_LOAD, False, "none", True),
    Release("v2.26.6-1", 22606, _V6_10, _V6_10, "both", False, PER_LOAD, False, "none", True),
    Release("v2.27.3-1", 22703, _V6_10, _V6_10, "both", True, PER_LOAD, False, "none", True),
    Release("v2.27.7-1", 22707, _V6_10, _V6_10, "both_unless_path", True, PER_LOAD, False, "none", True),
    Release("v2.28.3-1", 22803, _V6_11, _V6_11, "both_unless_path", True, PER_COMM, True, "if_context"),
    Release("v2.28.9-1", 22809, _V6_11, _V6_11, "both_unless_path", True, PER_COMM, False, "if_enabled"),
    Release("v2.29.7-1", 22907, _V6_11, _V6_11, "both_unless_path", True, PER_COMM, False, "if_enabled"),
    Release("v2.30.7-1", 23007, _V6_12, _V6_12, "both_unless_path", True, PER_COMM, False, "if_enabled"),
]
BY_TAG = {r.tag: r for r in RELEASES}


def file_names(rel: Release, value: str | None) -> list[str]:
    """The names rel dlopens, in order, for NCCL_NET_PLUGIN=value (None: unset)."""
    if not value:
        return ["libnccl-net.so"]
    out: list[str] = []
    for entry in value.split(",") if rel.plugin_list else [value]:
        if not entry:
            continue
        prefixed = f"libnccl-net-{entry}.so"
        if rel.names == "prefixed":
            out.append(prefixed)
        elif rel.names == "both":
            out += [entry, prefixed]
        else:
            plain = "/" not in entry and not (entry.startswith("lib") and entry.endswith(".so"))
            out += [entry, prefixed] if plain else [entry]
    return out


class Loaded:
    """What rel found: the library (opened by `name`) and the tables it will use."""

    def __init__(self, name: str, lib: C.CDLL, net_v: int | None, coll_v: int | None, crash: str | None = None) -> None:
        self.name, self.lib, self.net_v, self.coll_v, self.crash = name, lib, net_v, coll_v, crash


def load(rel: Release, value: str | None) -> tuple[Loaded | None, list[str]]:
    tried: list[str] = []
    for name in file_names(rel, value):
        tried.append(name)
        try:
            lib = C.CDLL(name, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError:
            continue
        net_v = next((v for v in rel.net if hasattr(lib, f"ncclNetPlugin_v{v}")), None)
        coll_v = next((v for v in rel.coll if hasattr(lib, f"ncclCollNetPlugin_v{v}")), None)
        crash = None
        if rel.coll_v10_logs_net_v10 and net_v and coll_v == 10 and not hasattr(lib, "ncclNetPlugin_v10"):
            crash = "ncclNet_v10->name in getNcclCollNet_v10's log line: ncclNet_v10 is NULL"
        return Loaded(name, lib, net_v, coll_v, crash), tried
    return None, tried


class Logger:
    """NCCL's logger, as `how` provides the NCCL version: see the module docstring."""

    def __init__(self, how: str, stub_path: str | None, code: int) -> None:
        self.lines: list[str] = []
        self.py = H.LOGGER(self._log)
        self.stub = None
        if how != "none":
            mode = C.RTLD_GLOBAL if how == "global" else os.RTLD_LOCAL
            self.stub = C.CDLL(stub_path, mode=mode | os.RTLD_NOW)
            self.stub.stub_set_version(code)
            self.stub.stub_set_sink(self.py)
        self.fn = H.LOGGER(C.cast(self.stub.stub_logger, C.c_void_p).value) if how == "logger" else self.py

    def _log(self, level: int, flags: int, file: bytes, line: int, fmt: bytes, text: bytes) -> None:
        self.lines.append(text.decode(errors="replace"))


class Nccl:
    """One emulated NCCL process: the plugin's state as rel keeps it, and its communicators."""

    def __init__(self, rel: Release, found: Loaded, logger: Logger) -> None:
        self.rel, self.found, self.log = rel, found, logger
        self.net = H.NET_TABLES[found.net_v].in_dll(found.lib, f"ncclNetPlugin_v{found.net_v}")
        self.coll = (
            H.COLL_TABLES[found.coll_v].in_dll(found.lib, f"ncclCollNetPlugin_v{found.coll_v}")
            if found.coll_v
            else None
        )
        self.coll_state = "init_ready" if self.coll else "absent"  # -> "enabled" / "disabled"
        self.net_ready = False
        self.events: list[str] = []

    # -- communicator set-up (ncclNetInit) --------------------------------------------------

    def comm_init(self, comm_hash: int) -> dict[str, Any]:
        comm: dict[str, Any] = {"net_ctx": C.c_void_p(), "coll_ctx": C.c_void_p(), "collnet": None}
        per_comm = self.rel.collnet_init == PER_COMM
        if per_comm or not self.net_ready:
            if self.found.net_v >= 11:
                rc = self.net.init(C.byref(comm["net_ctx"]), comm_hash, None, self.log.fn, None)
            elif self.found.net_v == 10:
                rc = self.net.init(self.log.fn, None)  # no profiler callback here
            else:
                rc = self.net.init(self.log.fn)
            ndev = C.c_int()
            if rc != H.SUCCESS or self.net.devices(C.byref(ndev)) != H.SUCCESS or ndev.value <= 0:
                raise RuntimeError(
                    f"{self.rel.tag}: the net plugin failed to initialize:\n" + "\n".join(self.log.lines)
                )
            self.net_ready = True
        if self.coll and (self.coll_state == "init_ready" or (per_comm and self.coll_state == "enabled")):
            if self.found.coll_v >= 11:
                rc = self.coll.init(C.byref(comm["coll_ctx"]), comm_hash, self.log.fn)
            else:
                rc = self.coll.init(self.log.fn)
            self.events.append(f"collnet init rc={rc} ctx={'set' if comm['coll_ctx'].value else 'NULL'}")
            if rc != H.SUCCESS:
                self.coll_state = "disabled"
            elif self.coll_state == "init_ready" or self.rel.devices_each_init:
                ndev = C.c_int()
                ok = self.coll.devices(C.byref(ndev)) == H.SUCCESS and ndev.value > 0
                self.coll_state = "enabled" if ok else "disabled"
        if self.coll_state == "enabled":
            comm["collnet"] = self.coll
        return comm

    # -- the tuner's rule for all-gather / reduce-scatter, and the call it leads to ----------

    def gather_outcome(self, comm: dict[str, Any], member: str) -> str:
        """ "ruled_out": NCCL never picks CollNet for it; "error": NCCL may pick it, the call
        fails; "crash": NCCL may pick it and jumps to NULL; "no_collnet": CollNet is off."""
        if comm["collnet"] is None:
            return "no_collnet"
        if self.found.coll_v == 7:
            return "ruled_out"  # NCCL 2.19's own table has no such member
        adapter = self.found.coll_v != self.rel.coll[0]
        ours = getattr(self.coll, member)
        if not adapter and not ours:
            return "ruled_out"
        if not ours:
            return "crash"
        req = C.c_void_p()
        if member == "iallgather":
            fn = C.CFUNCTYPE(
                C.c_int,
                C.c_void_p,
                C.c_void_p,
                C.c_int,
                C.c_void_p,
                C.c_size_t,
                C.c_size_t,
                C.c_size_t,
                C.c_void_p,
                C.POINTER(C.c_void_p),
            )(ours)
            rc = fn(None, None, 1, None, 0, 0, 0, None, C.byref(req))
        else:
            fn = C.CFUNCTYPE(
                C.c_int,
                C.c_void_p,
                C.c_int,
                C.c_void_p,
                C.c_void_p,
                C.c_size_t,
                C.c_size_t,
                C.c_size_t,
                C.c_int,
                C.c_int,
                C.c_void_p,
                C.POINTER(C.c_void_p),
            )(ours)
            rc = fn(None, 1, None, None, 0, 0, 0, 7, 0, None, C.byref(req))
        return "error" if rc != H.SUCCESS else "accepted"

    # -- communicator destroy (ncclNetFinalize) ---------------------------------------------

    def comm_destroy(self, comm: dict[str, Any]) -> str:
        """ "ok", or "crash" where rel would call finalize through a NULL table."""
        if self.found.net_v >= 11:
            self.net.finalize(comm["net_ctx"])
        if self.rel.finalize == "if_context" and comm["coll_ctx"].value:
            if comm["collnet"] is None:
                return "crash"
            rc = comm["collnet"].finalize(comm["coll_ctx"])
            self.events.append(f"collnet finalize rc={rc}")
        elif self.rel.finalize == "if_enabled" and self.coll_state == "enabled":
            rc = self.coll.finalize(comm["coll_ctx"])
            self.events.append(f"collnet finalize rc={rc}")
        return "ok"


def emulate(rel: Release, scenario: dict[str, Any]) -> dict[str, Any]:
    logger = Logger(scenario.get("version_via", "global"), scenario.get("stub"), rel.code)
    found, tried = load(rel, os.environ.get("NCCL_NET_PLUGIN"))  # set, or read from nccl.conf, by then
    out: dict[str, Any] = {"tried": tried, "opened": found.name if found else None}
    if not found or not found.net_v:
        out["net_v"] = None
        return out
    out.update(
        {
            "net_v": found.net_v,
            "coll_v": found.coll_v,
            "load": found.crash and "crash" or "ok",
            "path": _mapped_path(found.lib, f"ncclNetPlugin_v{found.net_v}"),
        }
    )
    if found.crash:  # NCCL would have died while loading: nothing else happens
        out["crash"] = found.crash
    if found.crash or scenario.get("load_only"):
        return out
    nccl = Nccl(rel, found, logger)
    comms = [nccl.comm_init(0x1000 + i) for i in range(scenario.get("comms", 2))]
    out["collnet"] = [c["collnet"] is not None for c in comms]
    out["iallgather"] = [nccl.gather_outcome(c, "iallgather") for c in comms]
    out["ireducescatter"] = [nccl.gather_outcome(c, "ireducescatter") for c in comms]
    out["destroy"] = [nccl.comm_destroy(c) for c in comms]
    out["events"] = nccl.events
    out["log"] = "\n".join(logger.lines)
    import _ctypes

    path = out["path"]
    _ctypes.dlclose(found.lib._handle)
    out["unloaded"] = not H.loaded(path)
    return out


def _mapped_path(lib: C.CDLL, symbol: str) -> str:
    class DlInfo(C.Structure):
        _fields_ = [("fname", C.c_char_p), ("fbase", C.c_void_p), ("sname", C.c_char_p), ("saddr", C.c_void_p)]

    info = DlInfo()
    addr = C.cast(getattr(lib, symbol), C.c_void_p)
    C.CDLL(None).dladdr(addr, C.byref(info))
    return os.path.realpath(info.fname.decode())


def run(scenario: dict[str, Any]) -> dict[str, Any]:
    """Every release in scenario["releases"] (default: all), one after the other in this process."""
    tags = scenario.get("releases") or [r.tag for r in RELEASES]
    return {tag: emulate(BY_TAG[tag], scenario) for tag in tags}


if __name__ == "__main__":
    print("EMULATOR " + json.dumps(run(json.loads(sys.argv[1]))))
