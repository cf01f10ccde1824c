"""The statistics of `fleettune bench timeline`: per-run metrics (time to a fraction of
the optimum), means over seeds, the lower bounds no tuner beats (`clairvoyant_s`,
`random_expectation_s`), and the comparison with Kernel Tuner against the targets
(docs/benchmarks.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fleettune_dev.bench.timeline.fleet import startup_draws
from fleettune_dev.bench.timeline.model import KT_PREFIX, FleetModel, Run, TimedSpace

LEVELS = (0.95, 0.99)
# Targets (docs/benchmarks.md).
GPU_S_PER_EVAL_FACTOR = 1.25
WALL_RATIO_TARGET = {1: 1 / 2, 4: 1 / 6}


def clairvoyant_s(ts: TimedSpace, model: FleetModel, gpus: int, seed: int, level: float = 0.95) -> float:
    """Seconds until a tuner that knew the answer would know a configuration at ``level``
    of the optimum: the first of the pool's opening Pods to finish its start-up (the
    seed's own draws) compiles and measures the cheapest such configuration alone.

    No tuner does better under the model, so a wall-clock target below this bound's mean
    ratio cannot be met, and one just above it leaves a real tuner no room to search."""
    r = ts.replay
    good = np.nan_to_num(r.time_ms, nan=np.inf) <= r.optimum / level
    cheapest = float((ts.compile_s + ts.gpu_s(model.framework_on_gpu))[good].min())
    rng = startup_draws(seed)
    return min(model.startup.at(float(rng.standard_normal())) for _ in range(gpus)) + cheapest


def random_expectation_s(ts: TimedSpace, level: float = 0.95) -> float:
    """Kernel Tuner's ``random_sample`` on one GPU, its exact expected seconds until a
    configuration at ``level`` of the optimum is known: the mean over every order in
    which it could draw the recording's configurations (uniformly, without repeats), each
    costing its recorded compile + verification + benchmark + framework time.

    Each of the B configurations below ``level`` comes before all G at it with probability
    1 / (G + 1), and the first of those G is any one of them alike, so the expectation is
    sum(cost of the B) / (G + 1) + mean(cost of the G). Where good configurations are
    common, a few seeds' mean of such draws is mostly the luck of their first draws; this
    is the same baseline with no seed in it. The strategy's own time between draws
    (milliseconds) is left out."""
    r = ts.replay
    cost = ts.compile_s + ts.verify_s + ts.bench_s + ts.framework_s
    good = np.nan_to_num(r.time_ms, nan=np.inf) <= r.optimum / level
    return float(cost[~good].sum() / (good.sum() + 1) + cost[good].mean())


def reach(run: Run, optimum: float, level: float) -> dict[str, float] | None:
    """Wall-clock, GPU-seconds and evaluations until optimum / best >= ``level`` is known
    (None when the run never got there). Evaluations: all results known by then."""
    v = np.where(np.isfinite(run.values), run.values, np.inf)
    best = np.minimum.accumulate(v) if len(v) else v
    hit = np.flatnonzero(optimum / best >= level - 1e-12)
    if len(hit) == 0:
        return None
    t = float(run.times[hit[0]])
    return {"wall_s": t, "gpu_s": run.gpu_seconds(t), "evals": int(np.searchsorted(run.times, t, side="right"))}


def run_metrics(run: Run, optimum: float) -> dict[str, Any]:
    n = len(run.values)
    out: dict[str, Any] = {
        "space": run.space, "mode": run.mode, "gpus": run.gpus, "seed": run.seed,
        "evals": n, "wall_s": run.end, "gpu_s": run.gpu_seconds(run.end),
        "busy": run.gpu_work / run.allocated if run.allocated > 0 else 0.0,
        "pods": run.pods, "mean_batch": float(np.mean(run.batches)) if run.batches else 1.0,
        "gpu_s_per_eval": run.allocated / sum(run.batches) if run.batches else run.allocated / max(n, 1),
        # the bound: 1.25 x recorded verification + benchmark, plus the start-up
        # spread over the batch (per evaluation of finished Pods)
        "gpu_s_per_eval_bound": (
            (GPU_S_PER_EVAL_FACTOR * run.evaluated_gpu_s + run.startup) / sum(run.batches) if run.batches
            else GPU_S_PER_EVAL_FACTOR * run.evaluated_gpu_s / max(n, 1)),
        "latency_s": run.latency,
        "best_fraction": float(optimum / np.nanmin(run.values)) if np.isfinite(run.values).any() else 0.0,
    }
    for level in LEVELS:
        out[f"to_{level}"] = reach(run, optimum, level)
    return out


def curve(run: Run, optimum: float) -> tuple[np.ndarray, np.ndarray]:
    """(time, fraction of optimum) steps of a run."""
    v = np.where(np.isfinite(run.values), run.values, np.inf)
    best = np.minimum.accumulate(v) if len(v) else v
    return run.times, np.where(np.isfinite(best), optimum / best, 0.0)


def mean_of(xs: Iterable[float]) -> float:
    """The mean, NaN when there is nothing to average."""
    xs = list(xs)
    return float(np.mean(xs)) if xs else math.nan


def summarise(metrics: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means over the seeds of one (space, mode, GPUs). A run that never reached a level
    counts with its whole run (a lower bound), and ``reached`` says how many did."""
    out: dict[str, Any] = {k: metrics[0][k] for k in ("space", "mode", "gpus")}
    out["seeds"] = len(metrics)
    for level in LEVELS:
        got = [m[f"to_{level}"] for m in metrics]
        out[f"reached_{level}"] = sum(g is not None for g in got)
        for what, whole in (("wall_s", "wall_s"), ("gpu_s", "gpu_s"), ("evals", "evals")):
            out[f"{what}_to_{level}"] = mean_of(g[what] if g is not None else m[whole]
                                              for g, m in zip(got, metrics, strict=True))
    for k in ("busy", "evals", "wall_s", "gpu_s", "mean_batch", "latency_s"):
        out[k] = mean_of(m[k] for m in metrics)
    out["gpu_s_per_eval"] = mean_of(m["gpu_s_per_eval"] for m in metrics)
    out["gpu_s_per_eval_bound"] = mean_of(m["gpu_s_per_eval_bound"] for m in metrics)
    return out


def mode_label(s: dict[str, Any]) -> str:
    """A summary's mode as the tables name it: a fleet mode with its pool size."""
    return s["mode"] if s["mode"].startswith(KT_PREFIX) else f"{s['mode']} ×{s['gpus']}"


def compare(summaries: Sequence[dict[str, Any]], gpus: Sequence[int],
            clairvoyant: Mapping[tuple[str, int], float] | None = None,
            random_expected: Mapping[str, float] | None = None) -> dict[str, Any]:
    """fleettune's batched Pods against Kernel Tuner's best strategy, per space and pool
    size, and the one-GPU targets. ``clairvoyant``: mean `clairvoyant_s` per (space,
    GPUs), the floor each wall-clock ratio is shown against. ``random_expected``:
    `random_expectation_s` per space; each ratio is also shown against Kernel Tuner's best
    with ``random_sample`` at that expectation instead of its mean over the seeds run."""
    by_space: dict[str, dict[str, dict[str, Any]]] = {}
    for s in summaries:
        by_space.setdefault(s["space"], {})[mode_label(s)] = s
    out: dict[str, Any] = {"per_gpus": {}}
    for g in gpus:
        rows = []
        for space, modes in by_space.items():
            kt = [s for s in modes.values() if s["mode"].startswith(KT_PREFIX)]
            ours = modes.get(f"batch ×{g}")
            if not kt or ours is None:
                continue
            kt_wall = min(kt, key=lambda s: s["wall_s_to_0.95"])
            kt_gpu = min(kt, key=lambda s: s["gpu_s_to_0.95"])
            pod = modes.get(f"pod ×{g}")
            floor = (clairvoyant or {}).get((space, g), math.nan)
            expected = (random_expected or {}).get(space, math.nan)
            others = [s["wall_s_to_0.95"] for s in kt if s["mode"] != KT_PREFIX + "random_sample"]
            kt_expected = min([*others, expected]) if math.isfinite(expected) else math.nan
            rows.append({
                "space": space,
                "batch_wall_s": ours["wall_s_to_0.95"], "batch_reached": ours["reached_0.95"],
                "pod_wall_s": pod["wall_s_to_0.95"] if pod else math.nan,
                "pod_ratio": pod["wall_s_to_0.95"] / kt_wall["wall_s_to_0.95"] if pod else math.nan,
                "kt_best": kt_wall["mode"][len(KT_PREFIX):], "kt_wall_s": kt_wall["wall_s_to_0.95"],
                "kt_reached": kt_wall["reached_0.95"], "seeds": ours["seeds"],
                "wall_ratio": ours["wall_s_to_0.95"] / kt_wall["wall_s_to_0.95"],
                "clairvoyant_s": floor, "clairvoyant_ratio": floor / kt_wall["wall_s_to_0.95"],
                "random_expected_s": expected, "kt_expected_s": kt_expected,
                "wall_ratio_expected": ours["wall_s_to_0.95"] / kt_expected,
                "batch_gpu_s": ours["gpu_s_to_0.95"], "kt_best_gpu": kt_gpu["mode"][len(KT_PREFIX):],
                "kt_gpu_s": kt_gpu["gpu_s_to_0.95"],
                "gpu_ok": ours["gpu_s_to_0.95"] <= kt_gpu["gpu_s_to_0.95"],
                "batch_evals": ours["evals_to_0.95"], "kt_evals": kt_wall["evals_to_0.95"],
                "batch_s_per_eval": ours["wall_s_to_0.95"] / max(ours["evals_to_0.95"], 1),
                "kt_s_per_eval": kt_wall["wall_s_to_0.95"] / max(kt_wall["evals_to_0.95"], 1),
                "gpu_s_per_eval": ours["gpu_s_per_eval"], "gpu_s_per_eval_bound": ours["gpu_s_per_eval_bound"],
                "per_eval_ok": ours["gpu_s_per_eval"] <= ours["gpu_s_per_eval_bound"],
            })
        if not rows:
            continue
        mean_ratio = mean_of(r["wall_ratio"] for r in rows)
        # One space where a Kernel Tuner strategy is lucky (its first configurations hit
        # a rare near-optimum) can dominate a mean of ratios: the geometric mean and the
        # ratio of totals are printed beside it.
        entry: dict[str, Any] = {"rows": rows, "mean_wall_ratio": mean_ratio,
                                 "geomean_wall_ratio": float(np.exp(np.mean(np.log([r["wall_ratio"] for r in rows])))),
                                 "total_wall_ratio": sum(r["batch_wall_s"] for r in rows)
                                 / sum(r["kt_wall_s"] for r in rows),
                                 "mean_pod_ratio": mean_of(r["pod_ratio"] for r in rows),
                                 "mean_clairvoyant_ratio": mean_of(r["clairvoyant_ratio"] for r in rows),
                                 "mean_wall_ratio_expected": mean_of(r["wall_ratio_expected"] for r in rows),
                                 "total_gpu_ratio": sum(r["batch_gpu_s"] for r in rows)
                                 / sum(r["kt_gpu_s"] for r in rows),
                                 "gpu_never_more": all(r["gpu_ok"] for r in rows),
                                 "gpu_misses": [r["space"] for r in rows if not r["gpu_ok"]],
                                 "per_eval_misses": [r["space"] for r in rows if not r["per_eval_ok"]]}
        if g in WALL_RATIO_TARGET:
            entry["wall_ratio_target"] = WALL_RATIO_TARGET[g]
            entry["wall_ratio_met"] = mean_ratio <= WALL_RATIO_TARGET[g]
        out["per_gpus"][str(g)] = entry
    return out
