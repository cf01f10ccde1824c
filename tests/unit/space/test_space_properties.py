"""Property tests: enumeration, counting and sampling against brute force on small random spaces."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleettune.space import SearchSpace, SpaceError
from fleettune.space import enumeration as enumeration_module


def _safe(fn: Callable[..., object]) -> Callable[..., bool]:
    """Python semantics of a constraint: an expression that raises makes the configuration invalid."""

    def run(*args: int) -> bool:
        try:
            return bool(fn(*args))
        except ZeroDivisionError:
            return False

    return run


# (expression template over a, b with constant k, python reference)
TEMPLATES: list[tuple[str, Callable[[int, int, int], object]]] = [
    ("{a} * {b} <= {k}", lambda a, b, k: a * b <= k),
    ("{a} % {b} == 0", lambda a, b, k: a % b == 0),
    ("{a} // {b} >= {k}", lambda a, b, k: a // b >= k),
    ("{a} + {b} != {k}", lambda a, b, k: a + b != k),
    ("not ({a} == {k} and {b} > 0)", lambda a, b, k: not (a == k and b > 0)),
    ("{a} in ({k}, 1, 4) or {b} < {k}", lambda a, b, k: a in (k, 1, 4) or b < k),
    ("-2 <= {a} - {b} <= {k}", lambda a, b, k: -2 <= a - b <= k),
    ("({a} if {b} > {k} else {b}) != 2", lambda a, b, k: (a if b > k else b) != 2),
    ("{b} == 0 or {a} % {b} != 1", lambda a, b, k: b == 0 or a % b != 1),
    ("max({a}, {b}) - min({a}, {k}) < 5", lambda a, b, k: max(a, b) - min(a, k) < 5),
    ("abs({a} - {k}) ** 2 <= {b} ** 2 + 4", lambda a, b, k: abs(a - k) ** 2 <= b**2 + 4),
    ("{a} / ({b} - 1) < {k}", lambda a, b, k: a / (b - 1) < k),
]


@st.composite
def small_spaces(draw):
    nparams = draw(st.integers(2, 5))
    domains = [draw(st.lists(st.integers(-3, 8), min_size=1, max_size=5, unique=True)) for _ in range(nparams)]
    names = [f"p{i}" for i in range(nparams)]
    constraints: list[tuple[str, Callable[..., bool], tuple[int, int]]] = []
    for _ in range(draw(st.integers(0, 4))):
        tpl, fn = draw(st.sampled_from(TEMPLATES))
        i = draw(st.integers(0, nparams - 1))
        j = draw(st.integers(0, nparams - 1))
        k = draw(st.integers(-2, 6))
        text = tpl.format(a=names[i], b=names[j], k=k)
        constraints.append((text, _safe(lambda a, b, fn=fn, k=k: fn(a, b, k)), (i, j)))
    return names, domains, constraints


def brute_force(domains, constraints) -> set[tuple[int, ...]]:
    valid = set()
    for idx in itertools.product(*[range(len(d)) for d in domains]):
        values = [d[i] for d, i in zip(domains, idx, strict=True)]
        if all(fn(values[i], values[j]) for _, fn, (i, j) in constraints):
            valid.add(idx)
    return valid


def build(names, domains, constraints) -> SearchSpace | None:
    params = [{"name": n, "type": "ordinal", "values": d} for n, d in zip(names, domains, strict=True)]
    try:
        return SearchSpace.from_spec(params, [c for c, _, _ in constraints])
    except SpaceError as err:
        assert "no valid configuration" in str(err)
        return None


def check_against_brute_force(names, domains, constraints) -> None:
    expected = brute_force(domains, constraints)
    space = build(names, domains, constraints)
    if space is None:
        assert expected == set()
        return
    assert space.count() == len(expected)
    rows = space.enumerate()
    got = [tuple(r) for r in rows.tolist()]
    assert len(got) == len(set(got))
    assert set(got) == expected
    # is_valid agrees on the whole Cartesian product
    everything = np.array(list(itertools.product(*[range(len(d)) for d in domains])), dtype=np.int32)
    assert {tuple(r) for r in everything[space.is_valid(everything)].tolist()} == expected
    # enumerate(limit) is a prefix
    assert np.array_equal(space.enumerate(limit=3), rows[:3])
    # sampling draws only valid rows; distinct sampling of everything returns the whole set
    rng = np.random.default_rng(0)
    draws = space.sample(20, rng, distinct=False)
    assert {tuple(r) for r in draws.tolist()} <= expected
    some = space.sample(min(3, len(expected)), rng)
    assert len({tuple(r) for r in some.tolist()}) == len(some) and {tuple(r) for r in some.tolist()} <= expected
    assert {tuple(r) for r in space.sample(len(expected) + 5, rng).tolist()} == expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_spaces())
def test_enumeration_and_sampling_match_brute_force(space_def):
    check_against_brute_force(*space_def)


def force_residuals(mp: pytest.MonkeyPatch) -> None:
    """Make every multi-parameter constraint a residual: exercises push-down filtering,
    streaming count and rejection sampling instead of bucket elimination."""
    import fleettune.space.constraints as constraints_module

    mp.setattr(enumeration_module, "BUCKET_LIMIT", 4)
    mp.setattr(constraints_module, "TRUTH_TABLE_LIMIT", 4)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_spaces())
def test_residual_constraints_match_brute_force(space_def):
    with pytest.MonkeyPatch.context() as mp:
        force_residuals(mp)
        check_against_brute_force(*space_def)


def test_residual_path_is_really_used(monkeypatch):
    force_residuals(monkeypatch)
    space = SearchSpace.from_spec([{"name": "a", "type": "integer", "range": {"min": 0, "max": 9}},
                                   {"name": "b", "type": "integer", "range": {"min": 0, "max": 9}}],
                                  ["a + b == 9"])
    assert len(space.residual_constraints) == 1
    assert space.count() == 10


@pytest.mark.parametrize("residual", [False, True], ids=["elimination", "rejection"])
def test_uniform_sampling_is_uniform(residual, monkeypatch):
    if residual:
        force_residuals(monkeypatch)
    # a skewed space: many valid b for small a, few for large a; uniform over *configurations*
    space = SearchSpace.from_spec([{"name": "a", "type": "integer", "range": {"min": 0, "max": 5}},
                                   {"name": "b", "type": "integer", "range": {"min": 0, "max": 5}},
                                   {"name": "c", "type": "boolean"}],
                                  ["a <= b", "c or a + b < 6"])
    total = space.count()
    draws = space.sample(total * 400, np.random.default_rng(42), distinct=False)
    counts = Counter(map(tuple, draws.tolist()))
    assert len(counts) == total
    expected = total * 400 / total
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    # chi-square with total-1 degrees of freedom: mean total-1, sd sqrt(2(total-1)); 6 sd is never hit by chance
    assert chi2 < (total - 1) + 6 * math.sqrt(2 * (total - 1))
    # and the marginal of a is far from uniform, as it must be (a=0 has 6*... configurations)
    a_counts = Counter(draws[:, 0].tolist())
    assert a_counts[0] > 3 * a_counts[5]
