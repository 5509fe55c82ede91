"""Frame integrity (docs/security.md "Frame integrity mode", docs/protocol.md "Frame integrity").

All-reduces stay correct with integrity on; an on-path attacker (tests/mitm_proxy.py, a proxy
between one worker and the reducer) who flips a bit of a header or a payload, replays, drops or
reorders a frame makes the round fail with the integrity error, while the reducer keeps serving
other groups; without integrity the same flip goes unnoticed (the check is what catches it).
Workers run in threads of this process (the core releases the GIL); every wait is bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from attack_tools import (
    DATA,
    ERROR,
    FRAME,
    HELLO_INTEGRITY,
    RESULT,
    TAG_BYTES,
    RawWorker,
    Status,
    encode_hello,
    frame,
    frame_key,
    gmac,
    job_key,
    recv_exact,
    seal,
)
from attack_tools import TO_REDUCER as DIR_TO_REDUCER
from attack_tools import TO_WORKER as DIR_TO_WORKER
from mitm_proxy import TO_REDUCER, TO_WORKER, Proxy, drop, flip, replay, swap, untouched
from tasks import check, make_data

import reducer
from reducer._native import core as _core
from reducer.errors import ConfigError, ProtocolError, ReductionError

SECRET = "integrity-secret"
JOB = "job-i"
INTEGRITY_ERROR = "frame integrity check failed"
N = 1 << 18  # float32 elements: 1 MiB on one reducer and stream, in chunks of
CHUNK = _core.chunk_for(4 * N, 1 << 20)  # the client's rule (protocol/plan.h): 16 KiB


def run_group(
    addresses: Sequence[Sequence[str]],
    group: str,
    fn: Callable[[reducer.Communicator, int], Any],
    timeout: float = 20.0,
    **kw: Any,
) -> list[Any]:
    """One Communicator per rank (rank r talks to addresses[r]) running fn(comm, rank) in a thread;
    the results, or the exception each rank raised."""
    world = len(addresses)
    out: list[Any] = [None] * world

    def rank_main(r: int) -> None:
        try:
            comm = reducer.Communicator(
                list(addresses[r]),
                r,
                world,
                group=group,
                job_id=JOB,
                timeout=timeout,
                connect_timeout=timeout,
                chunk_bytes=CHUNK,
                **kw,
            )
            try:
                out[r] = fn(comm, r)
            finally:
                comm.close()
        except BaseException as exc:  # reported per rank
            out[r] = exc

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=3 * timeout)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    return out


def allreduce_f32(comm: reducer.Communicator, rank: int) -> np.ndarray:
    a = make_data("float32", N, rank)
    comm.allreduce(a)
    return a


def assert_serves(address: str, group: str, **kw: Any) -> None:
    """A fresh group on `address` all-reduces correctly (the reducer survived)."""
    out = run_group([[address]] * 2, group, allreduce_f32, auth_token=SECRET, **kw)
    for r in out:
        assert isinstance(r, np.ndarray), r
        assert check(r, "float32", "sum", N, 2) is None


# ---- correctness with integrity on ------------------------------------------------------------


@pytest.mark.sanitize
@pytest.mark.parametrize(
    "dtype,compression", [("float32", None), ("int64", None), ("int32", None), ("float32", "bf16")]
)
def test_allreduce_correct_with_integrity(dtype, compression):
    # Two reducers, two streams each: every link protected; several rounds and sizes.
    sizes = (1, 1023, 100_003, N)
    with (
        reducer.ReducerServer(host="127.0.0.1", port=0, threads=2, auth_token=SECRET) as a,
        reducer.ReducerServer(host="127.0.0.1", port=0, threads=2, auth_token=SECRET) as b,
    ):
        assert a.limits()["integrity"] == "on"  # offered by default with a secret

        def rounds(comm: reducer.Communicator, rank: int) -> list[np.ndarray]:
            results = []
            for n in sizes:
                x = make_data(dtype, n, rank)
                comm.allreduce(x, compression=compression)
                results.append(x)
            return results

        out = run_group([[a.address, b.address]] * 2, "g", rounds, auth_token=SECRET, integrity="on", streams=2)
        for r in out:
            assert isinstance(r, list), r
            for n, got in zip(sizes, r):
                if compression is None:
                    assert check(got, dtype, "sum", n, 2) is None
                else:
                    from compression_tasks import expected

                    want = expected([make_data(dtype, n, k) for k in range(2)], compression, "sum")
                    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        assert a.stats()["errors"] == 0 and b.stats()["errors"] == 0


# ---- an on-path attacker ----------------------------------------------------------------------

PAYLOAD = FRAME.size + TAG_BYTES  # first payload byte of a protected frame
CASES = {
    # worker -> reducer: the reducer detects it and fails the group with the reason
    "data_payload_bit": (flip(TO_REDUCER, 1, PAYLOAD + 5, bit=3), True),
    "data_header_round_bit": (flip(TO_REDUCER, 1, 8), True),
    "data_header_length_bit": (flip(TO_REDUCER, 1, 5, bit=1), True),
    "data_trailer_bit": (flip(TO_REDUCER, 1, PAYLOAD + CHUNK + 2), True),
    "data_replayed": (replay(TO_REDUCER, 1), True),
    "data_dropped": (drop(TO_REDUCER, 1), True),
    "data_reordered": (swap(TO_REDUCER, 1), True),
    # reducer -> worker: the worker detects it
    "result_payload_bit": (flip(TO_WORKER, 1, PAYLOAD + 100, bit=7), False),
    "result_header_bit": (flip(TO_WORKER, 0, 32, bit=4), False),
    "result_dropped": (drop(TO_WORKER, 1), False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tampering_fails_the_round_with_the_integrity_error(case):
    tamper, to_reducer = CASES[case]
    with (
        reducer.ReducerServer(host="127.0.0.1", port=0, threads=2, auth_token=SECRET) as srv,
        Proxy(srv.port, tags=True, tamper=tamper) as proxy,
    ):
        # Rank 0 goes through the attacker, rank 1 straight to the reducer.
        out = run_group(
            [[proxy.address], [srv.address]], "attacked", allreduce_f32, auth_token=SECRET, integrity="on", timeout=10.0
        )
        assert proxy.tampered >= 1
        for r in out:
            assert isinstance(r, ReductionError), r  # the round failed on every rank
        if to_reducer:
            # The reducer refused the frame before using it and failed the group with the reason,
            # which it also sends to every member in an ERROR frame (best effort: closing a
            # connection whose input is unread resets it, which can overtake that frame).
            failed = [g["last_error"] for g in srv.group_stats() if g["group"] == "attacked"]
            assert failed and INTEGRITY_ERROR in failed[0], failed
            assert any(INTEGRITY_ERROR in str(r) for r in out), out
            assert srv.stats()["errors"] >= 1
        else:  # the worker checked the result itself
            assert isinstance(out[0], ProtocolError) and INTEGRITY_ERROR in str(out[0]), out[0]
        # The reducer survived and serves another group, correctly.
        assert_serves(srv.address, "after-" + case, integrity="on")


def test_untouched_proxy_changes_nothing():
    # The proxy itself is transparent: the tamper tests fail because of the tampering.
    with (
        reducer.ReducerServer(host="127.0.0.1", port=0, auth_token=SECRET) as srv,
        Proxy(srv.port, tags=True, tamper=untouched) as proxy,
    ):
        out = run_group([[proxy.address], [srv.address]], "clean", allreduce_f32, auth_token=SECRET, integrity="on")
        for r in out:
            assert isinstance(r, np.ndarray), r
            assert check(r, "float32", "sum", N, 2) is None
        assert proxy.frames[TO_REDUCER] >= 16 and proxy.tampered == 0


def test_without_integrity_the_same_flip_goes_unnoticed():
    # Authentication alone protects the handshake only: a flipped payload bit changes the sum.
    def ints(comm: reducer.Communicator, rank: int) -> np.ndarray:
        a = make_data("int32", N, rank)
        comm.allreduce(a)
        return a

    elems = CHUNK // 4
    with (
        reducer.ReducerServer(host="127.0.0.1", port=0, auth_token=SECRET, integrity="off") as srv,
        Proxy(srv.port, tags=False, tamper=flip(TO_REDUCER, 1, FRAME.size + 2, bit=5)) as proxy,
    ):
        out = run_group([[proxy.address], [srv.address]], "plain", ints, auth_token=SECRET, integrity="off")
        assert proxy.tampered == 1
        want = make_data("int32", N, 0).astype(np.int64) + make_data("int32", N, 1)
        for r in out:
            assert isinstance(r, np.ndarray), r  # no error anywhere...
            wrong = np.flatnonzero(r != want.astype(np.int32))
            assert list(wrong) == [elems], wrong  # ...and element 0 of chunk 1 is wrong on every rank
        assert srv.stats()["errors"] == 0


# ---- negotiation and settings -----------------------------------------------------------------


def test_required_mode_refuses_a_worker_that_does_not_ask():
    with reducer.ReducerServer(host="127.0.0.1", port=0, auth_token=SECRET, integrity="required") as srv:
        assert srv.limits()["integrity"] == "required"
        with pytest.raises(ConfigError, match="requires frame integrity"):
            reducer.Communicator([srv.address], 0, 1, job_id=JOB, auth_token=SECRET, timeout=5, connect_timeout=5)
        # A raw hello without the flag gets status IntegrityMismatch (9), with a valid reply MAC.
        key = job_key(SECRET.encode(), JOB.encode())
        w = RawWorker(srv.port, job=JOB.encode(), key=key)
        try:
            r = w.reply(timeout=5)
            assert r.status == Status.INTEGRITY_MISMATCH and "requires frame integrity" in r.message
            assert w.reply_mac_ok(r)
        finally:
            w.close()
        assert_serves(srv.address, "asks", integrity="on")


def test_reducer_with_integrity_off_refuses_a_worker_that_asks():
    with reducer.ReducerServer(host="127.0.0.1", port=0, auth_token=SECRET, integrity="off") as srv:
        with pytest.raises(ConfigError, match="does not offer"):
            reducer.Communicator(
                [srv.address], 0, 1, job_id=JOB, auth_token=SECRET, integrity="on", timeout=5, connect_timeout=5
            )


def test_integrity_needs_authentication(monkeypatch):
    with reducer.ReducerServer(host="127.0.0.1", port=0) as srv:
        assert srv.limits()["integrity"] == "off"  # no secret: not offered
        with pytest.raises(ConfigError, match="needs authentication"):
            reducer.Communicator([srv.address], 0, 1, integrity="on", timeout=5, connect_timeout=5)
    with pytest.raises(ConfigError, match="needs authentication"):
        reducer.ReducerServer(host="127.0.0.1", port=0, integrity="required")
    from reducer._native import core

    with pytest.raises(ConfigError, match="needs authentication"):  # the core checks it too
        core.Server("127.0.0.1", 0, 1, "", integrity="on").start()
    monkeypatch.setenv("RS_INTEGRITY", "sometimes")
    with pytest.raises(ConfigError, match="RS_INTEGRITY"):
        reducer.ReducerServer(host="127.0.0.1", port=0, auth_token=SECRET)
    monkeypatch.setenv("RS_INTEGRITY", "required")
    with reducer.ReducerServer(host="127.0.0.1", port=0, auth_token=SECRET) as srv:
        assert srv.limits()["integrity"] == "required"
        assert_serves(srv.address, "from-env")  # the workers read RS_INTEGRITY too


def test_serve_cli_refuses_integrity_without_a_secret(capsys, monkeypatch):
    from reducer.cli.main import main

    for var in ("RS_AUTH_TOKEN", "RS_AUTH_TOKEN_FILE", "CLUSTER_SPEC", "TF_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    assert main(["serve", "--host", "127.0.0.1", "--port", "0", "--integrity", "on", "--control-port", "off"]) == 2
    assert "needs authentication" in capsys.readouterr().err


# ---- the wire format, checked with an independent AES-GCM (docs/protocol.md) -------------------


def _protected_raw_worker(port: int, group: bytes) -> RawWorker:
    key = job_key(SECRET.encode(), JOB.encode())
    w = RawWorker(port, job=JOB.encode(), group=group, key=key, chunk=4096, send_hello=False)
    w.sock.sendall(
        encode_hello(
            w.challenge.nonce,
            world=1,
            rank=0,
            job=JOB.encode(),
            group=group,
            key=key,
            chunk=4096,
            flags=HELLO_INTEGRITY,
            worker_nonce=w.worker_nonce,
        )
    )
    r = w.reply(timeout=5)
    assert r.status == Status.OK and w.reply_mac_ok(r), r
    w.up = frame_key(key, DIR_TO_REDUCER, w.worker_nonce, w.challenge.nonce)
    w.down = frame_key(key, DIR_TO_WORKER, w.worker_nonce, w.challenge.nonce)
    return w


def _read_protected(w: RawWorker, n: int) -> tuple:
    header = recv_exact(w.sock, FRAME.size)
    htag = recv_exact(w.sock, TAG_BYTES)
    length = FRAME.unpack(header)[4]
    payload = recv_exact(w.sock, length)
    trailer = recv_exact(w.sock, TAG_BYTES)
    assert htag == gmac(w.down, DIR_TO_WORKER, b"H", n, header)
    assert trailer == gmac(w.down, DIR_TO_WORKER, b"P", n, header + payload)
    return FRAME.unpack(header), payload


def test_wire_format_matches_the_protocol_document():
    with reducer.ReducerServer(host="127.0.0.1", port=0, auth_token=SECRET) as srv:
        w = _protected_raw_worker(srv.port, b"raw-ok")
        try:
            values = [np.arange(16, dtype=np.float32) * (k + 1) for k in range(3)]
            for n, v in enumerate(values):  # three rounds: frame numbers 0, 1, 2 on both directions
                hdr = frame(DATA, v.nbytes, round_=n, total=v.nbytes)
                w.sock.sendall(seal(w.up, DIR_TO_REDUCER, n, hdr, v.tobytes()))
                fields, payload = _read_protected(w, n)
                assert fields[0] == RESULT and fields[5] == n
                assert np.array_equal(np.frombuffer(payload, np.float32), v)
        finally:
            w.close()
        # A frame sealed with the right key but the wrong frame number (a replay of frame 0 as
        # frame 1) is refused with an ERROR frame, itself protected.
        w = _protected_raw_worker(srv.port, b"raw-replay")
        try:
            v = np.ones(16, np.float32)
            hdr = frame(DATA, v.nbytes, round_=0, total=v.nbytes)
            w.sock.sendall(seal(w.up, DIR_TO_REDUCER, 0, hdr, v.tobytes()))
            _read_protected(w, 0)
            w.sock.sendall(seal(w.up, DIR_TO_REDUCER, 0, frame(DATA, v.nbytes, round_=1, total=v.nbytes), v.tobytes()))
            fields, text = _read_protected(w, 1)
            assert fields[0] == ERROR and INTEGRITY_ERROR in text.decode(), text
        finally:
            w.close()
        assert_serves(srv.address, "after-raw", integrity="on")


@pytest.mark.sanitize
def test_frame_tags_match_an_independent_aes_gcm():
    # The core's tags (OpenSSL EVP AES-256-GCM) against pyca/cryptography's AES-GCM, from the
    # definition in docs/protocol.md: both directions, several frame numbers and payload sizes.
    from reducer._native import core

    rng = np.random.default_rng(5)
    for direction in (DIR_TO_REDUCER, DIR_TO_WORKER):
        key = rng.bytes(32)
        for n, size in ((0, 0), (1, 1), (2, 15), (7, 4096 + 3), (300, 1 << 20)):
            header = rng.bytes(FRAME.size)
            payload = rng.bytes(size)
            htag, trailer = core.frame_tags(key, direction, n, header, payload)
            assert htag == gmac(key, direction, b"H", n, header)
            assert trailer == gmac(key, direction, b"P", n, header + payload)
            if size:
                flipped = bytearray(payload)
                flipped[size // 2] ^= 0x10
                htag2, trailer2 = core.frame_tags(key, direction, n, header, bytes(flipped))
                assert htag2 == htag and trailer2 != trailer  # the header tag covers the header only


def test_goodbye_and_shutdown_frames_are_protected():
    from attack_tools import ERR_SHUTDOWN, wait_until

    srv = reducer.ReducerServer(host="127.0.0.1", port=0, auth_token=SECRET).start()
    try:
        # A worker's BYE carries its tags: the reducer sees a clean leave, not a failed check.
        comm = reducer.Communicator(
            [srv.address],
            0,
            1,
            group="bye",
            job_id=JOB,
            auth_token=SECRET,
            integrity="on",
            timeout=10,
            connect_timeout=10,
        )
        x = np.arange(10, dtype=np.float32)
        comm.allreduce(x)
        comm.close()
        assert wait_until(lambda: srv.stats()["connections"] == 0, 10)
        assert srv.stats()["errors"] == 0
        assert all(INTEGRITY_ERROR not in g["last_error"] for g in srv.group_stats())
        # The reducer's ERROR Shutdown, sent as it stops, carries its tags too.
        w = _protected_raw_worker(srv.port, b"raw-stop")
        try:
            srv.stop()
            fields, text = _read_protected(w, 0)
            assert fields[0] == ERROR and fields[3] == ERR_SHUTDOWN and b"shutting down" in text
        finally:
            w.close()
    finally:
        srv.stop()


def test_transport_unit_tests_in_cpp(tmp_path):
    # tests/cpp/test_frame_auth.cc: writer -> reader over a socketpair with 4 KiB socket buffers,
    # every 7th byte of a frame flipped, replay / drop / reorder, no libcrypto allocation per frame.
    from cpp_build import build_and_run, kernel_sources

    sources = [
        "tests/cpp/test_frame_auth.cc",
        "csrc/net/frame_auth.cc",
        "csrc/net/frame_io.cc",
        "csrc/net/socket.cc",
        "csrc/common/settings.cc",
        "csrc/protocol/auth.cc",
        "csrc/protocol/hmac.cc",
        "csrc/protocol/wire.cc",
        "csrc/protocol/plan.cc",
        "csrc/common/common.cc",
        "csrc/common/text.cc",
    ]
    out = build_and_run(tmp_path, "test_frame_auth", sources + kernel_sources(), libs=["crypto"])
    assert "libcrypto allocations over 1000 frames: 0" in out


def test_unknown_hello_flags_are_refused():
    key = job_key(SECRET.encode(), JOB.encode())
    with reducer.ReducerServer(host="127.0.0.1", port=0, auth_token=SECRET) as srv:
        w = RawWorker(srv.port, job=JOB.encode(), key=key, send_hello=False)
        try:
            w.sock.sendall(
                encode_hello(
                    w.challenge.nonce,
                    world=1,
                    rank=0,
                    job=JOB.encode(),
                    group=b"g",
                    key=key,
                    flags=HELLO_INTEGRITY | 2,
                    worker_nonce=w.worker_nonce,
                )
            )
            r = w.reply(timeout=5)
            assert r.status == Status.BAD_HELLO and "unknown hello flags" in r.message, r
        finally:
            w.close()
