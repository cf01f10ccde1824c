"""The prediction scores on hand-computed examples, the bootstrap interval, and the table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleettune_dev.bench.predict.rows import Row, config_key
from fleettune_dev.bench.predict.scores import RowScore, score, summarise, versus
from fleettune_dev.bench.predict.tables import format_table

BEST = {"bm": 64, "bn": 32, "warps": 4, "stages": 2}


def row(times: dict[str, float] | None = None, invalid: frozenset[str] = frozenset(), kind: str = "kt-caches") -> Row:
    return Row(data="d", kind=kind, group="g", family="f", device="X", key="k", volume=1.0, problem={"M": 1},
               best=BEST, times=times, invalid=invalid)


def test_exact_per_parameter_and_best_of_k() -> None:
    half = {**BEST, "bm": 128, "warps": 8}
    s = score(row(), [half, {**BEST, "stages": 3}, BEST], k=3)
    assert s == RowScore(exact=False, per_parameter=0.5, best_of_k=True, ratio=None)
    assert score(row(), [half, {**BEST, "stages": 3}, BEST], k=2).best_of_k is False
    # Parameter order does not matter; an empty ranking does not apply.
    assert score(row(), [dict(reversed(list(BEST.items())))]).exact is True
    assert score(row(), []) is None


def test_ratio_against_the_fastest_time_and_invalid_predictions() -> None:
    other = {**BEST, "bm": 32}
    failed = {**BEST, "bm": 16}
    times = {config_key(BEST): 2.0, config_key(other): 2.5}
    r = row(times, invalid=frozenset({config_key(failed)}))
    assert score(r, [other]).ratio == pytest.approx(0.8)
    assert score(r, [failed]).ratio == 0.0  # failed
    assert score(r, [{**BEST, "bm": 256}]).ratio == 0.0  # never measured
    assert score(r, [BEST]).ratio == 1.0


def test_a_pool_measuring_the_first_five_and_ten_keeps_the_best_of_them() -> None:
    configs = [{**BEST, "bm": 1000 + i} for i in range(12)]
    times = {config_key(c): 10.0 - i * 0.5 for i, c in enumerate(configs)}  # later ones faster; the last 1/2 as fast
    ranking = [*configs[:4], BEST, *configs[4:]]  # BEST (unmeasured) fifth: counts as failed
    s = score(row(times), ranking)
    assert s.ratio == pytest.approx(4.5 / 10.0)
    assert s.ratio_at == pytest.approx((4.5 / 8.5, 4.5 / 6.0))
    # A first five that all failed counts as 0 in the mean rather than dropping the row.
    failed = [{**BEST, "bm": 3 + i} for i in range(5)]
    summary = summarise([score(row(times), failed + configs), s], "kt-caches")
    assert summary["fraction_at_5"] == pytest.approx((0 + 4.5 / 8.5) / 2)


def test_summarise_by_hand() -> None:
    scores = [RowScore(True, 1.0, True, 1.0), RowScore(False, 0.5, True, 0.5), RowScore(False, 0.25, False, 0.0),
              None, RowScore(True, 1.0, True, 0.8)]
    s = summarise(scores, "kt-caches")
    assert s["n"] == 4  # the row it does not apply to is not counted
    assert s["exact"] == 0.5 and s["per_parameter"] == pytest.approx(0.6875) and s["best_of_10_exact"] == 0.75
    assert s["top1"] is None
    geomean = (1.0 * 0.5 * 0.8) ** (1 / 3)  # over the valid predictions
    assert s["fraction_of_optimum"] == pytest.approx(geomean)
    assert s["slowdown_geomean"] == pytest.approx(1 / geomean)
    assert s["invalid_share"] == 0.25
    assert s["fraction_p10"] == pytest.approx(np.percentile([1.0, 0.5, 0.0, 0.8], 10))  # invalid as 0
    assert s["share_ge_0_9"] == 0.25
    assert summarise(scores, "miopen-finddb")["top1"] == 0.5


def test_summarise_without_times_or_rows() -> None:
    s = summarise([RowScore(True, 1.0, True, None)], "vllm-tables")
    assert s["exact"] == 1.0
    assert all(s[k] is None for k in ("slowdown_geomean", "fraction_of_optimum", "invalid_share", "fraction_p10",
                                      "share_ge_0_9", "top1"))
    empty = summarise([None, None], "vllm-tables")
    assert empty["n"] == 0 and empty["exact"] is None


def test_bootstrap_interval_contains_the_true_difference() -> None:
    rng = np.random.default_rng(7)
    n = 2000
    a = rng.random(n) < 0.7
    b = rng.random(n) < 0.5
    scores = [RowScore(bool(x), 1.0, True, None) for x in a]
    base = [RowScore(bool(x), 1.0, True, None) for x in b]
    v = versus(scores, base)
    assert v is not None and v["metric"] == "exact"
    assert v["difference"] == pytest.approx(a.mean() - b.mean())
    assert v["low"] < 0.2 < v["high"]  # the true difference
    assert v["high"] - v["low"] < 0.1
    assert versus(scores, base) == v  # a fixed seed


def test_bootstrap_on_the_fraction_of_the_optimum_and_shared_rows_only() -> None:
    rng = np.random.default_rng(3)
    ratios = np.exp(-rng.exponential(0.2, 1500))
    scores = [RowScore(True, 1.0, True, float(r)) for r in ratios]
    base = [RowScore(True, 1.0, True, float(r) * 0.9) for r in ratios]  # 10 % slower everywhere
    v = versus([*scores, None], [*base, RowScore(True, 1.0, True, 0.1)])
    assert v is not None and v["metric"] == "fraction_of_optimum"
    truth = math.exp(np.log(ratios).mean()) * 0.1
    assert v["difference"] == pytest.approx(truth)
    assert v["low"] <= truth <= v["high"]
    assert versus([None], [RowScore(True, 1.0, True, None)]) is None


def test_table_formats_percentages_and_leaves_out_empty_columns() -> None:
    line = {"data": "d", "kind": "vllm-tables", "split": "alt", "predictor": "majority", "group": "H100",
            **summarise([RowScore(True, 0.5, True, None), RowScore(False, 0.25, True, None)], "vllm-tables"),
            "vs_nearest": {"metric": "exact", "difference": -0.125, "low": -0.25, "high": 0.0}}
    text = format_table("vllm, split alt", [line, {**line, "group": "all"}])
    assert "| H100 | majority | 2 | 50.0 | 37.5 | 100.0 | -12.5 [-25.0, +0.0] |" in text
    assert "| **all** | majority |" in text
    assert "slow-down" not in text and "top-1" not in text
