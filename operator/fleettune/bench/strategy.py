"""`fleettune bench strategy`: replay recorded search spaces against a strategy.

The candidate set is the set of cached configurations; evaluating one returns its
recorded time, or its failure (which counts as an evaluation). Score after N unique
evaluations = global optimum / best valid time found so far (0 before any success).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fleettune_job.protocol import Outcome

CHECKPOINTS = (20, 40, 60, 100, 150, 220)
FAILURE_OUTCOME = {"compile": Outcome.COMPILE_ERROR, "runtime": Outcome.RUNTIME_ERROR, "invalid": Outcome.COMPILE_ERROR}


@dataclass
class Replay:
    """A recorded space reduced to what a replay needs."""

    name: str
    space: Any
    rows: np.ndarray  # (N, d) index rows of the cached configurations
    time_ms: np.ndarray  # (N,) nan where the configuration failed
    failure: list[str | None]
    times: list[list[float]]
    optimum: float = field(init=False)

    def __post_init__(self) -> None:
        self.optimum = float(np.nanmin(self.time_ms))


def load_replay(path: str | Path) -> Replay:
    from fleettune.space.interop import read_kernel_tuner_cache

    rec = read_kernel_tuner_cache(path)
    time_ms = np.array([np.nan if r.time_ms is None else float(r.time_ms) for r in rec.records])
    return Replay(
        name=Path(path).name,
        space=rec.space,
        rows=np.asarray(rec.rows, dtype=np.int32),
        time_ms=time_ms,
        failure=[r.failure for r in rec.records],
        times=[list(r.times or []) for r in rec.records],
    )


@dataclass
class RunTrace:
    best: np.ndarray  # (budget,) best valid time after each evaluation (inf before any)
    invalid: int
    suggest_ms: list[float]


def run_once(
    replay: Replay, strategy: str, seed: int, budget: int, options: dict[str, Any] | None = None
) -> RunTrace:
    from fleettune.optimize import Study

    study = Study(replay.space, strategy=strategy, seed=seed, candidates=replay.rows, options=options)
    lookup = study.candidates.lookup
    best = np.full(budget, np.inf)
    current = math.inf
    invalid = 0
    suggest_ms: list[float] = []
    budget = min(budget, len(replay.rows))
    for i in range(budget):
        t0 = time.perf_counter()
        configs = study.suggest(1)
        suggest_ms.append(1000.0 * (time.perf_counter() - t0))
        if not configs:
            break
        c = int(lookup(np.asarray(replay.space.to_rows(configs), dtype=np.int32))[0])
        t = replay.time_ms[c]
        if math.isfinite(t):
            study.observe(configs[0], Outcome.OK, float(t), replay.times[c])
            current = min(current, float(t))
        else:
            study.observe(configs[0], FAILURE_OUTCOME.get(replay.failure[c] or "runtime", Outcome.RUNTIME_ERROR))
            invalid += 1
        best[i] = current
    best[budget:] = current
    return RunTrace(best=best, invalid=invalid, suggest_ms=suggest_ms)


def summarise(replay: Replay, strategy: str, traces: list[RunTrace], budget: int) -> dict[str, Any]:
    frac = np.array([np.where(np.isfinite(t.best), replay.optimum / t.best, 0.0) for t in traces])
    marks = [c for c in CHECKPOINTS if c <= budget]

    def evals_to(level: float) -> float:
        hit = [int(np.argmax(f >= level - 1e-12)) + 1 if (f >= level - 1e-12).any() else budget + 1 for f in frac]
        return float(np.mean(hit))

    ms = [m for t in traces for m in t.suggest_ms]
    return {
        "space": replay.name,
        "strategy": strategy,
        "seeds": len(traces),
        "budget": budget,
        "fraction": {str(c): float(frac[:, c - 1].mean()) for c in marks},
        "fraction_std": {str(c): float(frac[:, c - 1].std()) for c in marks},
        "evals_to_0.95": evals_to(0.95),
        "evals_to_0.99": evals_to(0.99),
        "invalid_evals": float(np.mean([t.invalid for t in traces])),
        "ms_per_suggestion_median": float(statistics.median(ms)) if ms else 0.0,
        "_curve": frac.mean(axis=0).tolist(),
    }


def format_table(results: list[dict[str, Any]]) -> str:
    if not results:
        return ""
    marks = list(results[0]["fraction"])
    head = ["space", "strategy", "seeds", *[f"@{m}" for m in marks], "→0.95", "→0.99", "invalid", "ms/sugg"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r["space"], r["strategy"], str(r["seeds"])]
        cells += [f"{r['fraction'][m]:.3f} ± {r['fraction_std'][m]:.3f}" for m in marks]
        cells += [f"{r['evals_to_0.95']:.0f}", f"{r['evals_to_0.99']:.0f}", f"{r['invalid_evals']:.1f}"]
        cells += [f"{r['ms_per_suggestion_median']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if len(results) > 1:
        mean = [float(np.mean([r["fraction"][m] for r in results])) for m in marks]
        lines.append("| **mean** | | | " + " | ".join(f"{v:.3f}" for v in mean) + " | | | | |")
    return "\n".join(lines)


def save_plot(result: dict[str, Any], directory: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    curve = result["_curve"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(range(1, len(curve) + 1), curve, label=result["strategy"])
    ax.set_xlabel("unique evaluations")
    ax.set_ylabel("fraction of optimum (mean over seeds)")
    ax.set_title(result["space"])
    ax.set_ylim(min(0.5, min(curve) if curve else 0.5), 1.005)
    ax.grid(alpha=0.3)
    ax.legend()
    out = directory / f"{result['space'].split('.')[0]}-{result['strategy']}.png"
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleettune bench strategy", description=__doc__)
    p.add_argument("--cache", action="append", default=[], help="Kernel Tuner cache file (repeatable)")
    p.add_argument("--strategy", default="bayes")
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=220)
    p.add_argument("--json", dest="json_out", help="write the results here")
    p.add_argument("--plots", help="directory for one convergence plot per space")
    p.add_argument("--option", action="append", default=[], help="strategy option KEY=VALUE (JSON value)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--latency", action="store_true", help="measure suggestion latency instead of quality")
    p.add_argument("--latency-candidates", type=int, default=1_000_000)
    return p.parse_args(argv)


def parse_options(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def main(argv: list[str], loader: Callable[[str], Replay] = load_replay) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(max(1, args.threads))
    options = parse_options(args.option)
    if args.latency:
        from fleettune.bench.strategy_latency import latency_report

        print(latency_report(args, loader, options))
        return 0
    if not args.cache:
        print("give at least one --cache FILE", file=sys.stderr)
        return 2
    results = []
    for path in args.cache:
        replay = loader(path)
        traces = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            traces.append(run_once(replay, args.strategy, seed, args.budget, options))
        res = summarise(replay, args.strategy, traces, args.budget)
        results.append(res)
        print(format_table([res]).splitlines()[-1], flush=True)
        if args.plots:
            save_plot(res, Path(args.plots))
    print(format_table(results))
    if args.json_out:
        clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
        Path(args.json_out).write_text(json.dumps({"results": clean}, indent=2))
    return 0
