"""Addresses, ports and the job id (reducer/addresses.py), and the one rule for reading a setting
from the environment (reducer/config.py). Pure Python, no C++ extension."""

from __future__ import annotations

from typing import Any

import pytest

from reducer import config
from reducer.addresses import check_port, connect_host, format_address, parse_address, resolve_job_id
from reducer.errors import ConfigError

# -- addresses ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "addr, expected",
    [
        ("host:2222", ("host", 2222)),
        ("1.2.3.4:5", ("1.2.3.4", 5)),
        ("[::1]:5", ("::1", 5)),
        ("[fd00::7]:65535", ("fd00::7", 65535)),
        ("[fe80::1%eth0]:2222", ("fe80::1%eth0", 2222)),
        ("  cmle-training-workerpool2-ab-0:2222 ", ("cmle-training-workerpool2-ab-0", 2222)),
    ],
)
def test_parse_address(addr: str, expected: tuple) -> None:
    assert parse_address(addr) == expected
    host, port = expected
    assert parse_address(format_address(host, port)) == expected


@pytest.mark.parametrize(
    "addr, message",
    [
        ("host", "has no port: expected 'host:port'"),
        ("host:", "has no port"),
        (":2222", "has no host"),
        ("", "empty address"),
        ("host:0", "port 0 is out of range 1-65535"),
        ("host:65536", "port 65536 is out of range 1-65535"),
        ("host:-1", "port '-1' is not a number"),
        ("host:http", "port 'http' is not a number"),
        ("host:22 22", "contains whitespace"),
        ("::1:5", "unbracketed IPv6 address: write it as '[ipv6]:port'"),
        ("fd00::7", "unbracketed IPv6"),
        ("[::1]", "has no port: expected '[::1]:port'"),
        ("[::1]5", "has no port"),
        ("[::1:5", "has '[' without ']'"),
        ("[::1]:", "has no port"),
        ("[::1]:70000", "port 70000 is out of range"),
        ("[not-v6]:5", "'not-v6' inside [] is not an IPv6 address"),
        ("h]:5", "is malformed"),
    ],
)
def test_parse_address_errors(addr: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_address(addr)
    assert message in str(exc.value)
    if addr.strip():
        assert repr(addr) in str(exc.value)  # says what was found


def test_parse_address_not_a_string() -> None:
    with pytest.raises(ConfigError, match="address must be a string"):
        parse_address(2222)  # type: ignore[arg-type]


def test_format_address_brackets_ipv6_only() -> None:
    assert format_address("10.0.0.1", 2222) == "10.0.0.1:2222"
    assert format_address("cmle-training-workerpool2-ab-0", 1) == "cmle-training-workerpool2-ab-0:1"
    assert format_address("::1", 5) == "[::1]:5"
    assert format_address("fe80::1%eth0", 5) == "[fe80::1%eth0]:5"


@pytest.mark.parametrize(
    "bind_host, expected",
    [
        ("0.0.0.0", "127.0.0.1"),
        ("::", "127.0.0.1"),
        ("", "127.0.0.1"),
        ("127.0.0.2", "127.0.0.2"),
        ("::1", "::1"),
        ("reducer-0", "reducer-0"),
    ],
)
def test_connect_host(bind_host: str, expected: str) -> None:
    assert connect_host(bind_host) == expected


# -- ports: 1-65535 to connect to; a port to bind may be 0 (any free port) -----------------------


@pytest.mark.parametrize(
    "port, any_port, ok",
    [
        (1, False, True),
        (2222, False, True),
        (65535, False, True),
        (0, False, False),
        (65536, False, False),
        (-1, False, False),
        (0, True, True),
        (65535, True, True),
        (65536, True, False),
        (-1, True, False),
        (True, False, False),
        (True, True, False),
        ("2222", False, False),
        (2222.0, True, False),
        (None, True, False),
    ],
)
def test_check_port(port: Any, any_port: bool, ok: bool) -> None:
    if ok:
        assert check_port(port, "--port", any_port=any_port) == port
        return
    low = 0 if any_port else 1
    with pytest.raises(ConfigError) as exc:
        check_port(port, "RS_PORT", any_port=any_port)
    assert str(exc.value) == f"RS_PORT={port!r} is not a port number ({low}-65535)"


# -- the job id ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "explicit, env, expected",
    [
        (None, {}, "local"),
        (None, {"CLOUD_ML_JOB_ID": "123"}, "123"),
        (None, {"CLOUD_ML_JOB_ID": "123", "RS_JOB_ID": "mine"}, "mine"),
        ("arg", {"CLOUD_ML_JOB_ID": "123", "RS_JOB_ID": "mine"}, "arg"),
        ("", {"RS_JOB_ID": "mine"}, "mine"),  # an empty argument is no argument
        (None, {"RS_JOB_ID": "", "CLOUD_ML_JOB_ID": "123"}, "123"),  # blank variables count as unset
        (None, {"RS_JOB_ID": " ", "CLOUD_ML_JOB_ID": "  "}, "local"),
        (None, {"RS_JOB_ID": " mine\n"}, "mine"),  # trimmed, as the NCCL plugin does
        (None, {"CLOUD_ML_JOB_ID": " 123 "}, "123"),
        (" arg ", {}, "arg"),
    ],
)
def test_resolve_job_id(explicit: str | None, env: dict[str, str], expected: str) -> None:
    assert resolve_job_id(explicit, env) == expected


def test_resolve_job_id_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RS_JOB_ID", raising=False)
    monkeypatch.setenv("CLOUD_ML_JOB_ID", "vertex-42")
    assert resolve_job_id() == "vertex-42"
    monkeypatch.setenv("RS_JOB_ID", "env-job")
    assert resolve_job_id() == "env-job"


# -- reading a setting: argument, then variable (unset or blank: default), then default ------------


@pytest.mark.parametrize(
    "name, env, override, expected",
    [
        ("timeout", {}, None, 30.0),
        ("timeout", {"RS_TIMEOUT": "7.5"}, None, 7.5),
        ("timeout", {"RS_TIMEOUT": "7.5"}, 2.0, 2.0),
        ("timeout", {"RS_TIMEOUT": ""}, None, 30.0),
        ("timeout", {"RS_TIMEOUT": "   "}, None, 30.0),
        ("port", {"RS_PORT": ""}, None, None),
        ("port", {"RS_PORT": "3333"}, None, 3333),
        ("host", {"RS_HOST": " "}, None, "0.0.0.0"),
        ("socket_buffer", {"RS_SOCKET_BUFFER": ""}, None, 4 << 20),  # blank: the C++ default
        ("socket_buffer", {"RS_SOCKET_BUFFER": "4M"}, None, 4 << 20),
        ("reducers", {"RS_REDUCERS": "a:1, b:2"}, None, ["a:1", "b:2"]),
    ],
)
def test_config_get(name: str, env: dict[str, str], override: Any, expected: Any) -> None:
    assert config.get(name, override, env) == expected


def test_config_get_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RS_STREAMS", "3")
    assert config.get("streams") == 3
    monkeypatch.setenv("RS_STREAMS", "")
    assert config.get("streams") == 1
    assert config.env_text("streams") is None
    monkeypatch.setenv("RS_STREAMS", " 2 ")
    assert config.env_text("streams") == " 2 " and config.get("streams") == 2


def test_config_get_names_the_bad_variable() -> None:
    with pytest.raises(ConfigError, match=r"RS_TIMEOUT='soon' is not valid"):
        config.get("timeout", None, {"RS_TIMEOUT": "soon"})


def test_blank_auth_token_variables_are_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("RS_AUTH_TOKEN", "")
    monkeypatch.setenv("RS_AUTH_TOKEN_FILE", " ")
    assert config.resolve_auth_token() is None
    secret = tmp_path / "token"
    secret.write_text("s3cret\n", encoding="utf-8")
    monkeypatch.setenv("RS_AUTH_TOKEN_FILE", str(secret))
    assert config.resolve_auth_token() == "s3cret"
    monkeypatch.setenv("RS_AUTH_TOKEN", "direct")
    assert config.resolve_auth_token() == "direct"
