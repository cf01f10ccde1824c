"""How good a predictor's rankings are on the held-out rows (pure: no I/O here).

A ranking is the list of configurations a predictor returns for one test row, its
prediction first. A predictor returning ``[]`` for a row does not apply to it: the row is
left out of that predictor's scores (``n`` counts only the rows it applies to), so two
predictors' figures can be over different rows; `versus` compares them on the rows both
apply to.

Per row: ``exact`` (the prediction is the row's best configuration), ``per_parameter``
(the share of the best's parameters the prediction has right), ``best_of_k`` (the best is
among the first ``k``), and, where the row has times, ``ratio`` = the fastest measured
time / the prediction's time, 0 where the prediction failed or was never measured on this
problem (an *invalid* prediction); ``ratio_at`` = the best ratio among the first
``MEASURED`` configurations of the ranking: what a pool reaches when it measures the
prediction and the next ones before it tunes (0, 5 and 10 of its own measurements).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleettune_dev.bench.predict.rows import Row, config_key

RESAMPLES = 1000
SEED = 0
MEASURED = (5, 10)  # a pool measuring the ranking's first 5 and 10: fraction_at_5, fraction_at_10


@dataclass(frozen=True)
class RowScore:
    exact: bool
    per_parameter: float
    best_of_k: bool
    ratio: float | None  # fastest time / the prediction's time; 0: invalid; None: the row has no times
    ratio_at: tuple[float, ...] | None = None  # the best ratio among the first MEASURED ones


def _value(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def score(row: Row, ranking: Sequence[Mapping[str, Any]], k: int = 10) -> RowScore | None:
    """One row's scores for one ranking; None where the ranking is empty (not applicable)."""
    if not ranking:
        return None
    first, best = ranking[0], row.best
    best_key = config_key(best)
    params = row.parameters
    right = sum(p in first and _value(first[p]) == _value(best[p]) for p in params)
    ratio = ratio_at = None
    if row.times is not None:
        ok = {c: t for c, t in row.times.items() if c not in row.invalid and math.isfinite(t) and t > 0}
        fastest = min(ok.values()) if ok else 0.0
        ratios = [fastest / ok[key] if key in ok else 0.0 for key in map(config_key, ranking[:max(MEASURED)])]
        ratio = ratios[0]
        ratio_at = tuple(max(ratios[:m]) for m in MEASURED)
    return RowScore(exact=config_key(first) == best_key, per_parameter=right / len(params) if params else 0.0,
                    best_of_k=any(config_key(c) == best_key for c in ranking[:k]), ratio=ratio, ratio_at=ratio_at)


def _geomean(ratios: np.ndarray, weights: np.ndarray | None = None) -> float | None:
    """Geometric mean of the positive ratios (the valid predictions); None if there are none."""
    valid = ratios > 0
    w = valid.astype(float) if weights is None else weights * valid
    if w.sum() == 0:
        return None
    return float(math.exp(float(np.log(np.where(valid, ratios, 1.0)) @ w) / float(w.sum())))


def summarise(scores: Sequence[RowScore | None], kind: str) -> dict[str, Any]:
    """The scores of the rows a predictor applies to. Shares are fractions (0–1); what
    does not apply is None: ``top1`` outside the MIOpen find-db (where the best
    "configuration" is the fastest solver, and the exact match is the top-1 of the
    literature), the time scores where no row has times. Over the rows with times:
    ``slowdown_geomean`` and ``fraction_of_optimum`` (its inverse) are geometric means
    over the valid predictions, ``invalid_share`` the share of the others, and
    ``fraction_p10`` / ``share_ge_0_9`` count an invalid prediction as 0; ``fraction_at_5`` /
    ``fraction_at_10``: the mean of the best fraction among the ranking's first 5 / 10 (an
    arithmetic mean, so that a row whose first ones all failed counts, as 0)."""
    s = [x for x in scores if x is not None]
    n = len(s)
    out: dict[str, Any] = {"n": n}
    mean = (lambda v: float(np.mean(v))) if n else (lambda v: None)
    out["exact"] = mean([x.exact for x in s])
    out["per_parameter"] = mean([x.per_parameter for x in s])
    out["best_of_10_exact"] = mean([x.best_of_k for x in s])
    out["top1"] = out["exact"] if kind == "miopen-finddb" else None
    ratios = np.array([x.ratio for x in s if x.ratio is not None], dtype=np.float64)
    timed = len(ratios) > 0
    fraction = _geomean(ratios) if timed else None
    out["slowdown_geomean"] = 1.0 / fraction if fraction else None
    out["fraction_of_optimum"] = fraction
    out["invalid_share"] = float(np.mean(ratios == 0)) if timed else None
    out["fraction_p10"] = float(np.percentile(ratios, 10)) if timed else None
    out["share_ge_0_9"] = float(np.mean(ratios >= 0.9)) if timed else None
    for i, m in enumerate(MEASURED):
        at = np.array([x.ratio_at[i] for x in s if x.ratio_at is not None], dtype=np.float64)
        out[f"fraction_at_{m}"] = float(at.mean()) if len(at) else None
    return out


def versus(scores: Sequence[RowScore | None], base: Sequence[RowScore | None], resamples: int = RESAMPLES,
           seed: int = SEED) -> dict[str, Any] | None:
    """This predictor minus ``base`` on the rows both apply to, with a 95 % paired bootstrap
    interval (``resamples`` resamples of those rows, a fixed seed). The metric is
    ``fraction_of_optimum`` where those rows have times, else ``exact``; a difference is
    in the metric's units (fractions). None where no row is shared."""
    pairs = [(a, b) for a, b in zip(scores, base, strict=True) if a is not None and b is not None]
    timed = [(a, b) for a, b in pairs if a.ratio is not None and b.ratio is not None]
    if timed:
        metric = "fraction_of_optimum"
        a = np.array([x.ratio for x, _ in timed], dtype=np.float64)
        b = np.array([y.ratio for _, y in timed], dtype=np.float64)
        stat: Callable[[np.ndarray, np.ndarray | None], float | None] = _geomean
    elif pairs:
        metric = "exact"
        a = np.array([x.exact for x, _ in pairs], dtype=np.float64)
        b = np.array([y.exact for _, y in pairs], dtype=np.float64)
        stat = _weighted_mean
    else:
        return None
    sa, sb = stat(a, None), stat(b, None)
    diff = None if sa is None or sb is None else sa - sb
    rng = np.random.default_rng(seed)
    n = len(a)
    diffs = []
    for _ in range(resamples):
        w = np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64)
        ra, rb = stat(a, w), stat(b, w)
        diffs.append(np.nan if ra is None or rb is None else ra - rb)
    finite = np.asarray(diffs)[np.isfinite(diffs)]
    low, high = (float(np.percentile(finite, 2.5)), float(np.percentile(finite, 97.5))) if len(finite) else (None, None)
    return {"metric": metric, "difference": diff, "low": low, "high": high}


def _weighted_mean(values: np.ndarray, weights: np.ndarray | None) -> float | None:
    w = np.ones(len(values)) if weights is None else weights
    return float(values @ w / w.sum()) if w.sum() else None
