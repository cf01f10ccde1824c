"""The learned predictor (`predict.learned`), on synthetic rows: it learns rules a nearest
neighbour cannot, ranks only valid configurations, and depends on nothing but what it may read."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from fleettune_dev.bench.predict.learned import VLLM_GRID, Learned
from fleettune_dev.bench.predict.rows import Row, config_key

SMALL = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
         "num_stages": 3}
LARGE = {**SMALL, "BLOCK_SIZE_M": 64, "GROUP_SIZE_M": 16}


def row(n: int, m: int, best: dict[str, Any], device: str = "H100", **extra: Any) -> Row:
    problem = {"M": m, "N": n, "E": 8, "dtype": "auto", "device": device}
    return Row(data="synthetic", kind="vllm-tables", group=device, family=f"N={n}", device=device,
               key=f"{device}|N={n}|M={m}", volume=float(m), problem=problem, best=best, **extra)


def divisible(n: int) -> dict[str, Any]:
    """The best tile takes 64 where it divides N, as real kernels do; else 16."""
    return LARGE if n % 64 == 0 else SMALL


def fitted(train: list[Row], **kw: Any) -> Learned:
    model = Learned(**{"epochs": 20, **kw})
    model.fit(train)
    return model


@pytest.fixture(scope="module")
def divisibility() -> tuple[Learned, list[Row], list[Row]]:
    """Tables at N = 32·j: the best flips with the parity of j, so every untuned N's nearest
    tuned N (32 away) has the other best."""
    ns = [32 * j for j in range(20, 60)]
    rows = [row(n, m, divisible(n)) for n in ns for m in (16, 256)]
    test = [r for r in rows if r.problem["N"] % 96 == 32]
    train = [r for r in rows if r not in test]
    return fitted(train), train, test


def nearest_best(train: list[Row], r: Row) -> dict[str, Any]:
    return dict(min(train, key=lambda t: (abs(t.problem["N"] - r.problem["N"]), abs(t.volume - r.volume), t.key)).best)


def test_it_learns_a_divisibility_rule_that_the_nearest_problem_gets_wrong(
        divisibility: tuple[Learned, list[Row], list[Row]]) -> None:
    model, train, test = divisibility
    right = sum(model.rank(r, 1) == [dict(r.best)] for r in test)
    nearest = sum(nearest_best(train, r) == dict(r.best) for r in test)
    assert nearest == 0  # the rule is one no neighbour can copy
    assert right >= 0.9 * len(test)


def test_it_learns_a_threshold_that_lies_between_tuned_sizes() -> None:
    """The best tile grows at M = 40 in every table; densely tuned tables (each at other sizes)
    show where, and the sparsely tuned one (M = 32, 128) is predicted right at M = 60 and 64,
    where its nearest tuned size (32) still has the small tile."""
    def best(m: int) -> dict[str, Any]:
        return LARGE if m >= 40 else SMALL

    dense = [row(n, m + shift, best(m + shift)) for n, shift in ((1024, 0), (2048, 2), (4096, 4), (8192, 6))
             for m in (8, 16, 24, 32, 36, 40, 48, 64, 96, 128)]
    sparse = [row(3072, m, best(m)) for m in (8, 32, 128, 512)]
    model = fitted(dense + sparse, epochs=40)
    for m in (60, 64, 16, 24):
        untuned = row(3072, m, SMALL)
        assert model.rank(untuned, 1) == [best(m)], m
        if m > 40:
            assert nearest_m(sparse, untuned) != best(m)


def nearest_m(train: list[Row], r: Row) -> dict[str, Any]:
    import math

    return dict(min(train, key=lambda t: (abs(math.log2(t.volume / r.volume)), t.volume)).best)


def test_rankings_are_valid_distinct_at_most_k_and_deterministic(
        divisibility: tuple[Learned, list[Row], list[Row]]) -> None:
    model, train, test = divisibility
    valid = {config_key(r.best) for r in train} | {config_key(dict(zip(VLLM_GRID, c, strict=True)))
                                                   for c in _grid()}
    again = fitted(train)
    for r in test[:10]:
        ranking = model.rank(r, 10)
        keys = [config_key(c) for c in ranking]
        assert 1 <= len(ranking) <= 10 and len(set(keys)) == len(keys)
        assert set(keys) <= valid
        assert ranking == again.rank(r, 10) == model.rank(r, 10)
    assert len(model.rank(test[0], 3)) == 3
    assert model.rank(test[0], 0) == []


def _grid() -> list[tuple[int, ...]]:
    import itertools

    return list(itertools.product(*VLLM_GRID.values()))


def test_only_configurations_measured_valid_are_ranked_where_rows_have_times() -> None:
    """Configurations that a training row timed are candidates; one that only failed is not."""
    fast, slow, broken = ({"tile": t} for t in (32, 64, 128))
    def timed(size: int) -> Row:
        best, other = (fast, slow) if size < 1000 else (slow, fast)
        times = {config_key(best): 1.0, config_key(other): 2.0}
        return Row(data="synthetic", kind="kt-caches", group="gemm", family="gemm", device="A100",
                   key=f"gemm|{size}", volume=float(size), problem={"size_0": size, "device": "A100"}, best=best,
                   times=times, invalid=frozenset({config_key(broken)}))

    model = fitted([timed(s) for s in (64, 128, 256, 512, 2048, 4096, 8192, 16384)])
    for size in (100, 300, 3000, 10000):
        assert sorted(c["tile"] for c in model.rank(timed(size), 5)) == [32, 64]


def test_it_never_reads_the_best_or_the_times_of_the_row_it_predicts(
        divisibility: tuple[Learned, list[Row], list[Row]]) -> None:
    model, _, test = divisibility
    for r in test[:10]:
        corrupted = dataclasses.replace(r, best={"BLOCK_SIZE_M": 999}, times={json.dumps({"x": 1}): 0.1},
                                        invalid=frozenset({config_key(r.best)}))
        assert model.rank(corrupted, 10) == model.rank(r, 10)


def test_a_gpu_never_seen_is_predicted_from_the_others_and_an_empty_fit_ranks_nothing() -> None:
    """vLLM's groups are GPUs: one model learns from all of them, and ranks for a new one."""
    train = [row(n, m, divisible(n), device=d) for d in ("H100", "A100") for n in (1024, 1056, 2048, 2080)
             for m in (1, 64)]
    model = fitted(train)
    assert [c["BLOCK_SIZE_M"] for c in model.rank(row(4096, 64, SMALL, device="B200"), 2)] == [64, 16]
    assert fitted([]).rank(row(4096, 64, SMALL), 2) == []
