"""Cluster discovery (reducer/cluster.py; CLUSTER_SPEC / TF_CONFIG are read by the C++ reader of
csrc/cluster/, reducer._core.cluster, which the NCCL plugin shares: tests/nccl_plugin/test_nccl_plugin.py asks
both the same questions)."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest
from paths import DOCS

from reducer import config
from reducer.cluster import (
    ClusterInfo,
    discover,
    discover_reducer,
    discover_worker,
)
from reducer.errors import ConfigError

CONFIGURATION_MD = DOCS / "configuration.md"

# The documented example of docs/vertex-ai (a reducer, second replica of pool 2).
VERTEX_CLUSTER = {
    "workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
    "workerpool1": ["cmle-training-workerpool1-ab-0:2222", "cmle-training-workerpool1-ab-1:2222"],
    "workerpool2": ["cmle-training-workerpool2-ab-0:2222", "cmle-training-workerpool2-ab-1:2222"],
}
REDUCERS = ["cmle-training-workerpool2-ab-0:2222", "cmle-training-workerpool2-ab-1:2222"]
WORKERS = [
    "cmle-training-workerpool0-ab-0:2222",
    "cmle-training-workerpool1-ab-0:2222",
    "cmle-training-workerpool1-ab-1:2222",
]


def cluster_spec(task_type: str, index: int, cluster: dict[str, Any] = VERTEX_CLUSTER, **extra: str) -> dict[str, str]:
    spec = {
        "cluster": cluster,
        "environment": "cloud",
        "task": {"type": task_type, "index": index, "trial": ""},
        "job": {"workerPoolSpecs": []},
    }
    return {"CLUSTER_SPEC": json.dumps(spec), **extra}


TF_CLUSTER = {
    "chief": ["chief-0:2222"],
    "worker": ["worker-0:2222", "worker-1:2222"],
    "ps": ["ps-0:2222", "ps-1:2222"],
}


def tf_config(task_type: str, index: int, cluster: dict[str, Any] = TF_CLUSTER, **extra: str) -> dict[str, str]:
    cfg = {
        "cluster": cluster,
        "task": {"type": task_type, "index": index, "cloud": "x"},
        "environment": "cloud",
        "job": {},
    }
    return {"TF_CONFIG": json.dumps(cfg), **extra}


def rs_env(**extra: str) -> dict[str, str]:
    return {"RS_REDUCERS": "10.0.0.5:2222,10.0.0.6:2223", **extra}


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests pass env explicitly; make sure nothing leaks from the real environment either.
    for name in ["CLUSTER_SPEC", "TF_CONFIG", "CLOUD_ML_JOB_ID"] + [s.env for s in config.SETTINGS.values()]:
        monkeypatch.delenv(name, raising=False)


# -- CLUSTER_SPEC ------------------------------------------------------------------------------


def test_vertex_primary_is_rank_0() -> None:
    info = discover(cluster_spec("workerpool0", 0))
    assert info == ClusterInfo(
        role="worker",
        reducers=REDUCERS,
        workers=WORKERS,
        node_rank=0,
        num_nodes=3,
        local_rank=0,
        local_world_size=1,
        rank=0,
        world_size=3,
        job_id="local",
        source="CLUSTER_SPEC",
        bind_port=None,
        task_type="workerpool0",
    )


@pytest.mark.parametrize("i", [0, 1])
def test_vertex_worker_i_is_node_1_plus_i(i: int) -> None:
    info = discover_worker(cluster_spec("workerpool1", i))
    assert info.role == "worker"
    assert info.node_rank == 1 + i
    assert info.rank == 1 + i
    assert info.world_size == 3 and info.num_nodes == 3
    assert info.reducers == REDUCERS
    assert info.workers == WORKERS


def test_vertex_reducer_index_1() -> None:
    info = discover(cluster_spec("workerpool2", 1))
    assert info.role == "reducer"
    assert info.node_rank == 1
    assert info.num_nodes == 2
    assert info.reducers == REDUCERS
    assert info.workers == WORKERS
    assert info.bind_port == 2222
    assert info.rank == -1 and info.world_size == 0
    assert discover_reducer(cluster_spec("workerpool2", 1)) == info


def test_vertex_reducer_bind_port_from_own_entry_and_rs_port() -> None:
    cluster = dict(VERTEX_CLUSTER, workerpool2=["r0:7000", "r1:7001"])
    assert discover_reducer(cluster_spec("workerpool2", 1, cluster)).bind_port == 7001
    info = discover_reducer(cluster_spec("workerpool2", 1, cluster, RS_PORT="9000"))
    assert info.bind_port == 9000
    assert info.reducers == ["r0:9000", "r1:9000"]


def test_vertex_reducer_port_override() -> None:
    info = discover_worker(cluster_spec("workerpool0", 0), reducer_port=5555)
    assert info.reducers == ["cmle-training-workerpool2-ab-0:5555", "cmle-training-workerpool2-ab-1:5555"]
    # RS_PORT (the port reducers bind) is used by workers too; the argument wins over it.
    env = cluster_spec("workerpool0", 0, RS_PORT="6000")
    assert discover_worker(env).reducers[0].endswith(":6000")
    assert discover_worker(env, reducer_port=5555).reducers[0].endswith(":5555")


def test_vertex_ignores_rs_reducers_env_but_honours_reducers_argument() -> None:
    env = cluster_spec("workerpool0", 0, RS_REDUCERS="x:1", RS_RANK="5", RS_WORLD_SIZE="9")
    info = discover(env)
    assert info.source == "CLUSTER_SPEC" and info.reducers == REDUCERS and info.rank == 0
    info = discover(env, reducers=["a:1", "b:2"], rank=2, world_size=3)
    assert info.reducers == ["a:1", "b:2"] and info.rank == 2 and info.world_size == 3
    assert info.source == "CLUSTER_SPEC"
    assert discover(env, reducers="a:1, b:2").reducers == ["a:1", "b:2"]


def test_vertex_cluster_spec_wins_over_tf_config() -> None:
    env = {**tf_config("ps", 0), **cluster_spec("workerpool1", 0)}
    assert discover(env).source == "CLUSTER_SPEC"


def test_vertex_evaluator_is_not_in_the_group() -> None:
    cluster = dict(VERTEX_CLUSTER, workerpool3=["cmle-training-workerpool3-ab-0:2222"])
    env = cluster_spec("workerpool3", 0, cluster)
    info = discover(env)
    assert info.role == "evaluator"
    assert info.workers == WORKERS  # workerpool3 is never a worker
    assert info.reducers == REDUCERS
    with pytest.raises(
        ConfigError,
        match=re.escape("this process is an evaluator (workerpool3) and is not part of the all-reduce group"),
    ):
        discover_worker(env)
    with pytest.raises(ConfigError, match=r"workerpool3 \(an evaluator\).*not a reducer.*workerpool2"):
        discover_reducer(env)


def test_vertex_workers_never_include_pool3() -> None:
    cluster = dict(VERTEX_CLUSTER, workerpool3=["ev-0:2222"])
    info = discover_worker(cluster_spec("workerpool1", 1, cluster))
    assert info.workers == WORKERS and info.world_size == 3


def test_vertex_missing_pool2() -> None:
    cluster = {k: v for k, v in VERTEX_CLUSTER.items() if k != "workerpool2"}
    with pytest.raises(ConfigError) as exc:
        discover_worker(cluster_spec("workerpool0", 0, cluster))
    msg = str(exc.value)
    assert "CLUSTER_SPEC has no workerpool2 (reducers): found pools workerpool0, workerpool1" in msg
    assert "add a reduction-server pool as workerPoolSpecs[2]" in msg
    # An empty pool counts as missing.
    cluster["workerpool2"] = []
    with pytest.raises(ConfigError, match="no workerpool2"):
        discover_worker(cluster_spec("workerpool0", 0, cluster))
    # ... unless the reducers are given explicitly.
    assert discover_worker(cluster_spec("workerpool0", 0, cluster), reducers=["r:1"]).reducers == ["r:1"]


def test_vertex_missing_pool0() -> None:
    cluster = {k: v for k, v in VERTEX_CLUSTER.items() if k != "workerpool0"}
    with pytest.raises(ConfigError) as exc:
        discover_worker(cluster_spec("workerpool1", 0, cluster))
    msg = str(exc.value)
    assert "CLUSTER_SPEC has no workerpool0 (primary): found pools workerpool1, workerpool2" in msg
    assert "workerPoolSpecs[0]" in msg


def test_vertex_task_pool_missing_or_index_out_of_range() -> None:
    cluster = {"workerpool0": ["p:2222"], "workerpool2": ["r:2222"]}
    with pytest.raises(
        ConfigError,
        match=r"task type is 'workerpool1' but the cluster has no 'workerpool1' pool: "
        r"found pools workerpool0, workerpool2",
    ):
        discover(cluster_spec("workerpool1", 0, cluster))
    with pytest.raises(ConfigError, match=r"task index 2 is out of range: pool 'workerpool2' has 2 entries"):
        discover(cluster_spec("workerpool2", 2))
    with pytest.raises(ConfigError, match=r"task index -1 is not a non-negative integer"):
        discover(cluster_spec("workerpool0", -1))


def test_vertex_unknown_task_type() -> None:
    with pytest.raises(ConfigError) as exc:
        discover(cluster_spec("workerpool7", 0))
    msg = str(exc.value)
    assert "task type 'workerpool7' is unknown" in msg
    assert "workerpool2 (reducers)" in msg and "workerpool3 (evaluators)" in msg


def test_vertex_reducer_calling_discover_worker() -> None:
    with pytest.raises(ConfigError) as exc:
        discover_worker(cluster_spec("workerpool2", 1))
    msg = str(exc.value)
    assert "this process is a reducer (workerpool2, index 1), not a worker" in msg
    assert "reduction-server serve" in msg


def test_vertex_worker_calling_discover_reducer() -> None:
    with pytest.raises(ConfigError) as exc:
        discover_reducer(cluster_spec("workerpool1", 0))
    msg = str(exc.value)
    assert "this process is workerpool1 (a worker) in CLUSTER_SPEC, not a reducer" in msg
    assert "must run as workerpool2" in msg


def test_vertex_bad_reducer_address_in_pool() -> None:
    cluster = dict(VERTEX_CLUSTER, workerpool2=["r0:2222", "r1"])
    with pytest.raises(ConfigError, match=r"CLUSTER_SPEC: bad reducer address: address 'r1' has no port"):
        discover_worker(cluster_spec("workerpool0", 0, cluster))


def test_vertex_duplicate_reducers() -> None:
    cluster = dict(VERTEX_CLUSTER, workerpool2=["r0:2222", "r0:2222"])
    with pytest.raises(ConfigError, match=r"reducer address 'r0:2222' is listed twice"):
        discover_worker(cluster_spec("workerpool0", 0, cluster))


# -- malformed JSON -----------------------------------------------------------------------------


@pytest.mark.parametrize("var", ["CLUSTER_SPEC", "TF_CONFIG"])
def test_bad_json(var: str) -> None:
    with pytest.raises(ConfigError) as exc:
        discover({var: '{"cluster": {"workerpool0": ['})
    msg = str(exc.value)
    assert f"{var} is not valid JSON" in msg
    assert '{"cluster"' in msg  # shows what was found


@pytest.mark.parametrize("var", ["CLUSTER_SPEC", "TF_CONFIG"])
def test_json_of_wrong_shape(var: str) -> None:
    with pytest.raises(ConfigError, match=f"{var} must be a JSON object with 'cluster' and 'task', found list"):
        discover({var: "[1, 2]"})
    with pytest.raises(ConfigError, match=f"{var} has no 'task' key: found keys cluster, environment"):
        discover({var: json.dumps({"cluster": {}, "environment": "cloud"})})
    with pytest.raises(ConfigError, match=r"pool 'worker' must be a list of 'host:port' strings, found 'a:1'"):
        discover({var: json.dumps({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}})})
    with pytest.raises(ConfigError, match=r"'task' has no 'type'"):
        discover({var: json.dumps({"cluster": {}, "task": {"index": 0}})})
    # The shape of 'cluster' and 'task' first, then the pools.
    with pytest.raises(ConfigError, match=f"{var} 'task' must be an object with 'type' and 'index', found 5"):
        discover({var: json.dumps({"cluster": {"worker": "a:1"}, "task": 5})})


def test_blank_cluster_spec_is_unset() -> None:
    env = {"CLUSTER_SPEC": "  ", **tf_config("worker", 0)}
    assert discover(env).source == "TF_CONFIG"


# -- the shared reader (csrc/cluster/spec.cc) on hostile input ----------------------------------


@pytest.mark.sanitize
def test_reader_returns_the_plain_structure() -> None:
    from reducer._native import core

    cluster = {"workerpool2": ["r:1"], "workerpool0": ["p:1"], "workerpool3": None}
    spec = core.cluster.parse_spec("CLUSTER_SPEC", json.dumps({"cluster": cluster, "task": {"type": "workerpool2"}}))
    assert (spec.source, spec.task_type, spec.index, spec.role) == ("CLUSTER_SPEC", "workerpool2", 0, "reducer")
    assert spec.pools == [("workerpool2", ["r:1"]), ("workerpool0", ["p:1"]), ("workerpool3", [])]  # document order
    assert spec.worker_pools == ["workerpool0", "workerpool1"] and spec.reducer_pool == "workerpool2"
    tf = core.cluster.parse_spec("TF_CONFIG", json.dumps({"cluster": TF_CLUSTER, "task": {"type": "ps", "index": "1"}}))
    assert (tf.task_type, tf.index, tf.role, tf.reducer_pool) == ("ps", 1, "reducer", "ps")
    assert tf.worker_pools == ["chief", "master", "worker"]
    assert core.cluster.spec_from_env({"CLUSTER_SPEC": " \t\n", "TF_CONFIG": ""}.get) is None


HOSTILE = [
    ("[" * 100 + "]" * 100, "CLUSTER_SPEC is not valid JSON (nested too deeply at offset 65)"),
    (
        '{"cluster": {}, "task": {}, "pad": "' + "x" * (1 << 20) + '"}',
        "CLUSTER_SPEC is not valid JSON (document larger than 1 MiB",
    ),
    ('{"cluster": {"workerpool0": ["\\ud800:1"]}, "task": {}}', "lone surrogate in a \\u escape at offset 36"),
    ('{"cluster": {"workerpool0": ["p\udcff:1"]}, "task": {}}', "invalid UTF-8 in a string at offset 31"),
    ('{"cluster": {"workerpool0": ["p:1"]}, "task": {"type": "workerpool0", "index": NaN}}', "not valid JSON"),
    ('{"cluster": {"workerpool0": ["p:1"]}, "task": {"type": "workerpool0", "index": 007}}', "leading zero"),
    (
        '{"cluster": {"workerpool0": ["p:1"]}, "task": {"type": ["workerpool0"], "index": 0}}',
        "CLUSTER_SPEC task type ['workerpool0'] is unknown: expected one of workerpool0 (primary)",
    ),
    (
        '{"cluster": {"workerpool0": ["p:1"]}, "task": {"type": "workerpool0", "index": 1e0}}',
        "CLUSTER_SPEC task index 1e0 is not a non-negative integer",
    ),
    (
        '{"cluster": {"workerpool0": ["p:1"]}, "task": {"type": "workerpool0", "index": true}}',
        "CLUSTER_SPEC task index True is not a non-negative integer",
    ),
    (
        '{"cluster": {"workerpool0": ["p:1"]}, "task": {"type": "workerpool0", "index": ' + "9" * 40 + "}}",
        "CLUSTER_SPEC task index 9223372036854775807 is out of range: pool 'workerpool0' has 1 entry",
    ),
]


@pytest.mark.sanitize
@pytest.mark.parametrize("text, expect", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_descriptions_are_config_errors(text: str, expect: str) -> None:
    """Bounded depth and size, strings valid UTF-8 (they become Python str), numbers as RFC 8259
    writes them, and a ConfigError, never another exception, for every shape."""
    with pytest.raises(ConfigError) as exc:
        discover({"CLUSTER_SPEC": text})
    assert expect in str(exc.value)
    assert len(str(exc.value)) < 600  # a long value is cut, not copied whole into the message


@pytest.mark.sanitize
def test_long_values_are_cut_in_messages() -> None:
    pool = [f"host-{i}.example:2222" for i in range(10_000)]
    with pytest.raises(ConfigError) as exc:
        discover(
            {"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": pool + [7]}, "task": {"type": "workerpool0"}})}
        )
    msg = str(exc.value)
    assert msg.startswith(
        "CLUSTER_SPEC pool 'workerpool0' must be a list of 'host:port' strings, found "
        "['host-0.example:2222', 'host-1.example:2222'"
    )
    assert msg.endswith("...") and len(msg) < 400


# -- TF_CONFIG ----------------------------------------------------------------------------------


def test_tf_chief_is_rank_0() -> None:
    info = discover_worker(tf_config("chief", 0))
    assert info.source == "TF_CONFIG"
    assert info.rank == 0 and info.world_size == 3
    assert info.workers == ["chief-0:2222", "worker-0:2222", "worker-1:2222"]
    assert info.reducers == ["ps-0:2222", "ps-1:2222"]
    assert info.task_type == "chief"


def test_tf_master_is_rank_0() -> None:
    cluster = {"master": ["m:2222"], "worker": ["w0:2222"], "ps": ["ps-0:2222"]}
    assert discover_worker(tf_config("master", 0, cluster)).rank == 0
    info = discover_worker(tf_config("worker", 0, cluster))
    assert info.rank == 1 and info.world_size == 2


@pytest.mark.parametrize("i", [0, 1])
def test_tf_worker_i(i: int) -> None:
    info = discover_worker(tf_config("worker", i))
    assert info.node_rank == 1 + i and info.rank == 1 + i


def test_tf_without_chief() -> None:
    cluster = {"worker": ["w0:1", "w1:1"], "ps": ["p:1"]}
    assert discover_worker(tf_config("worker", 0, cluster)).rank == 0
    assert discover_worker(tf_config("worker", 1, cluster)).world_size == 2


def test_tf_both_chief_and_master() -> None:
    cluster = {"chief": ["c:1"], "master": ["m:1"], "ps": ["p:1"]}
    with pytest.raises(ConfigError, match="both a 'chief' and a 'master' pool"):
        discover(tf_config("chief", 0, cluster))


def test_tf_ps_is_reducer() -> None:
    info = discover_reducer(tf_config("ps", 1))
    assert info.role == "reducer" and info.node_rank == 1 and info.num_nodes == 2 and info.bind_port == 2222
    with pytest.raises(ConfigError, match=r"this process is a reducer \(ps, index 1\), not a worker"):
        discover_worker(tf_config("ps", 1))


def test_tf_evaluator() -> None:
    env = tf_config("evaluator", 0)  # evaluators never appear in TF_CONFIG's cluster
    assert discover(env).role == "evaluator"
    with pytest.raises(
        ConfigError, match=re.escape("this process is an evaluator (evaluator) and is not part of the all-reduce group")
    ):
        discover_worker(env)
    with pytest.raises(ConfigError, match="not a reducer: reducers must run as ps"):
        discover_reducer(env)


def test_tf_missing_ps() -> None:
    cluster = {"chief": ["c:1"], "worker": ["w:1"]}
    with pytest.raises(ConfigError) as exc:
        discover_worker(tf_config("worker", 0, cluster))
    msg = str(exc.value)
    assert "TF_CONFIG has no 'ps' pool (reducers): found pools chief, worker" in msg


def test_tf_unknown_task_type() -> None:
    with pytest.raises(ConfigError) as exc:
        discover(tf_config("coordinator", 0))
    msg = str(exc.value)
    assert "TF_CONFIG task type 'coordinator' is unknown" in msg
    assert "ps (reducers)" in msg and "chief (primary)" in msg


# -- RS_* mode ----------------------------------------------------------------------------------


def test_rs_mode() -> None:
    info = discover(rs_env(RS_RANK="3", RS_WORLD_SIZE="4"))
    assert info == ClusterInfo(
        role="worker",
        reducers=["10.0.0.5:2222", "10.0.0.6:2223"],
        workers=[],
        node_rank=3,
        num_nodes=4,
        local_rank=0,
        local_world_size=1,
        rank=3,
        world_size=4,
        job_id="local",
        source="RS_REDUCERS",
    )


def test_rs_ranks_are_global_with_several_processes_per_node() -> None:
    info = discover(rs_env(RS_RANK="5", RS_WORLD_SIZE="8", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4"))
    assert info.rank == 5 and info.world_size == 8  # not multiplied by LOCAL_WORLD_SIZE
    assert info.node_rank == 1 and info.num_nodes == 2 and info.local_rank == 1


def test_rs_explicit_arguments_override_env() -> None:
    env = rs_env(RS_RANK="3", RS_WORLD_SIZE="4")
    info = discover(env, reducers=["[::1]:9000", "h:1"], rank=0, world_size=2)
    assert info.reducers == ["[::1]:9000", "h:1"] and info.rank == 0 and info.world_size == 2
    assert discover(env, reducer_port=7777).reducers == ["10.0.0.5:7777", "10.0.0.6:7777"]
    # Only arguments, no environment at all.
    info = discover({}, reducers="a:1,b:2", rank=1, world_size=2)
    assert info.source == "RS_REDUCERS" and info.reducers == ["a:1", "b:2"]


def test_rs_missing_rank() -> None:
    with pytest.raises(ConfigError) as exc:
        discover(rs_env(RS_WORLD_SIZE="4"))
    msg = str(exc.value)
    assert "RS_REDUCERS gives 2 reducer(s) but RS_RANK is not set" in msg
    assert "set RS_RANK and RS_WORLD_SIZE" in msg
    with pytest.raises(ConfigError, match="RS_RANK and RS_WORLD_SIZE are not set"):
        discover(rs_env())


def test_rs_rank_out_of_range() -> None:
    with pytest.raises(ConfigError, match=r"RS_RANK=4 is out of range for RS_WORLD_SIZE=4"):
        discover(rs_env(RS_RANK="4", RS_WORLD_SIZE="4"))
    with pytest.raises(ConfigError, match=r"rank=-1 is out of range for world_size=4"):
        discover(rs_env(), rank=-1, world_size=4)
    with pytest.raises(ConfigError, match=r"RS_WORLD_SIZE=0 is not valid: the group needs at least one worker"):
        discover(rs_env(RS_RANK="0", RS_WORLD_SIZE="0"))


def test_rs_not_an_integer() -> None:
    with pytest.raises(ConfigError, match=r"RS_RANK='three' is not valid"):
        discover(rs_env(RS_RANK="three", RS_WORLD_SIZE="4"))


def test_rs_empty_reducer_pool() -> None:
    with pytest.raises(ConfigError, match="RS_REDUCERS: the reducer pool is empty"):
        discover({"RS_REDUCERS": " , ", "RS_RANK": "0", "RS_WORLD_SIZE": "1"})
    with pytest.raises(ConfigError, match="reducers argument: the reducer pool is empty"):
        discover({}, reducers=[], rank=0, world_size=1)


def test_rs_bad_reducer_address() -> None:
    with pytest.raises(
        ConfigError,
        match=r"RS_REDUCERS: bad reducer address: address 'h:99999': port 99999 "
        r"is out of range",
    ):
        discover({"RS_REDUCERS": "a:1,h:99999", "RS_RANK": "0", "RS_WORLD_SIZE": "1"})


def test_nothing_found() -> None:
    with pytest.raises(ConfigError) as exc:
        discover({})
    assert str(exc.value).startswith(
        "no cluster found: set CLUSTER_SPEC (Vertex AI), TF_CONFIG, or RS_REDUCERS with RS_RANK and RS_WORLD_SIZE"
    )
    with pytest.raises(ConfigError, match="no cluster found"):
        discover_worker({})
    with pytest.raises(ConfigError, match="found RS_RANK and RS_WORLD_SIZE but RS_REDUCERS is not set"):
        discover({"RS_RANK": "0", "RS_WORLD_SIZE": "1"})


def test_discover_reducer_without_cluster() -> None:
    with pytest.raises(ConfigError) as exc:
        discover_reducer(rs_env(RS_RANK="0", RS_WORLD_SIZE="1"))
    msg = str(exc.value)
    assert "CLUSTER_SPEC (Vertex AI) and TF_CONFIG are not set" in msg and "--port" in msg


def test_default_env_is_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in cluster_spec("workerpool1", 1).items():
        monkeypatch.setenv(k, v)
    assert discover().rank == 2
    assert discover_worker().rank == 2


# -- several processes per node -----------------------------------------------------------------


def test_local_ranks_from_torchrun_env() -> None:
    env = cluster_spec("workerpool1", 1, LOCAL_RANK="3", LOCAL_WORLD_SIZE="8")
    info = discover_worker(env)
    assert info.node_rank == 2 and info.local_rank == 3 and info.local_world_size == 8
    assert info.rank == 2 * 8 + 3 and info.world_size == 3 * 8


def test_local_ranks_from_arguments_override_env() -> None:
    env = cluster_spec("workerpool0", 0, LOCAL_RANK="3", LOCAL_WORLD_SIZE="8")
    info = discover_worker(env, local_rank=1, local_world_size=2)
    assert info.rank == 1 and info.world_size == 6


def test_tf_local_ranks() -> None:
    info = discover_worker(tf_config("worker", 1, LOCAL_RANK="1", LOCAL_WORLD_SIZE="2"))
    assert info.rank == 2 * 2 + 1 and info.world_size == 6


def test_local_rank_out_of_range() -> None:
    with pytest.raises(ConfigError, match=r"LOCAL_RANK=4 is out of range for LOCAL_WORLD_SIZE=4"):
        discover_worker(cluster_spec("workerpool0", 0, LOCAL_RANK="4", LOCAL_WORLD_SIZE="4"))
    with pytest.raises(ConfigError, match=r"LOCAL_RANK=2 but LOCAL_WORLD_SIZE \(processes per node\) is not set"):
        discover_worker(cluster_spec("workerpool0", 0, LOCAL_RANK="2"))
    with pytest.raises(ConfigError, match=r"LOCAL_WORLD_SIZE=0 is not valid"):
        discover_worker(cluster_spec("workerpool0", 0), local_world_size=0)
    with pytest.raises(ConfigError, match=r"LOCAL_RANK='x' is not valid"):
        discover_worker(cluster_spec("workerpool0", 0, LOCAL_RANK="x"))
    # LOCAL_RANK=0 alone is fine (one process per node).
    assert discover_worker(cluster_spec("workerpool0", 0, LOCAL_RANK="0")).local_world_size == 1


def test_explicit_global_rank_in_cluster_mode() -> None:
    info = discover_worker(cluster_spec("workerpool1", 0), rank=5, world_size=6)
    assert info.rank == 5 and info.world_size == 6 and info.node_rank == 1
    with pytest.raises(ConfigError, match=r"rank=6 is out of range for world_size=6"):
        discover_worker(cluster_spec("workerpool1", 0), rank=6, world_size=6)
    with pytest.raises(ConfigError, match=r"rank=3 is out of range for world_size=3"):
        discover_worker(cluster_spec("workerpool0", 0), rank=3)


# -- job id -------------------------------------------------------------------------------------


def test_job_id_order() -> None:
    base = rs_env(RS_RANK="0", RS_WORLD_SIZE="1")
    assert discover(base).job_id == "local"
    assert discover({**base, "CLOUD_ML_JOB_ID": "123"}).job_id == "123"
    assert discover({**base, "CLOUD_ML_JOB_ID": "123", "RS_JOB_ID": "mine"}).job_id == "mine"
    assert discover({**base, "CLOUD_ML_JOB_ID": "123", "RS_JOB_ID": "mine"}, job_id="arg").job_id == "arg"
    assert discover(cluster_spec("workerpool0", 0, CLOUD_ML_JOB_ID="987")).job_id == "987"


# -- logging ------------------------------------------------------------------------------------


def test_logs_one_debug_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="reducer.cluster"):
        discover_worker(cluster_spec("workerpool1", 0))
    records = [r for r in caplog.records if r.name == "reducer.cluster"]
    assert len(records) == 1 and records[0].levelno == logging.DEBUG
    assert "CLUSTER_SPEC" in records[0].getMessage() and "rank=1/3" in records[0].getMessage()


# -- docs ---------------------------------------------------------------------------------------


def test_every_setting_is_documented() -> None:
    text = CONFIGURATION_MD.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    missing = [s.env for s in config.SETTINGS.values() if not any(f"`{s.env}`" in row for row in rows)]
    assert not missing, f"settings missing from the table in docs/configuration.md: {missing}"
    for s in config.SETTINGS.values():
        assert any(row.startswith(f"| `{s.name}` | `{s.env}` |") for row in rows), (
            f"docs/configuration.md: no row '| `{s.name}` | `{s.env}` |'"
        )


def test_docs_cluster_spec_example_matches_discovery() -> None:
    text = CONFIGURATION_MD.read_text(encoding="utf-8")
    blocks = re.findall(r"```json\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    vertex = discover({"CLUSTER_SPEC": blocks[0]})
    assert vertex.role == "reducer" and vertex.node_rank == 1 and vertex.reducers == REDUCERS
    tf = discover({"TF_CONFIG": blocks[1]})
    assert tf.role == "worker" and tf.node_rank == 2
