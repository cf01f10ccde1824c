"""`fleettune bench predict`'s folds: each split's rule on synthetic rows, disjoint, deterministic."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fleettune_dev.bench.predict.rows import Row, stable_hash
from fleettune_dev.bench.predict.splits import SPLITS, folds, series


def _row(kind: str, group: str, family: str, device: str, volume: float, **problem: float | int | str) -> Row:
    key = f"{kind}|{group}|{family}|{device}|{volume}"
    return Row(data=f"{kind}:x", kind=kind, group=group, family=family, device=device, key=key, volume=volume,
               problem={**problem, "device": device}, best={"a": 1})


def _tables() -> list[Row]:
    """Three vLLM-like tables (two on H100, one on A100) of unequal length, given out of order."""
    rows = []
    for device, family, ms in [("H100", "E=8,N=1", [1, 2, 4, 8, 16]), ("H100", "E=8,N=2", [1, 4, 16]),
                               ("A100", "E=8,N=1", [1, 2, 4, 8])]:
        rows += [_row("vllm-tables", device, family, device, m, M=m) for m in ms]
    return rows[::-1]


def _miopen() -> list[Row]:
    rows = []
    for solver in ("S1", "S2"):
        for fam, batches in [("f1", [1, 16, 64]), ("f2", [8, 32]), ("f3", [4])]:
            rows += [_row("miopen-perfdb", solver, fam, "gfx906", b * 100, batchsize=b) for b in batches]
    return rows


def _keys(rows: Sequence[Row]) -> list[str]:
    return [r.key for r in rows]


def _check(rows: list[Row], split: str) -> list[tuple[list[Row], list[Row]]]:
    """The folds, checked for what every split promises: each fold partitions the rows, in input
    order, and the same call gives the same folds."""
    out = folds(rows, split)
    for train, test in out:
        assert train and test
        assert not set(_keys(train)) & set(_keys(test))
        assert sorted(_keys(train) + _keys(test)) == sorted(_keys(rows))
        order = {k: i for i, k in enumerate(_keys(rows))}
        assert [order[k] for k in _keys(test)] == sorted(order[k] for k in _keys(test))
    assert [(_keys(a), _keys(b)) for a, b in folds(list(rows), split)] == [(_keys(a), _keys(b)) for a, b in out]
    return out


def _series_test(test: Sequence[Row]) -> dict[tuple[str, str], list[float]]:
    got: dict[tuple[str, str], list[float]] = {}
    for r in test:
        got.setdefault((r.device, r.family), []).append(r.volume)
    return {k: sorted(v) for k, v in got.items()}


def test_series_orders_by_volume() -> None:
    rows = _tables()
    got = sorted([rows[i].volume for i in s] for s in series(rows))
    assert got == [[1, 2, 4, 8], [1, 2, 4, 8, 16], [1, 4, 16]]


def test_alt() -> None:
    ((_, test),) = _check(_tables(), "alt")
    assert _series_test(test) == {("H100", "E=8,N=1"): [2, 8], ("H100", "E=8,N=2"): [4], ("A100", "E=8,N=1"): [2, 8]}
    # One row per series (a Kernel Tuner folder with one size per GPU): nothing to interpolate.
    lone = [_row("kt-caches", "gemm", "gemm", d, 4096.0) for d in ("a", "b", "c")]
    assert folds(lone, "alt") == [] and folds(lone, "loo") == [] and folds(lone, "extrap") == []


def test_loo() -> None:
    out = _check(_tables(), "loo")
    assert len(out) == 5  # the longest series
    assert _series_test(out[0][1]) == {("H100", "E=8,N=1"): [1], ("H100", "E=8,N=2"): [1], ("A100", "E=8,N=1"): [1]}
    assert _series_test(out[3][1]) == {("H100", "E=8,N=1"): [8], ("A100", "E=8,N=1"): [8]}
    assert _series_test(out[4][1]) == {("H100", "E=8,N=1"): [16]}
    assert sorted(k for _, test in out for k in _keys(test)) == sorted(_keys(_tables()))  # each row out once


def test_extrap() -> None:
    ((train, test),) = _check(_tables(), "extrap")
    assert _series_test(test) == {("H100", "E=8,N=1"): [8, 16], ("H100", "E=8,N=2"): [16], ("A100", "E=8,N=1"): [4, 8]}
    ((train, test),) = _check(_tables(), "extrap:8")
    assert {r.volume for r in train} == {1, 2, 4} and {r.volume for r in test} == {8, 16}
    assert folds(_tables(), "extrap:1000") == []  # nothing at or above: no fold
    with pytest.raises(ValueError, match="number"):
        folds(_tables(), "extrap:big")


def test_lofo() -> None:
    rows = [_row("vllm-tables", d, f"E={e},N=1", d, m) for e in range(12) for d in ("H100", "A100") for m in (1, 2)]
    out = _check(rows, "lofo")
    assert 2 <= len(out) <= 5
    seen: set[str] = set()
    for train, test in out:
        families = {r.family for r in test}
        assert not families & {r.family for r in train}  # a family is out whole, on every GPU
        assert all(stable_hash(f) % 5 == stable_hash(next(iter(families))) % 5 for f in families)
        assert not families & seen
        seen |= families
    assert seen == {r.family for r in rows}
    assert folds(rows[:4], "lofo") == []  # one family: nothing to learn from


def test_logo() -> None:
    out = _check(_tables(), "logo")
    assert [{r.device for r in test} for _, test in out] == [{"A100"}, {"H100"}]
    assert all({r.device for r in train} == {"H100", "A100"} - {r.device for r in test} for train, test in out)
    assert folds([r for r in _tables() if r.device == "H100"], "logo") == []


def test_random() -> None:
    rows = [_row("miopen-perfdb", "S", f"f{i}", "gfx906", i) for i in range(400)]
    ((_, test),) = _check(rows, "random")
    assert {r.key for r in test} == {r.key for r in rows if stable_hash(r.key) % 5 == 0}
    assert 50 <= len(test) <= 110  # about a fifth


def test_batchmax() -> None:
    ((_, test),) = _check(_miopen(), "batchmax")
    assert sorted((r.group, r.family, r.problem["batchsize"]) for r in test) == [
        ("S1", "f1", 64), ("S1", "f2", 32), ("S2", "f1", 64), ("S2", "f2", 32)]
    # A find-db-like family whose largest batch only one solver has: that row alone is test.
    rows = [_row("miopen-finddb", "F", "g", "gfx906", b, batchsize=b) for b in (1, 2)]
    rows.append(_row("miopen-finddb", "B", "g", "gfx906", 1, batchsize=1))
    ((_, test),) = _check(rows, "batchmax")
    assert [(r.group, r.problem["batchsize"]) for r in test] == [("F", 2)]
    assert folds(_tables(), "batchmax") == []


def test_mixed_data_and_unknown_split() -> None:
    rows = _tables() + _miopen()
    ((train, test),) = _check(rows, "batchmax")
    assert {r.kind for r in test} == {"miopen-perfdb"} and "vllm-tables" in {r.kind for r in train}
    for split in SPLITS:
        _check(rows, split)
    with pytest.raises(ValueError, match="split is one of"):
        folds(rows, "kfold")
    with pytest.raises(ValueError, match="split is one of"):
        folds(rows, "alt:3")
