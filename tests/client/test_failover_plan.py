"""The failover exchange's decisions (csrc/client/failover.h) as C++ unit tests without sockets."""

from __future__ import annotations

from cpp_build import build_and_run

SOURCES = ["tests/cpp/test_failover_plan.cc", "csrc/client/failover.cc", "csrc/common/common.cc"]


def test_failover_plan(tmp_path):
    build_and_run(tmp_path, "test_failover_plan", SOURCES)
