"""A warm start's prior earns its influence from the pool's own results:
`PriorTrust` on its own, and in a study whose prior is the reverse of its landscape or
matches it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import hidden_infeasible, objective, run
from fleettune.optimize import Study
from fleettune.optimize.trust import PriorTrust
from fleettune.optimize.warm import CONTRAST, DESIGN, PLATEAU_DESIGN, SKIP_FIRST_PICKS_BELOW
from fleettune_job.protocol import Outcome

FAST = {"fit_iter": 30}  # tuning knobs (the development hook): fewer L-BFGS iterations


def test_weight_needs_a_few_points_first() -> None:
    trust = PriorTrust(min_points=5)
    reversed_ = np.arange(4.0)
    assert trust.weight(reversed_, -reversed_) == 1.0  # 4 points: nothing to judge by yet
    assert trust.weight(np.arange(5.0), -np.arange(5.0)) == 0.0
    assert trust.weight(np.ones(8), np.arange(8.0)) == 1.0  # the prior ranks nothing


def test_weight_follows_the_rank_correlation() -> None:
    rng = np.random.default_rng(0)
    trust = PriorTrust()
    x = rng.normal(size=12)
    assert trust.weight(x, np.exp(x)) == 1.0  # same order on another scale
    assert trust.weight(x, -x) == 0.0
    # A weak disagreement (rho = -0.2) is not clear from 6 points, and is from 60.
    x6, y6 = np.arange(6.0), np.array([1.0, 3.0, 4.0, 5.0, 2.0, 0.0])
    assert trust.weight(x6, y6) > 0.5
    assert trust.weight(np.tile(x6, 10) + np.repeat(np.arange(10.0) * 1e-3, 6), np.tile(y6, 10)) == 0.0


def test_failures_stay_out_of_the_ranking_unless_most_fail() -> None:
    trust = PriorTrust()
    x = np.arange(8.0)
    agreeing = np.where(x < 6, x, np.inf)  # the two the prior rates slowest failed here
    assert trust.weight(x, agreeing) == 1.0
    assert trust.weight(-x, np.where(x < 6, x, np.inf)) == 0.0  # the six that ran: reversed
    assert trust.weight(x, np.full(8, np.inf)) == 0.0
    assert trust.weight(x, np.where(x < 2, x, np.inf)) == 0.0  # 2 of 8 ran: at most PriorTrust.runs
    assert trust.weight(x, np.where(x < 3, x, np.inf)) == 1.0  # 3 of 8: too few to rank


def _configs(space) -> list[dict]:
    return [c for c in space.to_configs(space.enumerate()) if not hidden_infeasible(c)]


def _prior(space, value, n: int = 60, seed: int = 3) -> list:
    configs = _configs(space)
    rng = np.random.default_rng(seed)
    return [(configs[i], Outcome.OK, value(configs[i])) for i in rng.choice(len(configs), n, replace=False)]


def _fed(space, prior: list, n: int) -> Study:
    study = Study(space, seed=4, prior=prior, tuning=FAST)
    run(study, n)
    return study


def test_a_reversed_prior_loses_its_influence_within_a_few_points(space) -> None:
    """The prior's landscape is the reverse of this pool's: once the prior's best three,
    two probes and two space-filling points are measured, the prior has no weight left,
    the study completes a cold study's space-filling design instead of measuring the
    prior's other picks, and the model ranks the candidates as if the prior's shape were
    not there."""
    study = _fed(space, _prior(space, lambda c: 10.0 / objective(c)), 7)
    warm = study.strategy.warm
    assert warm.residual(study.history)
    assert warm.weight(study.history) == 0.0
    none = np.zeros(0, dtype=np.int64)
    picks = warm.first_picks(study.history, none, ~study._observed)
    assert len(picks) == DESIGN - int((study.history.feasible & (study.history.task == 1)).sum())
    assert np.array_equal(picks, warm.design(study.history, none, ~study._observed))
    assert float(warm.mean_at_candidates(study.history).abs().max()) == 0.0
    # Trusted, the same history would have the study measure the prior's picks.
    warm.trust = None
    assert not np.array_equal(warm.first_picks(study.history, none, ~study._observed), picks)


def test_a_warm_study_measures_the_prior_best_probes_and_contrast_first(space) -> None:
    """The order of a warm study's first suggestions: the prior's three best, the first
    code path's two probes, `CONTRAST` space-filling points, then the other probes."""
    prior = _prior(space, lambda c: 1.7 * objective(c))
    study = _fed(space, prior, 3 + 2 + CONTRAST)
    own = [space.to_configs(study._rows[i].reshape(1, -1))[0] for i in range(study.n_prior, len(study.history))]
    top = sorted((p for p in prior if p[2] is not None), key=lambda p: p[2])[:3]
    assert own[:3] == [c for c, _, _ in top]
    warm = study.strategy.warm
    probes = warm.path_probes(study.history, int(study.history.cand[np.argmin(study.history.value[:study.n_prior])]))
    cand = study.history.cand[study.n_prior:]
    assert list(cand[3:5]) == list(probes[:2])
    assert not set(cand[5:]) & set(probes) and len(set(cand)) == len(cand)


def test_every_other_code_path_gets_a_probe(space) -> None:
    """Five code paths besides the prior best's (layout × unroll): the three the prior
    ranks first get its best moved onto them and the prior model's best there (one
    configuration where the two coincide), the other two the prior model's best, so a
    path the prior ranks low is measured before the model leads."""
    study = _fed(space, _prior(space, lambda c: 1.7 * objective(c)), 0)
    warm = study.strategy.warm
    best = int(study.history.cand[np.argmin(study.history.value[:study.n_prior])])
    probes = warm.path_probes(study.history, best)

    def paths(idx: np.ndarray) -> list[tuple]:
        return [(c["layout"], c["unroll"]) for c in space.to_configs(study.candidates.rows[idx])]

    (own,) = paths(np.array([best]))
    assert own not in paths(probes) and len(set(paths(probes))) == 5
    assert len(set(probes.tolist())) == len(probes)
    # The last two are one probe each on the paths the prior ranks fourth and fifth.
    assert not set(paths(probes[-2:])) & set(paths(probes[:-2])) and len(set(paths(probes[-2:]))) == 2
    warm.paths = 1
    assert len(set(paths(warm.path_probes(study.history, best)))) == 2


def test_two_moves_that_help_alone_are_measured_together(space) -> None:
    """Here two changes to the prior's best each help a little (a larger tile, a taller
    block) and together a lot, where the prior rates the pair slow. Once the first five
    measurements are in (the prior's best, two such variants of it, two far from it),
    the combination is the next pick after the prior's other best and the first code
    path's probes; a variant slower than the prior's best is no move worth combining,
    and ``prior_combine=False`` leaves the picks as they were."""
    prior = _prior(space, lambda c: 1.7 * objective(c))
    best = min((p for p in prior if p[2] is not None), key=lambda p: p[2])[0]
    tile, by = {**best, "tile": best["tile"] + 1}, {**best, "by": best["by"] * 2}
    both = {**best, "tile": best["tile"] + 1, "by": best["by"] * 2}

    far = [{"bx": 16, "by": 16, "tile": 1, "layout": "a", "unroll": False},
           {"bx": 16, "by": 1, "tile": 2, "layout": "c", "unroll": False}]

    def fed(times: dict[str, float], **tuning) -> Study:
        """The first five measurements (those the combination is drawn from): the
        prior's best, its two variants, two configurations far from it."""
        study = Study(space, seed=4, prior=prior, tuning={**FAST, **tuning})
        for c, name in ((best, "best"), (tile, "tile"), (by, "by")):
            study.observe(c, Outcome.OK, times[name])
        for c in far:
            study.observe(c, Outcome.OK, 5.0)
        return study

    def cand(study: Study, c: dict) -> int:
        return int(study.candidates.lookup(np.asarray(space.to_rows([c]), dtype=np.int32))[0])

    helped = {"best": 2.0, "tile": 1.9, "by": 1.8}
    study = fed(helped)
    warm, none = study.strategy.warm, np.zeros(0, dtype=np.int64)
    combo = cand(study, both)
    assert warm.combination(study.history, cand(study, best), 5) == combo
    assert warm.combination(study.history.prefix(study.n_prior + 4), cand(study, best), 5) is None  # not all in yet
    prior_idx = np.arange(study.n_prior)
    top = study.history.cand[prior_idx[np.argsort(study.history.value[:study.n_prior], kind="stable")][:3]]
    first = [*top, *warm.path_probes(study.history, cand(study, best))[:2]]
    assert combo not in first, "the test's combination must be one the prior does not pick first"
    before = [int(c) for c in dict.fromkeys(first) if not study._observed[c]]
    picks = warm.first_picks(study.history, none, ~study._observed)
    assert picks[: len(before) + 1].tolist() == [*before, combo]

    hurt = fed({**helped, "by": 2.1})
    assert hurt.strategy.warm.combination(hurt.history, cand(hurt, best), 5) is None
    off = fed(helped, prior_combine=False)
    off_picks = off.strategy.warm.first_picks(off.history, none, ~off._observed)
    assert combo not in off_picks and off_picks[: len(before)].tolist() == before


def test_a_matching_prior_keeps_its_influence(space) -> None:
    """A sibling pool 1.7 times slower everywhere: its weight stays whole, and its prior
    part of the model is the prior GP's mean unscaled."""
    study = _fed(space, _prior(space, lambda c: 1.7 * objective(c)), 12)
    warm = study.strategy.warm
    assert warm.weight(study.history) == 1.0
    assert np.array_equal(warm.mean_at_candidates(study.history).numpy(), warm._prior_mean(study.history).numpy())


def test_the_weight_comes_back_when_the_pool_agrees_again(space) -> None:
    """The weight is a function of the history: measurements that agree with the prior
    restore what early disagreeing ones took."""
    prior = _prior(space, lambda c: 1.7 * objective(c))
    study = Study(space, seed=4, prior=prior, tuning=FAST)
    configs = _configs(space)
    rng = np.random.default_rng(5)
    picks = [configs[i] for i in rng.choice(len(configs), 30, replace=False)]
    ranked = sorted(picks[:6], key=objective)
    slowest_first = [ranked[-1 - i] for i in range(6)]
    # Disagreeing: what the prior ranks best measured slowest (times handed out reversed).
    for c, t in zip(slowest_first, sorted(objective(c) for c in ranked), strict=True):
        study.observe(c, Outcome.OK, t)
    assert study.strategy.warm.weight(study.history) < SKIP_FIRST_PICKS_BELOW
    for c in picks[6:]:
        study.observe(c, Outcome.OK, objective(c))
    assert study.strategy.warm.weight(study.history) == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_reversed_prior_costs_little_against_a_cold_start(space, optimum, seed) -> None:
    """With the trust rule, a warm start from a reversed landscape gets as close to the
    optimum in 20 evaluations as a cold start, give or take; without it (the prior
    trusted until ``prior_patience`` runs out, and none of the picks a cold study's: the
    no earned weight) it stays further away."""
    prior = _prior(space, lambda c: 10.0 / objective(c), seed=seed)

    def best(trust: bool, with_prior: bool = True) -> float:
        tuning = FAST if trust else {**FAST, "prior_hedge": 0}
        study = Study(space, seed=seed, prior=prior if with_prior else (), tuning=tuning)
        if not trust:
            study.strategy.warm.trust = None
        trace, _ = run(study, 20)
        return optimum / float(trace[-1])

    cold, warm = best(True, with_prior=False), best(True)
    assert warm >= cold - 0.05, (warm, cold)
    assert warm > best(False), warm


def test_the_weight_is_cheap_and_the_same_for_a_rebuilt_study(space) -> None:
    prior = _prior(space, lambda c: 10.0 / objective(c))
    study = _fed(space, prior, 9)
    again = Study(space, seed=4, prior=prior, tuning=FAST)
    for i in range(study.n_prior, len(study.history)):
        config = space.to_configs(study._rows[i].reshape(1, -1))[0]
        value = study.history.value[i]
        again.observe(config, study.history.outcome[i], None if math.isnan(value) else value)
    assert again.strategy.warm.weight(again.history) == study.strategy.warm.weight(study.history)
    assert again.suggest(2) == study.suggest(2)


def test_a_cold_study_has_no_weight_to_lose(space) -> None:
    study = Study(space, seed=4, tuning=FAST)
    run(study, 6)
    assert study.strategy.warm.weight(study.history) == 1.0


def test_every_other_pick_after_the_prior_first_is_a_cold_studys(space) -> None:
    """``prior_hedge`` 2: once the prior's first picks are measured, a warm study's pick at
    an odd count of its own evaluations is exactly the pick of a study without the prior
    that measured the same (past its design, as here); the other picks follow the prior,
    and with ``prior_hedge`` 0 all do. (A prior whose best region is only good here keeps
    a correct rank correlation, so only these picks get the study out of that region
    before ``prior_patience``.) With ``prior_lengthscales`` off; on, the next test."""
    prior = _prior(space, lambda c: 1.7 * objective(c))
    configs = _configs(space)
    rng = np.random.default_rng(6)
    own = [configs[i] for i in rng.choice(len(configs), 13, replace=False)]

    def study(n: int, with_prior: bool = True, **tuning) -> Study:
        s = Study(space, seed=4, prior=prior if with_prior else (),
                  tuning={**FAST, "prior_lengthscales": False, **tuning})
        for c in own[:n]:
            s.observe(c, Outcome.OK, objective(c))
        return s

    warm = study(13)
    assert warm.strategy.warm.weight(warm.history) == 1.0  # a trusted prior
    assert warm.suggest(1) == study(13, with_prior=False).suggest(1)
    assert study(12).suggest(1) != study(12, with_prior=False).suggest(1)
    assert study(13, prior_hedge=0).suggest(1) != study(13, with_prior=False).suggest(1)
    # In a batch, the picks at odd counts are the cold study's: two of four here.
    assert study(12).strategy.schedule.model_picks(4, 12, prior=True).cold == 2
    assert study(12, prior_hedge=3).strategy.schedule.model_picks(4, 12, prior=True).cold == 1  # own evaluation 14


def test_the_hedged_picks_can_model_with_the_prior_length_scales(space) -> None:
    """``prior_lengthscales``: the hedged pick's model is fitted to this pool's results
    alone as before, but its length-scales are the prior GP's (a warm study's own first
    points cluster around the prior's best and say little about how much each parameter
    matters); off, the pick is a cold study's, as above."""
    prior = _prior(space, lambda c: 1.7 * objective(c))
    configs = _configs(space)
    rng = np.random.default_rng(6)
    own = [configs[i] for i in rng.choice(len(configs), 13, replace=False)]

    def study(with_prior: bool = True, **tuning) -> Study:
        s = Study(space, seed=4, prior=prior if with_prior else (), tuning={**FAST, **tuning})
        for c in own:
            s.observe(c, Outcome.OK, objective(c))
        return s

    warm = study(prior_lengthscales=True)
    seen: list[np.ndarray | None] = []
    bayes = warm.strategy._bayes

    def spy(*args, lengthscale=None, **kwargs):
        seen.append(lengthscale)
        return bayes(*args, lengthscale=lengthscale, **kwargs)

    warm.strategy._bayes = spy
    pick = warm.suggest(1)
    prior_ls = warm.strategy.warm.model(warm.history)[0].hyper.lengthscale
    assert len(seen) == 1 and seen[0] is not None and np.array_equal(seen[0], prior_ls)
    cold = study(with_prior=False)
    off = study(prior_lengthscales=False).suggest(1)
    assert off == cold.suggest(1)
    own_ls = cold.strategy.surrogate.model(cold.history).gp.hyper.lengthscale
    assert not np.allclose(own_ls, prior_ls), "the test needs a prior whose length-scales differ from the pool's"
    assert pick != off


def test_on_a_prior_plateau_the_study_measures_its_best_then_spreads_over_the_plateau(space) -> None:
    """A prior that rates a third of the space (layout "b") about equally fast, and the
    rest three times slower: its next best and its code paths' bests are noise, so the
    study measures the prior's best, then space-filling points of the plateau, and no
    code-path probe (the layouts are code paths). A prior with a sharp best keeps the
    usual first suggestions."""
    rng = np.random.default_rng(5)
    flat = _prior(space, lambda c: (1.0 if c["layout"] == "b" else 3.0) * (1 + 0.01 * rng.random()), n=90)
    study = _fed(space, flat, 1 + PLATEAU_DESIGN)
    warm = study.strategy.warm
    plateau = warm.plateau(study.history)
    assert plateau is not None and 0.2 < plateau.mean() < 0.5
    cand = study.history.cand[study.n_prior:]
    best = min((p for p in flat if p[2] is not None), key=lambda p: p[2])[0]
    own = space.to_configs(study.candidates.rows[cand])
    assert own[0] == best and all(c["layout"] == "b" for c in own)
    assert plateau[cand].all() and len(set(cand.tolist())) == len(cand)
    none = np.zeros(0, dtype=np.int64)
    assert len(warm.first_picks(study.history, none, ~study._observed)) == 0  # the model leads from here
    # Switched off, or with a sharp prior: the prior's three best and the probes.
    warm.plateau_share = 0.0
    assert warm.plateau(study.history) is None
    sharp = _fed(space, _prior(space, lambda c: 1.7 * objective(c)), 0)
    assert sharp.strategy.warm.plateau(sharp.history) is None
