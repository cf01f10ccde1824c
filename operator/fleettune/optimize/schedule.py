"""Which pick of a Bayesian suggestion is what.

A suggestion's picks are, in this order: the space-filling initial design while
`Schedule.designing` (a cold study's first ``initial`` feasible points, failed ones
replaced up to 1.5 times as many evaluations (``design_replace``), and while fewer than two results ran at all);
with warm-start data, the prior's first picks (`warm.WarmStart.first_picks`); then the model's
picks, split by `Schedule.model_picks` into picks on log time, every ``rank_every``-th
pick of a study without a prior on the times' ranks (`surrogate.RANKS`), and every
``prior_hedge``-th pick of a study with one from this pool's results alone. Picks are
numbered by this study's own evaluations, pending ones included, so that a batch's picks
alternate as one-at-a-time picks do and a study rebuilt from its history picks the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .problem import History

# Without warm-start data (or once it is dropped), every this-many-th model pick ranks by a
# GP of the objective's ranks (normal scores, `surrogate.standardise` "copula") rather than
# of log time (``rank_every``; 0: never): where most configurations are 10-100 times slower
# than the best, log times spend the model on that tail; ranks cannot see how much slower a
# code path is, which other spaces need, hence a share of the picks.
RANK_EVERY = 3
# With warm-start data, once the prior's first picks are measured, every this-many-th pick
# is the model's pick from this pool's own results alone (``prior_hedge``; 0: never): a
# prior whose best region is only good here then holds the search in the other picks only.
PRIOR_HEDGE = 2
# Those picks' model uses the prior GP's length-scales instead of its own while the prior
# keeps its weight (``prior_lengthscales``): a warm study's own first points, clustered
# around the prior's best, cannot tell which parameters matter.
PRIOR_LENGTHSCALES = True
# Failed design points are replaced by others up to this share of the design's size
# (``design_replace``): the design then ends after (1 + share) x ``initial`` evaluations
# however few of them ran. Where most of a space fails, the design's points that run sit
# at its extremes, and the model, which has learnt where the failures lie, finds better
# ones sooner than more design points do (docs/decisions.md).
DESIGN_REPLACE = 0.5


class ModelPicks(NamedTuple):
    """How many of a suggestion's model picks are of each kind."""

    log: int  # the model's picks on log time (with the prior's GP where there is one)
    ranked: int  # on the times' ranks (a study without a prior)
    cold: int  # from this pool's results alone (a study with a prior)


def has_prior(history: History) -> bool:
    """Whether ``history`` holds warm-start data to model: two prior results that ran."""
    return int((history.feasible & (history.task != 1)).sum()) >= 2


@dataclass(frozen=True)
class Schedule:
    """``initial``: the design's size (`BayesOptions.initial`); ``rank_every``,
    ``prior_hedge``: the knobs of those names."""

    initial: int
    rank_every: int
    prior_hedge: int
    design_replace: float = DESIGN_REPLACE

    def designing(self, history: History, pending: np.ndarray) -> bool:
        """Whether the next picks complete the space-filling initial design."""
        current = history.task == 1
        feasible_current = int((history.feasible & current).sum())
        # Failed design points do not count: they are replaced, up to design_replace x its size.
        design_left = 0 if has_prior(history) else self.initial - feasible_current - len(pending)
        cap = round((1.0 + self.design_replace) * self.initial)
        if int(current.sum()) < cap and design_left > 0:
            return True
        return int(history.feasible.sum()) < 2

    def model_picks(self, n: int, first: int, prior: bool) -> ModelPicks:
        """The kinds of ``n`` model picks, the first of them this study's ``first``-th own
        evaluation (counting from 0, pending ones included); ``prior``: the study has
        warm-start data (`has_prior`)."""
        cold = every(self.prior_hedge, first, n) if prior else 0
        ranked = 0 if prior else every(self.rank_every, first, n)
        return ModelPicks(n - cold - ranked, ranked, cold)


def every(k: int, first: int, n: int) -> int:
    """How many of the evaluations first, ..., first + n - 1 (counting from 0) are a
    k-th one (none for k <= 0)."""
    return 0 if k <= 0 else sum(1 for i in range(first, first + n) if i % k == k - 1)
