"""tests/nccl_harness.py's ctypes copy of NCCL's ABI agrees with csrc/nccl_plugin/nccl_abi.h.

The harness plays NCCL from Python, so it declares the plugin tables and property structs a
second time in ctypes. This test keeps the two from drifting apart: it writes a C++ program from
the harness's own declarations (every struct, every member, in the harness's order) that prints
sizeof and offsetof of each as the C++ header lays them out, compiles it against nccl_abi.h (a
member the header does not have is a compile error) and compares the numbers with ctypes'.
"""

from __future__ import annotations

import ctypes as C
from pathlib import Path

import nccl_harness as H
from cpp_build import build_and_run

# ctypes members that stand for a nested C member (the harness flattens the v9+ virtual-device props).
NESTED = {"vNdevs": "vProps.ndevs", "vDevs": "vProps.devs"}


def _structs() -> dict[str, type[C.Structure]]:
    """C type name -> the harness's ctypes declaration of it."""
    out: dict[str, type[C.Structure]] = {}
    for v, props in H.PROPS.items():
        out[f"ncclNetProperties_v{v}_t"] = props
    for v, table in H.NET_TABLES.items():
        out[f"ncclNet_v{v}_t"] = table
    for v, table in H.COLL_TABLES.items():
        out[f"ncclCollNet_v{v}_t"] = table
    return out


def _program(structs: dict[str, type[C.Structure]]) -> str:
    lines = ["#include <cstddef>", "#include <cstdio>", '#include "nccl_plugin/nccl_abi.h"', "int main() {"]
    for cname, struct in structs.items():
        lines.append(f'  std::printf("{cname} %zu\\n", sizeof({cname}));')
        for field, _ in struct._fields_:
            member = NESTED.get(field, field)
            lines.append(f'  std::printf("{cname}.{field} %zu\\n", offsetof({cname}, {member}));')
    lines += ['  std::printf("all checks passed\\n");', "  return 0;", "}"]
    return "\n".join(lines) + "\n"


def _ctypes_layout(structs: dict[str, type[C.Structure]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for cname, struct in structs.items():
        out[cname] = C.sizeof(struct)
        for field, _ in struct._fields_:
            out[f"{cname}.{field}"] = getattr(struct, field).offset
    return out


def test_the_harness_declares_the_headers_layout(tmp_path: Path) -> None:
    structs = _structs()
    source = tmp_path / "nccl_abi_layout.cc"
    source.write_text(_program(structs))
    printed = build_and_run(tmp_path, "nccl_abi_layout", [str(source)])
    layout = {}
    for line in printed.splitlines():
        name, _, value = line.rpartition(" ")
        if name and value.isdigit():
            layout[name] = int(value)
    want = _ctypes_layout(structs)
    assert set(layout) == set(want), sorted(set(layout) ^ set(want))
    differ = {k: (want[k], layout[k]) for k in want if want[k] != layout[k]}
    assert not differ, f"ctypes (harness) vs C++ (nccl_abi.h): {differ}"
