"""The plugin under every NCCL release it claims (2.19-2.30), as each release's own source loads,
sets up, tunes and tears it down (tests/nccl_emulator.py: one row per release, from its source).

Each scenario runs in a fresh process (the loader's path and the stub ncclGetVersion are
process-wide), all releases one after the other.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nccl_emulator as E
import nccl_harness as H
import pytest
from paths import ROOT, TESTS

# (net, CollNet) table each release takes from the library: its newest that the library exports.
# 2.24-2.25 know net v9, which the library does not export: they take net v8 through their own
# adapter (point-to-point only; the CollNet table is searched on its own).
TABLES = {
    "v2.19.4-1": (7, 7),
    "v2.20.5-1": (8, 8),
    "v2.23.4-1": (8, 8),
    "v2.24.3-1": (8, 9),
    "v2.25.1-1": (8, 9),
    "v2.26.2-1": (10, 10),
    "v2.26.6-1": (10, 10),
    "v2.27.3-1": (10, 10),
    "v2.27.7-1": (10, 10),
    "v2.28.3-1": (11, 11),
    "v2.28.9-1": (11, 11),
    "v2.29.7-1": (11, 11),
    "v2.30.7-1": (12, 12),
}
# Every release holds the CollNet table it takes as it is (its own newest version), so its tuner
# sees NULL iallgather / ireducescatter and never picks CollNet for them: none is "adapted".
# (With a v8 table only, 2.24-2.27 wrapped it in adapters that call those members unconditionally.)


def test_every_release_is_emulated():
    assert sorted(TABLES) == sorted(r.tag for r in E.RELEASES)


@pytest.fixture(scope="session")
def stub(tmp_path_factory) -> str:
    """A tiny library with ncclGetVersion (the version set by the emulator) and a logger."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed (the package itself is built with one)"
    d = tmp_path_factory.mktemp("stub")
    src, lib = d / "stub.c", d / "libstub-nccl.so"
    src.write_text(E.STUB_SOURCE)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True, timeout=120)
    return str(lib)


def emulate(
    scenario: dict[str, Any], reducers: str | None, env: dict[str, str] | None = None, shell_prefix: str = ""
) -> dict[str, dict[str, Any]]:
    """Runs nccl_emulator.py in a fresh process; by default the library is found the documented
    way (its directory on LD_LIBRARY_PATH, NCCL_NET_PLUGIN=reduction-server)."""
    child = {k: v for k, v in os.environ.items() if k not in H.CLUSTER_VARS and not k.startswith("NCCL_")}
    child.update({"RS_NCCL_SOCKET_IFNAME": "lo", "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}"})
    if reducers:
        child["RS_REDUCERS"] = reducers
    if env is None:
        env = {"LD_LIBRARY_PATH": os.path.dirname(H.library_path()), "NCCL_NET_PLUGIN": "reduction-server"}
    child.update(env)
    cmd = f'{shell_prefix}exec {sys.executable} nccl_emulator.py "$SCENARIO"'
    child["SCENARIO"] = json.dumps(scenario)
    out = subprocess.run(["bash", "-c", cmd], cwd=TESTS, env=child, capture_output=True, text=True, timeout=300)
    lines = [x for x in out.stdout.splitlines() if x.startswith("EMULATOR ")]
    assert out.returncode == 0 and lines, f"rc {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return json.loads(lines[-1][len("EMULATOR ") :])


def finalize_events(r: dict[str, Any]) -> list:
    return [e for e in r["events"] if e.startswith("collnet finalize")]


def test_no_reducers_every_release_tears_down_cleanly(stub):
    """The worker image's default. CollNet init fails and leaves no context, so every release
    disables CollNet and none calls finalize for it (2.28.3 used to call it through a NULL table)."""
    res = emulate({"stub": stub}, reducers=None)
    for tag, r in res.items():
        assert (r["net_v"], r["coll_v"]) == TABLES[tag], (tag, r)
        assert r["collnet"] == [False, False], (tag, r["events"])
        assert r["destroy"] == ["ok", "ok"], (tag, r["events"])
        inits = [e for e in r["events"] if e.startswith("collnet init")]
        assert inits and all(e != "collnet init rc=0 ctx=set" and e.endswith("ctx=NULL") for e in inits), (tag, inits)
        assert finalize_events(r) == []
        assert "no reducers configured" in r["log"] and "NCCL runs without CollNet" in r["log"]
        assert r["iallgather"] == r["ireducescatter"] == ["no_collnet", "no_collnet"]
        assert r["unloaded"], tag


def test_with_reducers_no_release_ever_picks_collnet_for_all_gather(stub):
    """Every release holds our table as it is and sees NULL members, so its tuner never picks
    CollNet for all-gather / reduce-scatter (2.24-2.27 included: they used to wrap v8 in an
    adapter, pick CollNet on NVSwitch nodes and fail with ncclInternalError). The version comes
    from the stub ncclGetVersion in the global scope."""
    res = emulate({"stub": stub}, reducers="127.0.0.1:9")
    for tag, r in res.items():
        assert (r["net_v"], r["coll_v"]) == TABLES[tag], (tag, r)
        assert r["load"] == "ok", (tag, r)
        assert r["collnet"] == [True, True], (tag, r["log"])
        assert r["iallgather"] == r["ireducescatter"] == ["ruled_out"] * 2, (tag, r["log"])
        assert r["destroy"] == ["ok", "ok"]
        code = E.BY_TAG[tag].code
        version = f"{code // 10000}.{code // 100 % 100}.{code % 100}"
        assert f"CollNet v{TABLES[tag][1]} loaded by NCCL {version}" in r["log"], (tag, r["log"])
        # v11/v12 (2.28+): finalize once per communicator, each with the context its init gave.
        assert finalize_events(r) == (["collnet finalize rc=0"] * 2 if code >= 22800 else []), (tag, r["events"])
        assert r["unloaded"], tag


def test_version_from_the_library_that_holds_nccls_logger(stub):
    """NCCL loaded RTLD_LOCAL (as PyTorch loads it) is not in the global scope: the plugin finds
    ncclGetVersion in the object that holds the logger NCCL passed to init."""
    tags = ["v2.23.4-1", "v2.24.3-1", "v2.26.6-1", "v2.30.7-1"]
    res = emulate({"stub": stub, "version_via": "logger", "releases": tags}, reducers="127.0.0.1:9")
    for tag, r in res.items():
        assert r["iallgather"] == r["ireducescatter"] == ["ruled_out"] * 2, (tag, r["log"])
        assert f"loaded by NCCL {tag[1:5]}" in r["log"], (tag, r["log"])


def test_unknown_version_refuses_and_never_jumps_to_null(stub):
    """No ncclGetVersion anywhere (a static NCCL that hides it): v7-v11 are only ever found by a
    release whose newest they are (it uses them as they are), so they carry NULL; v12 assumes an
    adapter (an NCCL newer than 2.30 may wrap it), so all-gather / reduce-scatter can fail there
    but never crash."""
    res = emulate({"version_via": "none"}, reducers="127.0.0.1:9")
    for tag, r in res.items():
        want = "error" if TABLES[tag][1] == 12 else "ruled_out"
        assert r["iallgather"] == r["ireducescatter"] == [want] * 2, (tag, r["log"])
        assert "NCCL unknown" in r["log"] and r["destroy"] == ["ok", "ok"]


def _tables_only_library(tmp_path: Path, name: str, symbols: dict[str, int]) -> Path:
    """A library that only exports tables of zeros (symbol -> pointers): enough for a loader."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed (the package itself is built with one)"
    d = tmp_path / name
    d.mkdir()
    src = d / "tables.c"
    src.write_text("".join(f"void* {sym}[{n}];\n" for sym, n in symbols.items()))
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(d / "libnccl-net-reduction-server.so"), str(src)], check=True, timeout=120
    )
    return d


def test_collnet_v10_without_net_v10_would_crash_2_26_and_2_27(stub, tmp_path):
    """Why the library exports ncclNetPlugin_v10 next to ncclCollNetPlugin_v10: 2.26-2.27 log the
    CollNet v10 table's name through their net v10 pointer, a NULL dereference while they load a
    library without net v10; 2.24-2.25 (no v10) and 2.28+ (newer tables first) load it. The
    library itself exports both (TABLES)."""
    tags = ["v2.24.3-1", "v2.26.2-1", "v2.27.7-1", "v2.28.9-1"]
    without = _tables_only_library(
        tmp_path,
        "without",
        {"ncclNetPlugin_v8": 19, "ncclCollNetPlugin_v10": 18, "ncclNetPlugin_v11": 22, "ncclCollNetPlugin_v11": 19},
    )
    env = {"LD_LIBRARY_PATH": str(without), "NCCL_NET_PLUGIN": "reduction-server"}
    res = emulate({"stub": stub, "releases": tags, "load_only": True}, reducers=None, env=env)
    assert {t: r.get("load") for t, r in res.items()} == {
        "v2.24.3-1": "ok",
        "v2.26.2-1": "crash",
        "v2.27.7-1": "crash",
        "v2.28.9-1": "ok",
    }, res
    assert (res["v2.26.2-1"]["net_v"], res["v2.26.2-1"]["coll_v"]) == (8, 10)
    with_net = _tables_only_library(tmp_path, "with", {"ncclNetPlugin_v10": 20, "ncclCollNetPlugin_v10": 18})
    env["LD_LIBRARY_PATH"] = str(with_net)
    res = emulate({"stub": stub, "releases": tags[1:3], "load_only": True}, reducers=None, env=env)
    assert all(r["load"] == "ok" and (r["net_v"], r["coll_v"]) == (10, 10) for r in res.values()), res


def _cli(capsys, *args: str) -> str:
    from reducer.cli.main import main

    assert main(["nccl-plugin", *args]) == 0
    return capsys.readouterr().out


def test_install_is_loaded_by_every_release(tmp_path, capsys, stub):
    """`--install DIR --conf` as the worker image runs it (DIR then on the loader's path through
    ldconfig; here LD_LIBRARY_PATH), and the printed shell exports: every release dlopens the
    installed library and finds its tables."""
    lib_dir = tmp_path / "lib"
    conf = _cli(capsys, "--install", str(lib_dir), "--conf")
    exports = _cli(capsys, "--install", str(lib_dir))
    installed = os.path.realpath(lib_dir / "libnccl-net-reduction-server.so")
    settings = dict(line.split("=", 1) for line in conf.splitlines())
    assert settings == {"NCCL_NET_PLUGIN": "reduction-server", "NCCL_COLLNET_ENABLE": "1"}
    for how, env, prefix in (
        ("conf", {"LD_LIBRARY_PATH": str(lib_dir), **settings}, ""),
        ("exports", {}, "".join(f"{x}; " for x in exports.splitlines() if x.startswith("export "))),
    ):
        res = emulate({"stub": stub}, reducers="127.0.0.1:9", env=env, shell_prefix=prefix)
        for tag, r in res.items():
            assert r["path"] == installed and (r["net_v"], r["coll_v"]) == TABLES[tag], (how, tag, r)
            assert r["collnet"] == [True, True]
    # NCCL_NET_PLUGIN unset: the default name, a link to the same file.
    res = emulate({"stub": stub}, reducers=None, env={"LD_LIBRARY_PATH": str(lib_dir)})
    for tag, r in res.items():
        assert r["opened"] == "libnccl-net.so" and r["path"] == installed, (tag, r)


def test_install_keeps_another_plugins_default_name(tmp_path, capsys):
    from reducer.cli.main import main

    other = tmp_path / "libnccl-net.so"
    other.write_bytes(b"\x7fELF another vendor's plugin")
    assert main(["nccl-plugin", "--install", str(tmp_path)]) == 0
    assert other.read_bytes() == b"\x7fELF another vendor's plugin"
    assert "is another plugin: left as it is" in capsys.readouterr().err
    # An earlier install of this plugin (a copy) is replaced by the link.
    other.write_bytes(Path(H.library_path()).read_bytes())
    assert main(["nccl-plugin", "--install", str(tmp_path)]) == 0
    assert other.is_symlink() and os.readlink(other) == "libnccl-net-reduction-server.so"
