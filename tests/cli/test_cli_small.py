"""The small things of issue 24 point 7, as a user reads them: `--version`, `launch` usage,
`bench` errors that name the flag, singular counts, and a loopback bench summary that says what
limits the run instead of a bare link theory."""

from __future__ import annotations

import re
from typing import Any

import pytest

from reducer import __version__
from reducer.cli.main import build_parser, main


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"reduction-server {__version__}"


def test_launch_usage_shows_reducers_as_optional() -> None:
    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions if a.dest == "command")  # noqa: SLF001
    usage = sub.choices["launch"].format_usage()
    assert "--workers W [--reducers R]" in usage, usage
    assert not re.search(r"(?<!\[)--reducers R(?!\])", usage), usage
    # and it is optional: the default is one reducer
    args = parser.parse_args(["launch", "--workers", "2", "--", "python", "x.py"])
    assert args.reducers == 1


@pytest.mark.parametrize("flag", ["--sizes", "--iters-bytes", "--warmup-bytes", "--ring-chunk-bytes"])
def test_bench_bad_size_names_the_flag(flag: str, capsys) -> None:
    assert main(["bench", flag, "1X"]) == 2
    err = capsys.readouterr().err
    assert f"bad {flag} '1X': expected a size in bytes" in err and "4K, 64M" in err, err
    assert "convert" not in err


def test_bench_bad_size_range_names_the_flag(capsys) -> None:
    assert main(["bench", "--sizes", "64K:4K"]) == 2
    err = capsys.readouterr().err
    assert "bad --sizes '64K:4K'" in err and "MIN <= MAX" in err, err


# -- bench report ---------------------------------------------------------------------------------


def _rows(workers: int, reducers: int, cpu: float | None = 97.0) -> list[dict[str, Any]]:
    rows = []
    for algo, us in (("rs", 200.0), ("ring", 100.0)):
        for size, pct in ((4096, None), (1 << 20, cpu)):
            rows.append(
                dict(
                    algo=algo,
                    size=size,
                    count=size // 4,
                    dtype="float32",
                    op="sum",
                    time_us=us,
                    algbw=1.0,
                    busbw=1.0,
                    wrong=0,
                    workers=workers,
                    reducers=reducers,
                    cpu_percent=pct,
                )
            )
    return rows


def test_plural() -> None:
    from reducer.bench.report import plural

    assert [plural(n, "thread") for n in (0, 1, 2)] == ["0 threads", "1 thread", "2 threads"]


def test_counts_of_one_are_singular() -> None:
    from reducer.bench import report

    title = report.format_algo_table("rs", _rows(2, 1)[:2], 2, 1).splitlines()[0]
    assert "2 workers -> 1 reducer -> 2 workers" in title, title
    assert "n = 2 workers, 1 reducer" in report.format_summary(_rows(2, 1), 2, 1)
    assert "1 reducers" not in report.format_summary(_rows(2, 1), 2, 1, emulate_gbps=1.0)


def test_loopback_summary_says_the_cpu_limits_the_run() -> None:
    from reducer.bench import report

    text = report.format_summary(_rows(4, 2), 4, 2)
    assert "# limit: loopback" in text and "the CPU does" in text and "does not apply" in text, text
    assert "rs/ring would be 0.75x" in text  # (n-1)/n: rs copies 2WS bytes, the ring 2(n-1)/n WS
    header = next(ln for ln in text.splitlines() if "size(B)" in ln).split()
    assert "theory" not in header and "theory@R" not in header and header[-1] == "cpu%", header
    body = [ln.split() for ln in text.splitlines() if not ln.startswith("#")]
    assert [(r[0], r[3], r[-1]) for r in body] == [("4096", "0.50x", "-"), ("1048576", "0.50x", "97")]


def test_emulated_summary_keeps_the_link_theory() -> None:
    from reducer.bench import report

    text = report.format_summary(_rows(4, 2), 4, 2, emulate_gbps=1.0)
    assert "limit: loopback" not in text and "# theory = 2(n-1)/n = 1.500" in text
    header = next(ln for ln in text.splitlines() if "size(B)" in ln).split()
    assert header[5:7] == ["theory", "theory@R"] and "cpu%" not in header, header


def test_reducer_log_lines_count_in_the_singular(caplog):
    """'with 1 thread', '1 stream', 'stopped after 1 round': not '1 threads' (issue 24 point 7)."""
    import logging

    import numpy as np

    import reducer
    from reducer.wording import plural

    caplog.set_level(logging.INFO, logger="reducer.core")
    with reducer.ReducerServer(host="127.0.0.1", port=0, threads=1).start() as srv:
        comm = reducer.Communicator([f"127.0.0.1:{srv.port}"], rank=0, world_size=1, streams=1, group="plural")
        x = np.ones(16, dtype=np.float32)
        comm.allreduce(x)
        comm.close()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "with 1 thread," in text or text.count("with 1 thread") >= 1, text
    assert "1 threads" not in text and "1 streams" not in text, text
    assert "(world size 1, 1 stream, chunk" in text, text
    assert plural(1, "round") == "1 round" and plural(0, "round") == "0 rounds"


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["serve", "--port", "abc"], "--port"),
        (["serve", "--bogus"], "--bogus"),
        (["launch", "--workers", "x"], "--workers"),
        (["bogus"], "bogus"),
    ],
)
def test_bad_arguments_are_one_line_naming_the_flag(argv: list[str], names: str, capsys) -> None:
    """Issue 30 point 4: argparse's own errors print the whole usage first (14 lines for
    `serve --port abc`) and an unknown flag of a subcommand was the top level's error."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert names in err and "error:" in err, err
    if argv[0] != "bogus":
        assert err.startswith(f"reduction-server {argv[0]}: error:"), err  # the subcommand's, not the top level's


def test_launch_keeps_the_commands_own_flags(monkeypatch) -> None:
    """The one-line errors parse known arguments first: flags after `--` stay the command's."""
    seen: dict[str, Any] = {}
    monkeypatch.setattr("reducer.cli.launch.launch", lambda *a, **k: seen.update(args=a, kw=k) or 0)
    assert main(["launch", "--workers", "1", "--", "python", "x.py", "--bogus", "1"]) == 0
    assert "--bogus" in repr(seen), seen


def test_status_without_a_cluster_says_what_to_pass(capsys, monkeypatch) -> None:
    for var in ("CLUSTER_SPEC", "TF_CONFIG", "RS_REDUCERS"):
        monkeypatch.delenv(var, raising=False)
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert "no reducers to ask: pass their control addresses" in err, err
    assert "RS_RANK" not in err and "world_size=" not in err, err  # not the library's Python wording
    assert main(["status", "127.0.0.1:1", "--auth-token-file", "/nonexistent/secret"]) == 2
    err = capsys.readouterr().err
    assert "cannot read auth token file" in err and "control addresses" not in err, err


def test_nccl_plugin_install_into_a_bad_directory(capsys) -> None:
    assert main(["nccl-plugin", "--install", "/proc/nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "reduction-server nccl-plugin: error: cannot install into /proc/nope: No such file or directory", err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["serve", "--host", "999.1.1.1", "--port", "0"], "--host '999.1.1.1' (or RS_HOST) is not an address"),
        (["serve", "--threads", "-3", "--port", "0"], "--threads=-3 must be at least 1"),
        (["plan", "--workers", "4", "--worker-gbps", "0", "--predict-size", "0"], "--worker-gbps=0 must be a positive"),
        (["plan", "--workers", "0", "--worker-gbps", "10", "--predict-size", "0"], "--workers=0 must be at least 1"),
        (["plan", "--workers", "4", "--predict-size", "0"], "give --worker-gbps or --machine-type"),
        (["launch", "--workers", "1", "--", "python", "missing-script.py"], "'missing-script.py' not found"),
        (["launch", "--workers", "1", "--", "no-such-program-here"], "'no-such-program-here': no such program"),
        (
            ["vertex-job", "--workers", "2", "--machine-type", "n1-standard-8", "--image", "w"]
            + ["--reducer-image", "r", "--env", "NOVALUE"],
            "--env 'NOVALUE': expected NAME=VALUE",
        ),
    ],
)
def test_bad_values_are_one_line_exit_2_before_anything_starts(argv: list[str], expected: str, capsys) -> None:
    """Issue 30 point 4: each of these started something, printed an INFO line, named a Python
    argument or exited 1; now one line naming the flag, exit 2, nothing started."""
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.err.count("\n") == 1 and expected in captured.err, captured.err
    assert "[reducer" not in captured.out + captured.err and "INFO" not in captured.err


def test_plan_takes_a_worker_machine_type(capsys) -> None:
    """Issue 30 point 3: `plan --machine-type` works the bandwidth out as vertex-job does."""
    assert main(["plan", "--workers", "16", "--machine-type", "n1-highmem-96", "--predict-size", "0"]) == 0
    out = capsys.readouterr().out
    assert "worker bandwidth: n1-highmem-96 without GPUs" in out and "16 x 32 Gbps" in out, out


def test_vertex_job_sets_the_environment_of_every_pool(capsys) -> None:
    """Issue 30 point 3: docs/deploy.md says to set RS_AUTH_TOKEN(_FILE) in both images."""
    import json

    argv = ["vertex-job", "--workers", "3", "--machine-type", "n1-standard-8", "--image", "w", "--reducer-image", "r"]
    assert main([*argv, "--env", "RS_AUTH_TOKEN_FILE=/secret/token", "--env", "A=b=c", "--format", "json"]) == 0
    pools = json.loads(capsys.readouterr().out)["workerPoolSpecs"]
    want = [{"name": "RS_AUTH_TOKEN_FILE", "value": "/secret/token"}, {"name": "A", "value": "b=c"}]
    assert [p["containerSpec"]["env"] for p in pools] == [want, want, want]
