"""The reducer's membership rules as C++ unit tests without sockets (tests/cpp/test_group_table.cc)."""

from __future__ import annotations

from cpp_build import build_and_run, kernel_sources

SOURCES = [
    "tests/cpp/test_group_table.cc",
    "csrc/server/group_table.cc",
    "csrc/server/group.cc",
    "csrc/protocol/plan.cc",
    "csrc/server/limits.cc",
    "csrc/protocol/wire.cc",
    "csrc/common/common.cc",
    "csrc/common/text.cc",
    "csrc/common/settings.cc",
]


def test_group_table_rules(tmp_path):
    build_and_run(tmp_path, "test_group_table", SOURCES + kernel_sources())
