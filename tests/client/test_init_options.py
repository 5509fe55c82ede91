"""reducer.init() takes every keyword option Communicator takes (one list: its signature)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from attack_tools import serve

import reducer
from reducer.communicator import Communicator
from reducer.errors import ConfigError


def _options() -> list:
    params = inspect.signature(Communicator.__init__).parameters
    return [k for k in params if k not in ("self", "reducers", "rank", "world_size", "job_id")]


def test_init_accepts_every_communicator_option_and_uses_it() -> None:
    with serve() as srv:
        address = f"127.0.0.1:{srv.port}"
        everything = {k: None for k in _options()}  # None: the setting's default, as in Communicator
        comm = reducer.init(reducers=[address], rank=0, world_size=1, **everything)
        comm.close()
        # The documented failover switch and rounds in flight (once refused as unknown arguments).
        comm = reducer.init(
            reducers=[address], rank=0, world_size=1, failover=False, max_rounds_in_flight=3, group="init-options"
        )
        try:
            x = np.arange(1000, dtype=np.int64)
            comm.allreduce(x)
            assert np.array_equal(x, np.arange(1000, dtype=np.int64))
        finally:
            comm.close()


def test_init_names_unknown_arguments() -> None:
    with pytest.raises(ConfigError, match="unknown arguments to reducer.init\\(\\): no_such_option"):
        reducer.init(reducers=["127.0.0.1:1"], rank=0, world_size=1, no_such_option=1)
