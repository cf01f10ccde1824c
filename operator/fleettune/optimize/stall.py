"""The stall heuristic of the Bayesian strategy: after a long stall, every other pick
stays near the best configuration.

A study has stalled once ``after`` of its own evaluations went by without one faster
than its best by more than ``gain`` (`since_progress`, `stopping.improvements`). From then on,
`StallRule.stalled_pick` says which picks stay near the best (every ``every``-th, counting
the outstanding evaluations before a pick as not improving), and
`StallRule.near_best` says where: masks over the scored candidates, narrowest first,
of which the acquisition takes the first that still offers a candidate: the best
configuration's other code paths (only its switches changed, within ``radius`` moves),
then those of the best configuration of each runner-up region (`runners_up`), then the
whole neighbourhood within ``radius`` moves. A function of the history alone, so that a
study rebuilt from it makes the same picks.
"""

from __future__ import annotations

import numpy as np
import torch

from .problem import Candidates, History
from .stopping import improvements

# A stalled study (``stall`` evaluations without progress) makes every STALL_EVERY-th pick
# within STALL_RADIUS moves of the best configuration (``stall_every``, ``stall_radius``):
# the way out of a local optimum often takes two coordinated moves.
STALL_EVERY = 2
STALL_RADIUS = 2
# Those near picks first try the best configuration on other code paths (only its switches
# changed), then its whole neighbourhood (``stall_paths``): the way off one code path's
# optimum can take two flags flipped together.
STALL_PATHS = True
# ...and then the other code paths of this many runners-up from other regions (each more
# than STALL_RADIUS moves from the best and the runners-up before it, within `LEADER_GAP`
# of the best; ``stall_leaders``, 0: none): a narrow optimum can sit one flag away from a
# region almost as good as the best, far from the best.
STALL_LEADERS = 1
LEADER_GAP = 0.03  # a runner-up region's best is at most this much slower than the best (stall_leaders)


class StallRule:
    """When a stalled study's pick stays near its best, and which candidates are near.

    ``after``: evaluations without progress that make a stall (`BayesOptions.stall`; 0:
    never); ``gain``: what counts as progress (``min_gain``); ``every``, ``radius``,
    ``paths``, ``leaders``: the knobs ``stall_every``, ``stall_radius``, ``stall_paths``
    and ``stall_leaders``."""

    def __init__(self, candidates: Candidates, *, after: int, gain: float, every: int, radius: int, paths: bool,
                 leaders: int) -> None:
        self.candidates = candidates
        self.after, self.gain = after, gain
        self.every, self.radius, self.paths, self.leaders = every, radius, paths, leaders

    def near_best(self, history: History, scored: np.ndarray, picks: int) -> tuple[list[torch.Tensor], int]:
        """Masks over the scored candidates for a stalled pick, narrowest first: those
        within ``radius`` moves of the best configuration that change only its switches
        (with ``paths``), then all within ``radius`` moves. Empty when there is no best,
        the rule is off, or none of the next ``picks`` picks is stalled long enough. Also
        the study's stall."""
        stall, best = since_progress(history, self.gain)
        if self.after <= 0 or best < 0 or stall + picks - 1 < self.after:
            return [], stall
        rows = self.candidates.rows
        moved = rows[scored] != rows[best]
        near = moved.sum(axis=1) <= self.radius
        out = [torch.as_tensor(near)]
        switches = list(self.candidates.switches)
        if self.paths and switches and len(switches) < rows.shape[1]:
            sizes = np.ones(rows.shape[1], dtype=bool)
            sizes[switches] = False

            def paths(of: int) -> torch.Tensor:
                """Within radius moves of ``of``, only its switches changed."""
                m = rows[scored] != rows[of]
                return torch.as_tensor((m.sum(axis=1) <= self.radius) & ~m[:, sizes].any(axis=1))

            out[:0] = [paths(c) for c in [best, *runners_up(history, rows, self.radius, self.leaders)]]
        return out, stall

    def stalled_pick(self, stall: int) -> bool:
        """Whether a pick made at this stall stays near the best."""
        k = self.after
        return stall >= k and (stall - k) % self.every == 0


def runners_up(history: History, rows: np.ndarray, radius: int, most: int) -> list[int]:
    """The best measured configurations of other regions, best first: each more than
    ``radius`` moves from the best and from the ones before it, within `LEADER_GAP` of the
    best; at most ``most``."""
    if most <= 0:
        return []
    cur, v = history.own_values()
    order = np.argsort(v, kind="stable")
    kept: list[int] = []
    for j in order:
        if not np.isfinite(v[j]) or v[j] > v[order[0]] * (1 + LEADER_GAP):
            break
        c = int(history.cand[cur[j]])
        if c >= 0 and all(int((rows[c] != rows[k]).sum()) > radius for k in kept):
            kept.append(c)
            if len(kept) > most:
                break
    return kept[1:]


def since_progress(history: History, gain: float) -> tuple[int, int]:
    """Evaluations of this study since it last improved by more than ``gain``
    (`stopping.improvements`), and its best candidate so far."""
    cur, v = history.own_values()
    better = improvements(v, gain)
    if len(better) == 0:
        return 0, -1
    return len(cur) - 1 - int(better[-1]), int(history.cand[cur[int(np.argmin(v))]])
