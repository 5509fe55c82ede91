"""The worker's epoll set over its links (csrc/net/ready_set.h): its C++ unit tests,
tests/cpp/test_ready_set.cc, under AddressSanitizer + UndefinedBehaviorSanitizer."""

from __future__ import annotations

import pytest
from cpp_build import SANITIZE, build_and_run


@pytest.mark.timeout(300)
def test_ready_set_unit_tests_in_cpp(tmp_path):
    sources = [
        "tests/cpp/test_ready_set.cc",
        "csrc/net/ready_set.cc",
        "csrc/net/socket.cc",
        "csrc/common/common.cc",
        "csrc/common/text.cc",
        "csrc/common/settings.cc",
    ]
    build_and_run(tmp_path, "test_ready_set", sources, flags=SANITIZE)
