"""Recommend a configuration for a problem size that was never tuned (pure: the model).

Model, from the results of the tuned sizes of one pool:

* **scale**: how the best time grows with the problem. ``log best_time`` is a linear
  function of ``log(volume)`` (volume = product of the size's dimensions), fitted over
  the tuned sizes with its slope shrunk towards 1 ("time ∝ work"); with one tuned size
  the slope is 1.
* **shape**: how much slower than that size's best each configuration is,
  ``r = log t - log best_time(size)``, as a Gaussian process over the configuration's
  model features (the optimiser's type-aware encoding) plus ``log2`` of each size
  dimension — so the model shares what it learns across sizes, and an optimum that
  drifts with the size (bigger tiles for bigger problems) is followed rather than copied.
* **recommendation**: among configurations measured valid at some tuned size and never
  failed (compile and resource failures do not depend on the size), or every valid
  configuration when the space is small, the lowest *pessimistic* prediction
  ``mean + std`` of ``r`` at the requested size: a configuration known to be good
  beats one the model merely hopes is good.
  ``predicted_ms = exp(scale(size) + mean)``.

An exactly tuned size returns its measured best. With a single tuned size nothing can be
learnt about how the landscape moves: its best is returned, its time scaled by volume.
The basis names every factor between the nearest tuned size's best time and the
predicted one (`time_factors`): their product is the prediction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fleettune.sizes import ProblemSize, problem_size, size_key
from fleettune_job.protocol import Outcome

if TYPE_CHECKING:
    from fleettune.results import TrialRecord

Observations = list[tuple[dict[str, Any], float | None]]  # (configuration, ms or None: invalid)
Records = Mapping[ProblemSize, Sequence[tuple[dict[str, Any], float | None]]]

SLOPE_PRIOR_WEIGHT = 1.0  # pseudo-observations (in log-volume units²) pulling the slope to 1
MAX_TRAIN = 600  # GP training points: the best of every size first, then a spread of the rest
MAX_ENUMERATE = 50_000  # below this many valid configurations, rank all of them
PESSIMISM = 1.0  # recommend by mean + PESSIMISM * std of the predicted slow-down


@dataclass(frozen=True)
class Recommendation:
    config: dict[str, Any]
    predicted_ms: float
    basis: str

    def as_dict(self) -> dict[str, Any]:
        return {"config": self.config, "predictedMs": round(self.predicted_ms, 6), "basis": self.basis}


def observations(records: Iterable[TrialRecord]) -> Observations:
    """(configuration, time in ms or None for an invalid configuration) of the stored
    records that observe their configuration (infrastructure failures do not)."""
    return [(r.config, r.objective if r.outcome == Outcome.OK else None) for r in records if r.is_observation]


def _log_volume(size: Sequence[int]) -> float:
    return float(sum(math.log(s) for s in size))


def _distance(a: ProblemSize, b: ProblemSize) -> float:
    """Octaves between two sizes (Euclidean over log2 of the dimensions)."""
    return float(np.linalg.norm(np.log2(np.asarray(a, float)) - np.log2(np.asarray(b, float))))


def _key(row: np.ndarray) -> bytes:
    return np.asarray(row, dtype=np.int32).tobytes()


@dataclass
class _Data:
    rows: dict[ProblemSize, np.ndarray]  # valid rows per size
    logt: dict[ProblemSize, np.ndarray]  # their log times
    failed: set[bytes]  # rows that failed at some size


def _collect(space: Any, records_by_size: Records) -> _Data:
    rows: dict[ProblemSize, np.ndarray] = {}
    logt: dict[ProblemSize, np.ndarray] = {}
    failed: set[bytes] = set()
    for size, recs in records_by_size.items():
        ok = [(c, t) for c, t in recs if t is not None and math.isfinite(t) and t > 0]
        for c, t in recs:
            if t is None or not math.isfinite(t) or t <= 0:
                failed.add(_key(np.asarray(space.to_rows([c]))[0]))
        if ok:
            r = np.asarray(space.to_rows([c for c, _ in ok]), dtype=np.int32)
            y = np.log(np.array([t for _, t in ok], dtype=np.float64))
            # Repeated measurements of one configuration at one size: keep the mean.
            uniq, inv = np.unique(r, axis=0, return_inverse=True)
            rows[size] = uniq
            logt[size] = np.bincount(inv.ravel(), weights=y) / np.bincount(inv.ravel())
    return _Data(rows, logt, failed)


def fit_scale(best_by_size: Mapping[ProblemSize, float]) -> tuple[float, float]:
    """(intercept, slope) of log best time against log volume, slope shrunk towards 1."""
    xs = np.array([_log_volume(s) for s in best_by_size])
    ys = np.array([math.log(t) for t in best_by_size.values()])
    x0, y0 = xs.mean(), ys.mean()
    dx = xs - x0
    slope = (float(dx @ (ys - y0)) + SLOPE_PRIOR_WEIGHT) / (float(dx @ dx) + SLOPE_PRIOR_WEIGHT)
    return y0 - slope * x0, slope


def _train_subset(data: _Data, rng: np.random.Generator) -> list[tuple[ProblemSize, np.ndarray]]:
    """Indices per size to train on: every size's best configurations always, the rest
    spread evenly, at most MAX_TRAIN in all."""
    total = sum(len(v) for v in data.logt.values())
    if total <= MAX_TRAIN:
        return [(s, np.arange(len(y))) for s, y in data.logt.items()]
    share = max(8, MAX_TRAIN // len(data.logt))
    out = []
    for s, y in data.logt.items():
        order = np.argsort(y, kind="stable")
        top, rest = order[: share // 2], order[share // 2 :]
        pick = rng.choice(rest, size=min(len(rest), share - len(top)), replace=False) if len(rest) else rest
        out.append((s, np.concatenate([top, np.sort(pick)])))
    return out


def _candidates(space: Any, data: _Data) -> np.ndarray:
    measured = np.unique(np.vstack(list(data.rows.values())), axis=0)
    if space.count() <= MAX_ENUMERATE:
        every = np.asarray(space.enumerate(), dtype=np.int32)
        measured = np.unique(np.vstack([measured, every]), axis=0)
    keep = np.array([_key(r) not in data.failed for r in measured], dtype=bool)
    return measured[keep]


def recommend(space: Any, records_by_size: Records, size: Sequence[int], *, seed: int = 0) -> Recommendation:
    """A configuration for ``size`` from the results of other sizes of the same pool.

    ``records_by_size``: size → [(config, time in ms, or None for a failed trial)].
    """
    size = problem_size(size)
    data = _collect(space, records_by_size)
    if not data.rows:
        raise ValueError("no valid result at any tuned size: nothing to recommend from")
    dims = {len(s) for s in data.rows}
    if dims != {len(size)}:
        raise ValueError(f"problem size {size_key(size)} has {len(size)} dimension(s); "
                         f"the tuned sizes have {sorted(dims)}")
    best_idx = {s: int(np.argmin(y)) for s, y in data.logt.items()}
    best_ms = {s: float(math.exp(data.logt[s][i])) for s, i in best_idx.items()}
    nearest = min(data.rows, key=lambda s: (_distance(s, size), s))
    if size in data.rows:
        cfg = space.to_configs(data.rows[size][best_idx[size]].reshape(1, -1))[0]
        return Recommendation(cfg, best_ms[size], f"measured: best of {len(data.rows[size])} results at this size")
    intercept, slope = fit_scale(best_ms)
    scale = intercept + slope * _log_volume(size)
    if len(data.rows) == 1:
        cfg = space.to_configs(data.rows[nearest][best_idx[nearest]].reshape(1, -1))[0]
        return Recommendation(
            cfg, math.exp(scale),
            f"only one tuned size: its best configuration; "
            f"{time_factors(best_ms[nearest], nearest, size, intercept, slope, 0.0)}",
        )
    return _gp_recommend(space, data, size, (intercept, slope), best_ms[nearest], nearest, seed)


def time_factors(best_ms: float, nearest: ProblemSize, size: ProblemSize, intercept: float, slope: float,
                 slow_down: float) -> str:
    """Every factor between the nearest tuned size's best time and the predicted one, in
    words: the volume's, the fitted scale's offset from that best (the line through all the
    tuned sizes' bests need not pass through this one), and the configuration's predicted
    log slow-down ``slow_down`` (clamped at 0, as the prediction is). Their product is the
    predicted time: ``exp(intercept + slope·log volume(size) + max(0, slow_down))``."""
    volume = math.exp(_log_volume(size) - _log_volume(nearest))
    by_volume = volume**slope
    offset = math.exp(intercept + slope * _log_volume(nearest)) / best_ms
    slower = math.exp(max(0.0, slow_down))
    total = by_volume * offset * slower
    return (f"{best_ms:.4g} ms at {size_key(nearest)} (nearest tuned) × {by_volume:.3g} "
            f"(volume {volume:.3g}×, time ∝ volume^{slope:.2f}) × {offset:.3g} (fit over tuned sizes) "
            f"× {slower:.3g} (config's predicted slow-down) = {best_ms * total:.4g} ms ({total:.3g}×)")


def _size_features(size: ProblemSize, lo: np.ndarray, span: np.ndarray) -> np.ndarray:
    return (np.log2(np.asarray(size, dtype=np.float64)) - lo) / span


def _gp_recommend(space: Any, data: _Data, size: ProblemSize, fit: tuple[float, float], nearest_ms: float,
                  nearest: ProblemSize, seed: int) -> Recommendation:
    import torch

    from fleettune.optimize.features import model_features
    from fleettune.optimize.gp import Posterior, fit_hyper

    sizes = sorted(data.rows)
    logs = np.log2(np.asarray(sizes, dtype=np.float64))
    lo = logs.min(axis=0)
    # One unit = the tuned range of a dimension (at least one octave): the GP's length-scale
    # prior is set for features in [0, 1].
    span = np.maximum(logs.max(axis=0) - lo, 1.0)
    cand = _candidates(space, data)
    # Features of training rows and candidates together, so both are normalised alike.
    train = _train_subset(data, np.random.default_rng(seed))
    train_rows = np.vstack([data.rows[s][i] for s, i in train])
    feats, _, _ = model_features(space, np.vstack([train_rows, cand]))
    x_cfg, x_cand = feats[: len(train_rows)], feats[len(train_rows) :]
    x_size = np.vstack([np.tile(_size_features(s, lo, span), (len(i), 1)) for s, i in train])
    x = np.hstack([x_cfg, x_size])
    # Slow-down relative to each size's best: 0 at the optimum, the same scale at every size.
    r = np.concatenate([data.logt[s][i] - data.logt[s].min() for s, i in train])
    mu, sd = float(r.mean()), float(r.std()) or 1.0
    z = (r - mu) / sd
    noise = np.full(len(z), 1e-4)
    hyper = fit_hyper(x, z, noise, max_iter=60)
    gp = Posterior(x, z, noise, hyper)
    xq = np.hstack([x_cand, np.tile(_size_features(size, lo, span), (len(x_cand), 1))])
    mean, var = gp.predict(torch.as_tensor(xq), fast=False)
    mean = mean.numpy() * sd + mu
    std = np.sqrt(var.numpy()) * sd
    score = mean + PESSIMISM * std
    j = int(np.argmin(score))
    cfg = space.to_configs(cand[j].reshape(1, -1))[0]
    measured_at = [s for s in sizes if (data.rows[s] == cand[j]).all(axis=1).any()]
    where = ", ".join(size_key(s) for s in measured_at) or "no tuned size (predicted only)"
    intercept, slope = fit
    # The factors first: a status shortens a long basis from its end.
    basis = (f"{time_factors(nearest_ms, nearest, size, intercept, slope, float(mean[j]))}; "
             f"GP over {len(r)} results at {len(sizes)} tuned sizes ({', '.join(size_key(s) for s in sizes)}), "
             f"nearest {_distance(nearest, size):.2g} octaves away; config measured at {where}")
    scale = intercept + slope * _log_volume(size)
    return Recommendation(cfg, float(math.exp(scale + max(0.0, float(mean[j])))), basis)
