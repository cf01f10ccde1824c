"""Strategy options are declared by the strategy (default, doc, accepted values) and
checked by it: `validate_options` is what the operator runs on spec.strategy.options.
Few are public; the internal knobs are a development hook (`Study`'s ``tuning``), and a
former option is refused naming it."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from conftest import evaluate, feed
from fleettune.optimize import (
    STRATEGIES,
    OptionError,
    Study,
    UnknownStrategyError,
    acquisition,
    bayes,
    describe_options,
    describe_tuning,
    genetic,
    gp,
    local,
    removed_options,
    split_settings,
    validate_options,
    warm,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "reference" / "strategy-options.md"
PUBLIC = {
    "bayes": {"initial", "misfit_ei", "stall", "min_gain", "prior_top", "prior_patience"},
    "genetic": {"population", "mutation"},
    "random": set(),
}
# Every option a TuningRun could set before the surface was cut to PUBLIC: each must stay
# either public or refused by name, never become a plain unknown key.
FORMER = {
    "bayes": {"initial", "refit_growth", "fit_iter", "max_pool", "tau_max", "feas_power", "misfit_ei", "slow_ratio",
              "transform", "rank_every", "prior_top", "prior_paths", "prior_combine", "prior_patience",
              "prior_hedge", "prior_plateau", "prior_lengthscales", "local_starts", "local_rounds", "warm_refit",
              "warm_model", "stall", "min_gain", "stall_radius", "stall_every", "stall_paths", "stall_leaders"},
    "genetic": {"population", "mutation", "tournament"},
    "random": set(),
}
OFF_WITH_ZERO = {
    "bayes": {"stall", "prior_patience", "misfit_ei", "min_gain", "prior_paths", "prior_hedge", "stall_leaders",
              "prior_plateau", "rank_every", "slow_ratio", "design_replace"},
    "genetic": set(),
    "random": set(),
}


def test_the_public_surface_is_small() -> None:
    assert {s: {o.name for o in describe_options(s)} for s in STRATEGIES} == PUBLIC
    assert sum(len(describe_options(s)) for s in STRATEGIES) <= 8


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_former_option_is_public_or_refused_by_name(strategy: str) -> None:
    public, removed = {o.name for o in describe_options(strategy)}, set(removed_options(strategy))
    assert FORMER[strategy] <= public | removed and not public & removed
    # Beyond the former options, only development knobs added since are refused by name.
    assert public | removed <= FORMER[strategy] | {k.name for k in describe_tuning(strategy)}
    for key in removed:
        with pytest.raises(OptionError, match=r"^no longer an option: \S") as err:
            validate_options(strategy, {key: 1})
        assert err.value.key == key
    # A knob that kept an option's name is fixed at the knob's default, and says so.
    for knob in describe_tuning(strategy):
        assert removed_options(strategy)[knob.name] == f"it is now fixed at {json.dumps(knob.default)}"


def test_the_losing_alternatives_are_gone_and_refusals_say_what_replaced_them() -> None:
    for key, fixed_at, message in [
        ("transform", "copula", 'it is now fixed at "log"; a third of a cold study\'s picks rank by a GP'),
        ("warm_model", "task", 'it is now fixed at "residual": the prior\'s GP plus a GP'),
        ("fit_iter", 20, "it is now fixed at 40"),
        ("stall_paths", False, "it is now fixed at true"),
    ]:
        with pytest.raises(OptionError) as err:
            validate_options("bayes", {key: fixed_at})
        assert err.value.key == key and str(err.value).startswith(f"no longer an option: {message}")
    with pytest.raises(OptionError, match=r"^no longer an option: it is now fixed at 3$"):
        validate_options("genetic", {"tournament": 2})
    # Not tuning knobs either: those code paths are deleted, not hidden behind the hook.
    with pytest.raises(OptionError, match=r'^no longer an option: it is now fixed at "log"'):
        split_settings("bayes", {"transform": "copula"})
    with pytest.raises(OptionError, match=r"^not a tuning knob of strategy 'bayes'"):
        split_settings("bayes", {"fit_iter": 20}) and bayes.BayesTuning.resolve("bayes", {"warm_model": "task"})


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_option_is_documented_and_its_default_is_what_the_strategy_gets(strategy: str) -> None:
    declared = describe_options(strategy) + describe_tuning(strategy)
    assert len({o.name for o in declared}) == len(declared)
    for o in declared:
        assert o.doc and o.expected, o
        if o.default is not None:  # None: "automatic" (e.g. the genetic mutation rate)
            assert o.check(o.default) == o.default
    assert validate_options(strategy, None) == {o.name: o.default for o in describe_options(strategy)}
    assert validate_options(strategy, {}) == validate_options(strategy, None)


def test_the_knobs_default_to_the_constants_of_the_modules_that_use_them() -> None:
    t = bayes.BayesTuning()
    assert (t.fit_iter, t.max_pool, t.local_starts, t.local_rounds) == (
        gp.FIT_ITER, local.MAX_POOL, local.LOCAL_STARTS, local.LOCAL_ROUNDS)
    assert (t.feas_power, t.tau_max) == (acquisition.FEAS_POWER, acquisition.TAU_MAX)
    assert (t.prior_paths, t.prior_combine, t.prior_plateau) == (warm.PRIOR_PATHS, warm.PRIOR_COMBINE,
                                                                  warm.PRIOR_PLATEAU)
    assert (t.refit_growth, t.slow_ratio, t.rank_every, t.stall_radius, t.stall_every, t.stall_paths,
            t.stall_leaders, t.prior_hedge, t.prior_lengthscales, t.warm_refit) == (
        bayes.REFIT_GROWTH, bayes.SLOW_RATIO, bayes.RANK_EVERY, bayes.STALL_RADIUS, bayes.STALL_EVERY,
        bayes.STALL_PATHS, bayes.STALL_LEADERS, bayes.PRIOR_HEDGE, bayes.PRIOR_LENGTHSCALES, bayes.WARM_REFIT)
    assert genetic.GeneticTuning().tournament == genetic.TOURNAMENT


def test_given_options_override_the_defaults_and_reach_the_strategy_typed(space) -> None:
    resolved = validate_options("bayes", {"initial": 4, "stall": 0})
    assert resolved["initial"] == 4 and resolved["stall"] == 0 and resolved["prior_patience"] == 15
    study = Study(space, strategy="bayes", options={"initial": 4, "misfit_ei": 0.5})
    assert study.strategy.options.initial == 4 and study.strategy.options.misfit_ei == 0.5
    assert study.strategy.options.as_dict() == {**validate_options("bayes", None), "initial": 4, "misfit_ei": 0.5}
    assert study.strategy.tuning == bayes.BayesTuning()  # no tuning given: the constants
    genetic_study = Study(space, strategy="genetic", options={"population": 5})
    assert genetic_study.strategy.options.population == 5 and genetic_study.strategy.options.mutation is None


def test_the_development_hook_sets_the_knobs_and_nothing_else(space) -> None:
    """`Study`'s ``tuning`` (what `fleettune bench strategy --variant rank_every=0` uses):
    the knobs, checked as options are; a public option or a misspelt knob is refused."""
    study = Study(space, seed=1, options={"initial": 4}, tuning={"fit_iter": 20, "rank_every": 0})
    assert study.strategy.tuning.fit_iter == 20 and study.strategy.tuning.rank_every == 0
    assert study.strategy.tuning.stall_radius == bayes.STALL_RADIUS
    with pytest.raises(OptionError, match=r"^not a tuning knob of strategy 'bayes' \(did you mean 'rank_every'\?\)"):
        Study(space, tuning={"rank_evry": 0})
    with pytest.raises(OptionError,
                       match=r"^not a tuning knob of strategy 'bayes' .*\(tuning knobs: design_random, design_replace, "
                       r"feas_power, "):
        Study(space, tuning={"initial": 4})
    with pytest.raises(OptionError, match=r"^expected an integer >= 1, got 0$"):
        Study(space, tuning={"fit_iter": 0})
    with pytest.raises(OptionError, match=r"^not a tuning knob of strategy 'random' \(tuning knobs: none\)$"):
        Study(space, strategy="random", tuning={"fit_iter": 20})
    # A benchmark's --option/--variant: options and knobs in one mapping, split for Study.
    assert split_settings("bayes", {"initial": 4, "rank_every": 0}) == {
        "options": {"initial": 4}, "tuning": {"rank_every": 0}}
    assert split_settings("genetic", {"tournament": 2}) == {"options": {}, "tuning": {"tournament": 2}}
    with pytest.raises(OptionError, match=r"^neither an option nor a tuning knob of strategy 'bayes' \(did you "
                       r"mean 'prior_paths'\?\) \(options: initial, .*; tuning knobs: design_random, design_replace, "
                       r"feas_power, "):
        split_settings("bayes", {"prior_path": 2})
    with pytest.raises(OptionError, match=r"^expected a number >= 0, got -1$"):
        split_settings("bayes", {"slow_ratio": -1})


@pytest.mark.parametrize(("strategy", "options", "key", "message"), [
    ("bayes", {"prior_top": 0}, "prior_top", "expected an integer >= 1, got 0"),
    ("bayes", {"prior_patience": -1}, "prior_patience", "expected an integer >= 0, got -1"),
    ("bayes", {"initial": 2.5}, "initial", "expected an integer >= 1, got 2.5"),
    ("bayes", {"initial": True}, "initial", "expected an integer >= 1, got True"),
    ("bayes", {"initial": "10"}, "initial", "expected an integer >= 1, got '10'"),
    ("bayes", {"min_gain": math.inf}, "min_gain", "expected a number >= 0, got inf"),
    ("bayes", {"min_gain": math.nan}, "min_gain", "expected a number >= 0, got nan"),
    ("bayes", {"stall": None}, "stall", "expected an integer >= 0, got None"),
    ("bayes", {"misfit_ei": -0.5}, "misfit_ei", "expected a number >= 0, got -0.5"),
    ("bayes", {"misfit_ei": False}, "misfit_ei", "expected a number >= 0, got False"),
    ("genetic", {"mutation": None}, "mutation", "expected a positive number, got None"),
    ("genetic", {"population": [1]}, "population", "expected an integer >= 1, got [1]"),
])
def test_values_an_option_does_not_accept_are_named(strategy, options, key, message) -> None:
    with pytest.raises(OptionError) as err:
        validate_options(strategy, options)
    assert err.value.key == key and str(err.value) == message
    assert isinstance(err.value, ValueError)


def test_unknown_options_are_rejected_listing_the_known_ones(space) -> None:
    with pytest.raises(OptionError, match=r"^not an option of strategy 'bayes' \(did you mean 'prior_patience'\?\) "
                       r"\(options: initial, min_gain, misfit_ei, prior_patience, prior_top, stall\)$") as err:
        validate_options("bayes", {"prior_patiense": 2})
    assert err.value.key == "prior_patiense"
    # Nothing close: no guess, only the list.
    with pytest.raises(OptionError, match=r"^not an option of strategy 'bayes' \(options: initial, "):
        validate_options("bayes", {"zzz": 2})
    with pytest.raises(OptionError, match=r"^not an option of strategy 'random' \(options: none\)$"):
        validate_options("random", {"population": 20})
    with pytest.raises(OptionError, match="not an option of strategy 'genetic'"):
        Study(space, strategy="genetic", options={"initial": 3})  # the strategy checks its own options
    # The first offending option, in the order given.
    with pytest.raises(OptionError) as err:
        validate_options("bayes", {"initial": 0, "fit_iter": 1})
    assert err.value.key == "initial"
    with pytest.raises(OptionError) as err:
        validate_options("bayes", {"fit_iter": 1, "initial": 0})
    assert err.value.key == "fit_iter"


def test_zero_only_where_it_switches_a_behaviour_off() -> None:
    for strategy, off in OFF_WITH_ZERO.items():
        for o in describe_options(strategy) + describe_tuning(strategy):
            if o.expected.startswith(("an integer", "a number", "a positive number")):
                assert o.accepts(0) == (o.name in off), o.name


def test_unknown_strategy() -> None:
    with pytest.raises(UnknownStrategyError, match=r"^'nope' is not a strategy \(strategies: bayes, genetic, "
                       r"random\)$"):
        validate_options("nope", {})
    with pytest.raises(UnknownStrategyError):
        describe_options("nope")


def test_the_documentation_lists_every_option_with_its_default_and_every_removed_one() -> None:
    text = DOCS.read_text()
    for strategy in sorted(STRATEGIES):
        section = text.split(f"### `{strategy}`", 1)[1].split("###", 1)[0]
        for o in describe_options(strategy):
            default = "automatic" if o.default is None else f"`{str(o.default).lower()}`" if isinstance(
                o.default, bool) else f"`{o.default!r}`".replace("'", '"')
            assert f"| `{o.name}` | {default} | {o.expected} |" in section, (strategy, o.name)
        for key, replaced in removed_options(strategy).items():
            assert f"| `{key}` | {replaced} |" in section, (strategy, key)


def _digest(picks: list[dict]) -> str:
    return hashlib.sha256(json.dumps(picks, sort_keys=True).encode()).hexdigest()[:16]


def test_the_defaults_pick_as_before_the_options_were_cut(space) -> None:
    """The genetic strategy picks as when every knob was an option at its default (digest
    taken before the cut; numpy's generator alone decides its picks). The Bayesian studies'
    digests are not pinned: their picks follow torch's and botorch's numerics, which change
    between releases (a fresh install moved them without any change here), so a pinned
    digest would fail on a dependency update rather than on a change of ours. For them,
    the knobs at their constants, given explicitly, change nothing."""
    ga = feed(Study(space, strategy="genetic", seed=3), 40)
    assert _digest(ga) == "3dda655dd75bbaec"
    again = Study(space, seed=3, tuning=bayes.BayesTuning().as_dict())
    assert feed(again, 12) == feed(Study(space, seed=3), 12)
    warm_prior = [(c, *evaluate(c)) for c in feed(Study(space, seed=5, options={"initial": 6}), 20)]
    explicit = Study(space, seed=3, prior=warm_prior, tuning=bayes.BayesTuning().as_dict())
    assert feed(explicit, 10) == feed(Study(space, seed=3, prior=warm_prior), 10)


def _other_value(o) -> object:
    """An accepted value other than the option's default."""
    if isinstance(o.default, bool):
        return not o.default
    return o.default + 1


def _picks(space, settings: dict, prior=(), n: int = 16) -> list[dict]:
    return feed(Study(space, strategy="bayes", seed=3, prior=prior,
                      **split_settings("bayes", {"initial": 4, "stall": 3, **settings})), n)


def test_a_cold_study_never_reads_a_warm_only_option(space) -> None:
    """What lets `fleettune bench warmstart --variant` reuse the baseline's cold runs, for
    the public options and the tuning knobs alike."""
    warm_only = [o for o in describe_options("bayes") + describe_tuning("bayes") if o.warm_only]
    assert {o.name for o in warm_only} >= {"prior_top", "prior_patience", "prior_hedge", "warm_refit"}
    assert not any(o.warm_only for s in ("genetic", "random") for o in describe_options(s) + describe_tuning(s))
    cold = _picks(space, {})
    # All of them changed at once (a study per option took minutes); one at a time only
    # to name the option a cold study read.
    if _picks(space, {o.name: _other_value(o) for o in warm_only}) != cold:
        read = [o.name for o in warm_only if _picks(space, {o.name: _other_value(o)}) != cold]
        pytest.fail(f"a cold study's picks change with the warm-only options {read or 'together'}")
    assert _picks(space, {"initial": 5}) != cold  # and the comparison can tell runs apart
    prior = [(c, *evaluate(c)) for c in _picks(space, {"initial": 6}, n=12)]
    warm_picks = _picks(space, {}, prior)
    changed_warm = 0
    for o in warm_only:  # they are read by a warm study: three that change its picks suffice
        changed_warm += _picks(space, {o.name: _other_value(o)}, prior) != warm_picks
        if changed_warm == 3:
            break
    assert changed_warm == 3
