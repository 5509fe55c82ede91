"""The cut rule of tensor fusion (reducer/fusion/planner.py) and the diagnosis's field table
(reducer/fusion/diagnosis.py), without threads or sockets.

A sequence is written as a string of steps: ``"40 40f 100 i8 F"`` means entries of 40 bytes
(float32 sum), 40 bytes float64 (``f``), 100 bytes, an int32 entry of 8 bytes (``i``) and then
an agreed flush (``F``); ``c`` is float32 sent as bfloat16 (compression), ``b`` a bfloat16
tensor. Cuts are written as ``"0,1"`` (a fused round of entries 0 and 1) or ``"2!"`` (entry 2
alone, in place).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from reducer.fusion.diagnosis import FIELDS, Described, differences, fingerprint, round_tag
from reducer.fusion.planner import ALONE, FUSED, Cut, Planner

# (dtype, wire dtype, op) of each entry kind
_KEYS = {
    "": ("float32", "float32", "sum"),
    "f": ("float64", "float64", "sum"),
    "i": ("int32", "int32", "sum"),
    "m": ("float32", "float32", "max"),
    "c": ("float32", "bfloat16", "sum"),
    "b": ("bfloat16", "bfloat16", "sum"),
}


@dataclass
class E:
    index: int
    nbytes: int
    src: str
    wire: str
    op: str


def _entries(spec: str) -> list[object]:
    """Steps of `spec`: E for entries, "F" for a flush."""
    steps: list[object] = []
    n = 0
    for word in spec.split():
        if word == "F":
            steps.append("F")
            continue
        key = word.rstrip("0123456789")
        steps.append(E(n, int(word[len(key) :]), *_KEYS[key]))
        n += 1
    return steps


def _show(cut: Cut) -> str:
    ids = ",".join(str(e.index) for e in cut.entries)
    return ids + "!" if cut.kind == ALONE else ids


def _plan(threshold: int, spec: str) -> list[str]:
    planner = Planner(threshold)
    cuts: list[Cut] = []
    for step in _entries(spec):
        cuts += planner.flush() if step == "F" else planner.add(step)
    return [_show(c) for c in cuts]


@pytest.mark.parametrize(
    "threshold, spec, expected",
    [
        # an entry that would overflow the buffer cuts it first; the buffer stays open otherwise
        (100, "40 40 40", ["0,1"]),
        (100, "40 40 40 F", ["0,1", "2"]),
        # a buffer exactly full is cut at once
        (100, "60 40 10", ["0,1"]),
        (100, "100", ["0!"]),
        # at least `threshold` bytes: alone, in place; the open buffer of its key is not cut by it
        (100, "30 150 30 F", ["1!", "0,2"]),
        (100, "99 1", ["0,1"]),
        # (dtype, wire dtype, op) keys fill separate buffers
        (100, "40 f40 40 f40 40 f40", ["0,2", "1,3"]),
        (100, "50 m50 50", ["0,2"]),
        (100, "i8 8 F", ["0", "1"]),
        # compressed float32 shares a round neither with plain float32 nor with bfloat16 tensors
        (100, "40 c40 b40 40 c40 b40 F", ["0,3", "1,4", "2,5"]),
        (100, "c60 b40 c40", ["0,2"]),
        # a flush cuts every partly filled buffer, in the order of their first entries
        (100, "f10 20 i30 F 40 F", ["0", "1", "2", "3"]),
        (100, "20 f10 20 F", ["0,2", "1"]),
        (100, "F F", []),
        # a zero-size entry joins a buffer (it is never "full" on its own)
        (100, "0 0 F", ["0,1"]),
        (100, "100 0 F", ["0!", "1"]),
        # threshold 0 (fusion off): every entry alone, zero-size ones too
        (0, "40 0 f8 F", ["0!", "1!", "2!"]),
        # threshold 1: only zero-size entries can be fused
        (1, "0 1 0 F", ["1!", "0,2"]),
    ],
)
def test_cut_rule(threshold: int, spec: str, expected: list[str]) -> None:
    assert _plan(threshold, spec) == expected


def test_heads_are_the_first_entry_of_each_open_buffer() -> None:
    planner = Planner(100)
    steps = [s for s in _entries("40 f40 40 i8 60") if isinstance(s, E)]
    for e in steps:
        planner.add(e)
    # float32: 0 and 2 (80 bytes); entry 4 (60) overflowed it -> cut [0, 2], 4 is the new head
    assert sorted(e.index for e in planner.heads()) == [1, 3, 4]
    assert planner.has_open()
    planner.clear()
    assert not planner.has_open() and list(planner.heads()) == []


def test_negative_threshold_is_refused() -> None:
    with pytest.raises(ValueError):
        Planner(-1)


def _random_steps(rng: random.Random, n: int, threshold: int) -> tuple[list[E], list[int]]:
    entries = []
    for i in range(n):
        key = rng.choice(list(_KEYS.values()))
        size = rng.choice([0, 1, rng.randrange(1, threshold + 1), rng.randrange(threshold, 3 * threshold + 1)])
        entries.append(E(i, size, *key))
    flushes = sorted(rng.sample(range(n + 1), 3))
    return entries, flushes


@pytest.mark.parametrize("seed", range(20))
def test_cuts_depend_on_the_agreed_flushes_only(seed: int) -> None:
    """Planned in batches of any size (as probes happen to agree on counts), the cuts are the same;
    every entry is in exactly one round; fused rounds hold one key and at most `threshold` bytes."""
    rng = random.Random(seed)
    threshold = rng.choice([1, 8, 100, 4096])
    entries, flushes = _random_steps(rng, 200, threshold)

    def plan(batch_sizes: random.Random) -> list[tuple[int, tuple[int, ...]]]:
        planner = Planner(threshold)
        cuts: list[Cut] = []
        i = 0
        for stop in flushes + [len(entries)]:  # the last flush: a synchronize at the end of a step
            while i < stop:
                j = min(stop, i + batch_sizes.randrange(1, 40))
                cuts += planner.add_all(entries[i:j])
                i = j
            cuts += planner.flush()
        return [(c.kind, tuple(e.index for e in c.entries)) for c in cuts]

    one = plan(random.Random(1))
    assert plan(random.Random(2)) == one
    assert sorted(i for _, ids in one for i in ids) == list(range(len(entries)))
    for kind, ids in one:
        group = [entries[i] for i in ids]
        if kind == ALONE:
            assert len(group) == 1 and group[0].nbytes >= threshold
        else:
            assert kind == FUSED
            assert len({(e.src, e.wire, e.op) for e in group}) == 1
            assert sum(e.nbytes for e in group) <= threshold
            assert all(e.nbytes < threshold for e in group)
            assert ids == tuple(sorted(ids))


# ---------------------------------------------------------------------- the diagnosis's field table
_BASE = Described(nbytes=40, src="float32", wire="float32", op="sum", numel=10, shape=(10,), name="p7")


@pytest.mark.parametrize(
    "other, expected",
    [
        (
            _BASE._replace(nbytes=48, numel=12, shape=(12,)),
            "size in bytes (40 to 48), number of elements (10 to 12), shape",
        ),
        (
            _BASE._replace(src="int32", wire="int32"),
            "dtype (float32 / int32), wire dtype (compression) (float32 / int32)",
        ),
        (
            _BASE._replace(src="float64", wire="float64", nbytes=80),
            "size in bytes (40 to 80), dtype (float32 / float64), wire dtype (compression) (float32 / float64)",
        ),
        (
            _BASE._replace(wire="bfloat16", nbytes=20),
            "size in bytes (20 to 40), wire dtype (compression) (float32 / bfloat16)",
        ),
        (_BASE._replace(op="max"), "op (sum / max)"),
        (_BASE._replace(op="avg"), "op (sum / avg)"),
        (_BASE._replace(shape=(2, 5)), "number of dimensions (1 to 2), shape"),
        (_BASE._replace(name="other"), "name"),
        (_BASE._replace(name=None), "name (given on some workers only)"),
        (_BASE, "description"),
    ],
)
def test_field_differences(other: Described, expected: str) -> None:
    a, b = fingerprint(_BASE).fields, fingerprint(other).fields
    lo = [min(x, y) for x, y in zip(a, b)]
    hi = [max(x, y) for x, y in zip(a, b)]
    assert differences(lo, hi) == expected
    assert (fingerprint(_BASE).dhash == fingerprint(other).dhash) == (other == _BASE)


def test_fingerprint_has_one_value_per_field() -> None:
    fp = fingerprint(_BASE)
    assert len(fp.fields) == len(FIELDS)
    assert fp.dhash != 0 and 0 < fp.dhash < 2**62
    assert fp.fields[-1] != 0 and fingerprint(_BASE._replace(name=None)).fields[-1] == 0


def test_round_tag_depends_on_every_entry() -> None:
    pairs = [(0, 11), (1, 13)]
    tag = round_tag(FUSED, "float32", "sum", 80, pairs)
    assert tag & 1 and tag == round_tag(FUSED, "float32", "sum", 80, iter(pairs))
    assert tag != round_tag(FUSED, "float32", "sum", 80, [(0, 11), (1, 15)])
    assert tag != round_tag(FUSED, "float32", "sum", 80, [(1, 11), (2, 13)])
    assert tag != round_tag(ALONE, "float32", "sum", 80, pairs)
    assert tag != round_tag(FUSED, "float32", "max", 80, pairs)
