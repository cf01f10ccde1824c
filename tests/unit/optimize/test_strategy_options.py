"""Strategy options are declared by the strategy (default, doc, accepted values) and
checked by it: `validate_options` is what the operator runs on spec.strategy.options."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from conftest import evaluate, feed
from fleettune.optimize import (
    STRATEGIES,
    OptionError,
    Study,
    UnknownStrategyError,
    describe_options,
    validate_options,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "optimizer.md"
OFF_WITH_ZERO = {
    "bayes": {"stall", "prior_paths", "prior_patience", "prior_hedge", "misfit_ei", "min_gain",
              "stall_leaders", "prior_plateau", "rank_every", "slow_ratio"},
    "genetic": set(),
    "random": set(),
}


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_option_is_documented_and_its_default_is_what_the_strategy_gets(strategy: str) -> None:
    declared = describe_options(strategy)
    assert len({o.name for o in declared}) == len(declared)
    for o in declared:
        assert o.doc and o.expected, o
        if o.default is not None:  # None: "automatic" (e.g. the genetic mutation rate)
            assert o.check(o.default) == o.default
    assert validate_options(strategy, None) == {o.name: o.default for o in declared}
    assert validate_options(strategy, {}) == validate_options(strategy, None)


def test_given_options_override_the_defaults_and_reach_the_strategy_typed(space) -> None:
    resolved = validate_options("bayes", {"initial": 4, "transform": "copula", "stall": 0, "warm_refit": False})
    assert resolved["initial"] == 4 and resolved["transform"] == "copula" and resolved["stall"] == 0
    assert resolved["warm_refit"] is False and resolved["fit_iter"] == 40  # the rest: defaults
    study = Study(space, strategy="bayes", options={"initial": 4, "transform": "copula"})
    assert study.strategy.options.initial == 4 and study.strategy.options.transform == "copula"
    assert study.strategy.options.as_dict() == {**validate_options("bayes", None), "initial": 4,
                                                 "transform": "copula"}
    genetic = Study(space, strategy="genetic", options={"population": 5})
    assert genetic.strategy.options.population == 5 and genetic.strategy.options.mutation is None


@pytest.mark.parametrize(("strategy", "options", "key", "message"), [
    ("bayes", {"prior_top": 0}, "prior_top", "expected an integer >= 1, got 0"),
    ("bayes", {"prior_patience": -1}, "prior_patience", "expected an integer >= 0, got -1"),
    ("bayes", {"initial": 2.5}, "initial", "expected an integer >= 1, got 2.5"),
    ("bayes", {"initial": True}, "initial", "expected an integer >= 1, got True"),
    ("bayes", {"initial": "10"}, "initial", "expected an integer >= 1, got '10'"),
    ("bayes", {"tau_max": 0}, "tau_max", "expected a positive number, got 0"),
    ("bayes", {"feas_power": math.inf}, "feas_power", "expected a positive number, got inf"),
    ("bayes", {"refit_growth": math.nan}, "refit_growth", "expected a positive number, got nan"),
    ("bayes", {"refit_growth": None}, "refit_growth", "expected a positive number, got None"),
    ("bayes", {"misfit_ei": -0.5}, "misfit_ei", "expected a number >= 0, got -0.5"),
    ("bayes", {"misfit_ei": False}, "misfit_ei", "expected a number >= 0, got False"),
    ("bayes", {"transform": "many"}, "transform", "expected one of 'log', 'copula', got 'many'"),
    ("bayes", {"warm_model": ""}, "warm_model", "expected one of 'residual', 'task', got ''"),
    ("bayes", {"warm_refit": 1}, "warm_refit", "expected a boolean, got 1"),
    ("genetic", {"mutation": None}, "mutation", "expected a positive number, got None"),
    ("genetic", {"tournament": [1]}, "tournament", "expected an integer >= 1, got [1]"),
])
def test_values_an_option_does_not_accept_are_named(strategy, options, key, message) -> None:
    with pytest.raises(OptionError) as err:
        validate_options(strategy, options)
    assert err.value.key == key and str(err.value) == message
    assert isinstance(err.value, ValueError)


def test_unknown_options_are_rejected_listing_the_known_ones(space) -> None:
    with pytest.raises(OptionError, match=r"^not an option of strategy 'bayes' \(did you mean 'prior_paths'\?\) "
                       r"\(options: feas_power, fit_iter, initial, .*prior_paths.*\)$") as err:
        validate_options("bayes", {"prior_path": 2})
    assert err.value.key == "prior_path"
    # Nothing close: no guess, only the list.
    with pytest.raises(OptionError, match=r"^not an option of strategy 'bayes' \(options: feas_power, "):
        validate_options("bayes", {"zzz": 2})
    with pytest.raises(OptionError, match=r"^not an option of strategy 'random' \(options: none\)$"):
        validate_options("random", {"population": 20})
    with pytest.raises(OptionError, match="not an option of strategy 'genetic'"):
        Study(space, strategy="genetic", options={"initial": 3})  # the strategy checks its own options
    # The first offending option, in the order given.
    with pytest.raises(OptionError) as err:
        validate_options("bayes", {"initial": 0, "bogus": 1})
    assert err.value.key == "initial"


def test_zero_only_where_it_switches_a_behaviour_off() -> None:
    for strategy, off in OFF_WITH_ZERO.items():
        for o in describe_options(strategy):
            if o.expected.startswith(("an integer", "a number", "a positive number")):
                assert o.accepts(0) == (o.name in off), o.name


def test_unknown_strategy() -> None:
    with pytest.raises(UnknownStrategyError, match=r"^'nope' is not a strategy \(strategies: bayes, genetic, "
                       r"random\)$"):
        validate_options("nope", {})
    with pytest.raises(UnknownStrategyError):
        describe_options("nope")


def test_the_documentation_lists_every_option_with_its_default() -> None:
    text = DOCS.read_text()
    for strategy in sorted(STRATEGIES):
        section = text.split(f"### `{strategy}`", 1)[1].split("###", 1)[0]
        for o in describe_options(strategy):
            default = "automatic" if o.default is None else f"`{str(o.default).lower()}`" if isinstance(
                o.default, bool) else f"`{o.default!r}`".replace("'", '"')
            assert f"| `{o.name}` | {default} | {o.expected} |" in section, (strategy, o.name)


def _other_value(o) -> object:
    """An accepted value other than the option's default."""
    if isinstance(o.default, bool):
        return not o.default
    if isinstance(o.default, str):
        return next(c for c in ("residual", "task", "log", "copula") if c != o.default and o.accepts(c))
    return o.default + 1


def _picks(space, options: dict, prior=(), n: int = 16) -> list[dict]:
    return feed(Study(space, strategy="bayes", seed=3, options={"initial": 4, "stall": 3, **options}, prior=prior), n)


def test_a_cold_study_never_reads_a_warm_only_option(space) -> None:
    """What lets `fleettune bench warmstart --variant` reuse the baseline's cold runs."""
    warm_only = [o for o in describe_options("bayes") if o.warm_only]
    assert {o.name for o in warm_only} >= {"prior_top", "prior_patience", "warm_model"}
    assert not any(o.warm_only for s in ("genetic", "random") for o in describe_options(s))
    cold = _picks(space, {})
    # All of them changed at once (a study per option took minutes); one at a time only
    # to name the option a cold study read.
    if _picks(space, {o.name: _other_value(o) for o in warm_only}) != cold:
        read = [o.name for o in warm_only if _picks(space, {o.name: _other_value(o)}) != cold]
        pytest.fail(f"a cold study's picks change with the warm-only options {read or 'together'}")
    assert _picks(space, {"initial": 5}) != cold  # and the comparison can tell runs apart
    prior = [(c, *evaluate(c)) for c in _picks(space, {"initial": 6}, n=12)]
    warm = _picks(space, {}, prior)
    changed_warm = 0
    for o in warm_only:  # they are read by a warm study: three that change its picks suffice
        changed_warm += _picks(space, {o.name: _other_value(o)}, prior) != warm
        if changed_warm == 3:
            break
    assert changed_warm == 3
