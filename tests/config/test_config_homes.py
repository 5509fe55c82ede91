"""One home each (issue 23, point 3): compression names, default ports and the control-port rule,
hexadecimal, and the settings parser's kinds (C++ unit test tests/cpp/test_common_homes.cc)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from attack_tools import serve
from cpp_build import build_and_run

from reducer import _core, addresses, config
from reducer.communicator import Communicator
from reducer.dtypes import wire_name
from reducer.errors import ConfigError
from reducer.fusion import compression_dtype


def test_common_helpers_cpp(tmp_path: Path) -> None:
    build_and_run(
        tmp_path,
        "test_common_homes",
        [
            "tests/cpp/test_common_homes.cc",
            "csrc/common/settings.cc",
            "csrc/common/compression.cc",
            "csrc/common/text.cc",
            "csrc/common/dtype.cc",
            "csrc/common/common.cc",
        ],
    )


# -- compression names: csrc/common/compression.h, bound as _core.COMPRESSIONS ---------------------

WIRE = {"none": None, "bf16": "bfloat16", "fp16": "float16"}


@pytest.fixture(scope="module")
def comm() -> Iterator[Communicator]:
    with serve() as srv, Communicator([f"127.0.0.1:{srv.port}"], 0, 1, group="homes") as c:
        yield c


@pytest.mark.parametrize("name", sorted(_core.COMPRESSIONS))
def test_every_compression_name_in_any_case_on_every_path(comm: Communicator, name: str) -> None:
    wire = WIRE[_core.COMPRESSIONS[name]]
    for text in (name, f" {name.upper()} "):
        assert config.compression_wire(text) == wire
        assert config.compression_name(text) == (None if wire is None else _core.COMPRESSIONS[name])
        fused = compression_dtype(text)  # the fusion engine's and the bench runner's reader
        assert (None if fused is None else wire_name(fused)) == wire
        x = np.arange(256, dtype=np.float32)  # exact in bf16 and fp16: one worker's sum is itself
        comm.allreduce(x, compression=text)  # the Python path
        assert np.array_equal(x, np.arange(256, dtype=np.float32))
        y = np.full(1024, 3.0, dtype=np.float32)
        comm._client.allreduce(y, "float32", "sum", compression=text)  # the core's own argument
        assert np.array_equal(y, np.full(1024, 3.0, dtype=np.float32))


@pytest.mark.parametrize("bad", ["fp8", "bf 16", "int8"])
def test_unknown_compression_is_refused_everywhere(comm: Communicator, bad: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown compression '{bad}'"):
        config.compression_wire(bad)
    with pytest.raises(ConfigError, match=f"unknown compression '{bad}'"):
        compression_dtype(bad)
    with pytest.raises(ConfigError, match="unknown compression"):
        comm.allreduce(np.zeros(8, dtype=np.float32), compression=bad)
    with pytest.raises(ValueError, match="unknown compression"):
        comm._client.allreduce(np.zeros(8, dtype=np.float32), "float32", "sum", compression=bad)


def test_compression_choices_are_the_canonical_names() -> None:
    assert config.COMPRESSION_NAMES == ("bf16", "fp16")


# -- default ports and the control-port rule: reducer/addresses.py --------------------------------


def test_default_port_and_control_port_rule() -> None:
    assert addresses.DEFAULT_PORT == 2222
    assert addresses.control_port_for(2222) == 2223
    assert addresses.control_port_for(addresses.MAX_PORT - 1) == addresses.MAX_PORT
    assert addresses.control_port_for(addresses.MAX_PORT) is None
