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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fleettune_dev.bench.replay import (
    FAILURE_OUTCOME,
    Replay,
    family,
    fractions_of,
    load_replay,
    random_expectation,
    restrict,
)
from fleettune_job.protocol import Outcome

Answer = Callable[[dict], tuple[Outcome, float | None]]
CHECKPOINTS = (20, 40, 60, 100, 150, 220)
@dataclass
class RunTrace:
    best: np.ndarray  # (budget,) best valid time after each evaluation (inf before any)
    invalid: int
    suggest_ms: list[float]


def run_once(
    replay: Replay, strategy: str, seed: int, budget: int, options: dict[str, Any] | None = None
) -> RunTrace:
    from fleettune.optimize import Study, split_settings

    study = Study(replay.space, strategy=strategy, seed=seed, candidates=replay.rows,
                  **split_settings(strategy, options))
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


def run_batched(
    replay: Replay,
    strategy: str,
    seed: int,
    budget: int,
    batch: int,
    gpus: int,
    options: dict[str, Any] | None = None,
    ramp: bool = True,
) -> RunTrace:
    """`run_once` with batched Pods: ``gpus`` Pods of up to ``batch``
    configurations outstanding, each suggested with every outstanding configuration
    pending. The oldest Pod completes first and its results are observed in evaluation
    order; then a new Pod is suggested. Evaluations count in the order they are observed.
    ``ramp``: Pods ramp up to ``batch`` as results arrive, as the operator's do
    (`slow_start`); False: every Pod takes ``batch`` from the start."""
    from collections import deque

    from fleettune.optimize import Study, split_settings
    from fleettune.optimize.batching import slow_start

    study = Study(replay.space, strategy=strategy, seed=seed, candidates=replay.rows,
                  **split_settings(strategy, options))
    lookup = study.candidates.lookup
    budget = min(budget, len(replay.rows))
    best = np.full(budget, np.inf)
    current = math.inf
    invalid = 0
    n = 0
    assigned = 0
    suggest_ms: list[float] = []
    outstanding: deque[list[dict[str, Any]]] = deque()

    def fill() -> None:
        nonlocal assigned
        while len(outstanding) < gpus and assigned < budget:
            pending = [c for pod in outstanding for c in pod]
            k = slow_start(batch, n, len(pending)) if ramp and study.learns else batch
            t0 = time.perf_counter()
            configs = study.suggest(min(k, budget - assigned), pending)
            suggest_ms.append(1000.0 * (time.perf_counter() - t0))
            if not configs:
                return
            outstanding.append(configs)
            assigned += len(configs)

    fill()
    while outstanding:
        for config in outstanding.popleft():
            c = int(lookup(np.asarray(replay.space.to_rows([config]), dtype=np.int32))[0])
            t = replay.time_ms[c]
            if math.isfinite(t):
                study.observe(config, Outcome.OK, float(t), replay.times[c])
                current = min(current, float(t))
            else:
                study.observe(config, FAILURE_OUTCOME.get(replay.failure[c] or "runtime", Outcome.RUNTIME_ERROR))
                invalid += 1
            best[n] = current
            n += 1
        fill()
    best[n:] = current
    return RunTrace(best=best, invalid=invalid, suggest_ms=suggest_ms)


def summarise(replay: Replay, strategy: str, traces: list[RunTrace], budget: int) -> dict[str, Any]:
    frac = np.array([fractions(replay, t) for t in traces])
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
        "random": {str(c): float(v) for c, v in zip(marks, random_expectation(replay, budget)[[c - 1 for c in marks]],
                                                     strict=True)},
        "_curve": frac.mean(axis=0).tolist(),
    }


def fractions(replay: Replay, trace: RunTrace) -> np.ndarray:
    """Fraction of the optimum after each evaluation of one run (0 before any success)."""
    return fractions_of(replay, trace.best)


def paired_by_family(
    base: dict[str, dict[int, np.ndarray]], variant: dict[str, dict[int, np.ndarray]], budget: int
) -> list[dict[str, Any]]:
    """A variant against its baseline, per kernel family and over all spaces: the mean
    fraction of the optimum of each at every checkpoint, and the paired difference
    (variant − baseline) per seed, a seed's difference being the mean over the group's
    spaces, with its standard error over the seeds. ``base`` and ``variant``: per space,
    per seed, the run's `fractions`. Only the seeds run on every space of the group by
    both count, so that a run cut short compares like with like."""
    marks = [c for c in CHECKPOINTS if c <= budget]
    spaces = sorted(set(base) & set(variant))
    groups: dict[str, list[str]] = {}
    for name in spaces:
        groups.setdefault(family(name), []).append(name)
    if len(groups) > 1:
        groups["all"] = spaces
    out = []
    for name, members in groups.items():
        seeds = sorted(set.intersection(*[set(base[m]) & set(variant[m]) for m in members]))
        if not seeds:
            continue
        b = np.array([[base[m][s] for m in members] for s in seeds]).mean(axis=1)
        v = np.array([[variant[m][s] for m in members] for s in seeds]).mean(axis=1)
        d = v - b
        se = d.std(axis=0, ddof=1) / math.sqrt(len(seeds)) if len(seeds) > 1 else np.full(d.shape[1], math.nan)
        out.append({
            "family": name, "spaces": len(members), "seeds": len(seeds),
            "baseline": {str(c): float(b[:, c - 1].mean()) for c in marks},
            "variant": {str(c): float(v[:, c - 1].mean()) for c in marks},
            "difference": {str(c): float(d[:, c - 1].mean()) for c in marks},
            "standard_error": {str(c): float(se[c - 1]) for c in marks},
        })
    return out


def format_variant_comparison(rows: list[dict[str, Any]], label: str) -> str:
    """`paired_by_family` as a table: baseline → variant (paired difference ± standard error)."""
    if not rows:
        return ""
    marks = list(rows[0]["baseline"])
    head = ["family", "spaces", "seeds", *[f"@{m}" for m in marks]]
    lines = [f"### {label} (mean fraction of optimum, baseline → variant; paired difference per seed ± standard "
             "error)", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        name = "**all**" if r["family"] == "all" else r["family"]
        cells = [name, str(r["spaces"]), str(r["seeds"])]
        for m in marks:
            se = r["standard_error"][m]
            cells.append(f"{r['baseline'][m]:.3f} → {r['variant'][m]:.3f} ({r['difference'][m]:+.3f}"
                         + (f" ± {se:.3f})" if math.isfinite(se) else ")"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
        if "random" in r:
            lines.append(f"| | {RANDOM} | | " + " | ".join(_versus(r, m) for m in marks) + " | | | | |")
    if len(results) > 1:
        mean = [float(np.mean([r["fraction"][m] for r in results])) for m in marks]
        lines.append("| **mean** | | | " + " | ".join(f"{v:.3f}" for v in mean) + " | | | | |")
        if all("random" in r for r in results):
            mean = [float(np.mean([r["random"][m] for r in results])) for m in marks]
            lines.append(f"| | {RANDOM} | | " + " | ".join(f"{v:.3f}" for v in mean) + " | | | | |")
    return "\n".join(lines)


RANDOM = "uniform random (expected)"


def _versus(result: dict[str, Any], mark: str) -> str:
    """Random sampling's expected fraction, marked where the strategy's mean is below it."""
    below = result["fraction"][mark] < result["random"][mark]
    return f"{'**' if below else ''}{result['random'][mark]:.3f}{'** (ahead of the strategy)' if below else ''}"


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


def _time_suggestions(study: Any, answer: Answer, k: int, cpu: list[float] | None = None) -> list[float]:
    """Wall milliseconds per suggest(1), observing each answer as a live study would;
    CPU milliseconds go to ``cpu`` (on a shared machine, wall time measures the neighbours)."""
    out = []
    for _ in range(k):
        t0, c0 = time.perf_counter(), time.process_time()
        (config,) = study.suggest(1)
        out.append(1000.0 * (time.perf_counter() - t0))
        if cpu is not None:
            cpu.append(1000.0 * (time.process_time() - c0))
        study.observe(config, *answer(config))
    return out


def _naive_botorch_ms(study: Any, n_score: int) -> float:
    """The baseline being engineered away: BoTorch's generic posterior + LogEI on every
    candidate (hyperparameter fitting not counted)."""
    import torch
    from botorch.acquisition.analytic import LogExpectedImprovement
    from botorch.models import SingleTaskGP

    h = study.history
    ok = np.isfinite(h.value)
    y = np.log(h.value[ok])
    y = (y - y.mean()) / y.std()
    model = SingleTaskGP(torch.as_tensor(h.x[ok]), torch.as_tensor(y).unsqueeze(-1), outcome_transform=None)
    model.eval()
    acq = LogExpectedImprovement(model, best_f=float(y.min()), maximize=False)
    xc = torch.as_tensor(study.candidates.x[:n_score])
    t0 = time.perf_counter()
    with torch.no_grad():
        for s in range(0, len(xc), 4096):
            acq(xc[s : s + 4096].unsqueeze(1))
    return 1000.0 * (time.perf_counter() - t0)


def _synthetic_space(n_params: int = 6, n_values: int = 10) -> tuple[Any, Answer]:
    """10^6 configurations: a smooth landscape with a failing corner (for latency only)."""
    from fleettune.space import SearchSpace

    params = [{"name": f"p{i}", "type": "integer", "range": {"min": 1, "max": n_values}} for i in range(n_params)]
    space = SearchSpace.from_spec(params, [])

    def answer(c: dict) -> tuple[Outcome, float | None]:
        v = [c[f"p{i}"] / n_values for i in range(n_params)]
        if v[0] * v[1] > 0.6:
            return Outcome.COMPILE_ERROR, None
        return Outcome.OK, 1.0 + sum((x - 0.3 - 0.07 * i) ** 2 for i, x in enumerate(v))

    return space, answer


def latency_report(args: argparse.Namespace, loader: Callable[[str], Replay], options: dict[str, Any]) -> str:
    from fleettune.optimize import Study, split_settings

    lines = [f"torch threads: {args.threads}"]
    rng = np.random.default_rng(0)
    k = 15
    if args.cache:
        replay = loader(args.cache[0])
        study = Study(replay.space, "bayes", seed=0, candidates=replay.rows, **split_settings("bayes", options))

        def answer(config: dict) -> tuple[Outcome, float | None]:
            c = int(study.candidates.lookup(np.asarray(replay.space.to_rows([config]), dtype=np.int32))[0])
            t = replay.time_ms[c]
            return (Outcome.OK, float(t)) if math.isfinite(t) else (Outcome.RUNTIME_ERROR, None)

        for c in rng.choice(len(replay.rows), 220, replace=False):
            config = replay.space.to_configs(replay.rows[c : c + 1])[0]
            study.observe(config, *answer(config))
        cpu: list[float] = []
        ms = _time_suggestions(study, answer, k, cpu)
        naive = _naive_botorch_ms(study, len(replay.rows))
        lines.append(
            f"{replay.name}: {len(replay.rows)} candidates, 220 observations: suggest(1) median "
            f"{statistics.median(ms):.1f} ms wall, {statistics.median(cpu):.1f} ms CPU "
            f"(min {min(ms):.1f}, max {max(ms):.1f}, {k} calls; the first rebuilds the fits); "
            f"naive BoTorch LogEI over all candidates: {naive:.0f} ms"
        )
    space, answer = _synthetic_space()
    t0 = time.perf_counter()
    study = Study(space, "bayes", seed=0, **split_settings("bayes", options))
    init_s = time.perf_counter() - t0
    n_cand = len(study.candidates)
    for row in study.candidates.rows[rng.choice(n_cand, 220, replace=False)]:
        config = space.to_configs(row.reshape(1, -1))[0]
        study.observe(config, *answer(config))
    cpu2: list[float] = []
    ms = _time_suggestions(study, answer, k, cpu2)
    part = 50_000
    naive = _naive_botorch_ms(study, part) * n_cand / part
    lines.append(
        f"synthetic {n_cand} candidates, 220 observations: suggest(1) median {statistics.median(ms):.1f} ms "
        f"wall, {statistics.median(cpu2):.1f} ms CPU (min {min(ms):.1f}, max {max(ms):.1f}); "
        f"study set-up {init_s:.1f} s once; "
        f"naive BoTorch LogEI over all candidates: ~{naive / 1000:.1f} s (extrapolated from {part})"
    )
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleettune bench strategy", description=__doc__)
    p.add_argument("--cache", action="append", default=[], help="Kernel Tuner cache file (repeatable)")
    p.add_argument("--where", action="append", default=[],
                   help="replay only the configurations with NAME=V1,V2 / NAME>=V / NAME<=V (repeatable): "
                        "a subspace as a user's constraints would leave it, e.g. one where more of it fails")
    p.add_argument("--strategy", default="bayes")
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=220)
    p.add_argument("--json", dest="json_out", help="write the results here")
    p.add_argument("--plots", help="directory for one convergence plot per space")
    p.add_argument("--option", action="append", default=[],
                   help="strategy option or tuning knob KEY=VALUE (JSON value)")
    p.add_argument("--variant", action="append", default=[],
                   help="also replay the same seeds with this strategy option or tuning knob KEY=VALUE (repeatable) "
                        "on top of --option, and print the difference per kernel family")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--traces", help="JSON-lines file of finished runs: appended to, and resumed from")
    p.add_argument("--summarise-only", action="store_true", help="only summarise the runs in --traces")
    p.add_argument("--latency", action="store_true", help="measure suggestion latency instead of quality")
    p.add_argument("--latency-candidates", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1,
                   help="configurations per Pod; with --gpus, also runs sequential for comparison")
    p.add_argument("--gpus", type=int, default=1, help="Pods outstanding at once (with --batch)")
    p.add_argument("--no-ramp", dest="ramp", action="store_false",
                   help="with --batch: every Pod takes --batch from the start, rather than ramping up as results "
                        "arrive as the operator does (slow_start)")
    args = p.parse_args(argv)
    if args.batch < 1 or args.gpus < 1:
        p.error("--batch and --gpus must be at least 1")
    if args.variant and (args.batch > 1 or args.gpus > 1 or args.latency):
        p.error("--variant compares sequential replays: not with --batch, --gpus or --latency")
    return args


def parse_options(items: list[str], strategy: str) -> dict[str, Any]:
    """``KEY=VALUE`` strategy options and tuning knobs (JSON values; a knob is the
    development hook `Study` takes as ``tuning``, which a TuningRun cannot set), checked by
    the strategy: a misspelt one would otherwise be ignored and a benchmark compare nothing."""
    from fleettune.optimize import OptionError, UnknownStrategyError, split_settings

    out: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    try:
        split_settings(strategy, out)
    except UnknownStrategyError as exc:
        raise SystemExit(f"--strategy: {exc}") from None
    except OptionError as exc:
        raise SystemExit(f"--option {exc.key}: {exc.message}") from None
    return out


def _trace_key(
    space: str, strategy: str, seed: int, budget: int, options: dict[str, Any], batch: int = 1, gpus: int = 1,
    ramp: bool = True,
) -> str:
    # Sequential runs keep the key they always had, so existing trace files still resume;
    # batched runs without the ramp keep theirs too (they were all without it). A ramped
    # run's key names the ramp's share (`True` was the share of 1), so that a trace file
    # from before a change of share is run again, not reused.
    from fleettune.optimize.batching import RAMP_SHARE

    extra: list[dict[str, Any]] = []
    if batch > 1 or gpus > 1:
        share: bool | float = True if RAMP_SHARE == 1 else RAMP_SHARE
        extra = [{"batch": batch, "gpus": gpus, **({"ramp": share} if ramp else {})}]
    return json.dumps([space, strategy, seed, budget, options, *extra], sort_keys=True)


BATCH_TARGET = 0.01  # target: batched search quality within this of sequential at 100 evaluations


def format_batch_comparison(batched: list[dict[str, Any]], sequential: list[dict[str, Any]], budget: int) -> str:
    """Fraction of optimum, batched minus sequential, per space and checkpoint; the target line."""
    seq = {r["space"]: r for r in sequential}
    pairs = [(b, seq[b["space"]]) for b in batched if b["space"] in seq]
    if not pairs:
        return ""
    marks = list(pairs[0][0]["fraction"])
    at = "100" if "100" in marks else marks[-1]
    head = ["space", *[f"Δ@{m}" for m in marks], f"sequential @{at}", f"batched @{at}"]
    lines = [f"### {pairs[0][0]['strategy']} vs sequential (fraction of optimum, batched − sequential)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b, s in pairs:
        cells = [b["space"], *[f"{b['fraction'][m] - s['fraction'][m]:+.3f}" for m in marks]]
        cells += [f"{s['fraction'][at]:.3f}", f"{b['fraction'][at]:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    delta = float(np.mean([b["fraction"][at] - s["fraction"][at] for b, s in pairs]))
    mean_d = [float(np.mean([b["fraction"][m] - s["fraction"][m] for b, s in pairs])) for m in marks]
    lines.append("| **mean** | " + " | ".join(f"{v:+.3f}" for v in mean_d) + " | | |")
    worst = min(pairs, key=lambda p: p[0]["fraction"][at] - p[1]["fraction"][at])
    verdict = "met" if delta >= -BATCH_TARGET else "MISSED"
    lines += ["", f"target (batched vs sequential): mean fraction of optimum at {at} evaluations within "
              f"{BATCH_TARGET} of "
              f"sequential: {delta:+.3f} — {verdict} (worst space {worst[0]['space']}: "
              f"{worst[0]['fraction'][at] - worst[1]['fraction'][at]:+.3f})"]
    return "\n".join(lines)


def _load_traces(path: Path | None) -> dict[str, RunTrace]:
    out: dict[str, RunTrace] = {}
    if path is None or not path.exists():
        return out
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        best = np.array([math.inf if v is None else v for v in rec["best"]])
        out[rec["key"]] = RunTrace(best=best, invalid=rec["invalid"], suggest_ms=rec["suggest_ms"])
    return out


def _append_trace(path: Path, key: str, trace: RunTrace) -> None:
    best = [None if not math.isfinite(v) else float(v) for v in trace.best]
    with path.open("a") as fh:
        fh.write(json.dumps({"key": key, "best": best, "invalid": trace.invalid, "suggest_ms": trace.suggest_ms}))
        fh.write("\n")


def main(argv: list[str], loader: Callable[[str], Replay] = load_replay) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(max(1, args.threads))
    options = parse_options(args.option, args.strategy)
    variant = parse_options(args.option + args.variant, args.strategy) if args.variant else None
    if args.latency:
        print(latency_report(args, loader, options))
        return 0
    if not args.cache:
        print("give at least one --cache FILE", file=sys.stderr)
        return 2
    replays = [loader(path) for path in args.cache]
    if args.where:
        replays = [restrict(r, args.where) for r in replays]
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    traces_path = Path(args.traces) if args.traces else None
    done = _load_traces(traces_path)
    batched = args.batch > 1 or args.gpus > 1
    # Batched runs are compared with sequential ones of the same seeds: both are run; so
    # are a --variant's runs beside the baseline's.
    variants = [(args.batch, args.gpus), (1, 1)] if batched else [(1, 1)]
    option_sets = [options] if variant is None else [options, variant]
    # Seed-major order: a long run cut short (or resumed from --traces) has about the
    # same number of seeds on every space.
    if not args.summarise_only:
        for seed in seeds:
            for replay in replays:
                for opts in option_sets:
                    for batch, gpus in variants:
                        key = _trace_key(replay.name, args.strategy, seed, args.budget, opts, batch, gpus,
                                         args.ramp)
                        if key in done:
                            continue
                        if (batch, gpus) == (1, 1):
                            done[key] = run_once(replay, args.strategy, seed, args.budget, opts)
                        else:
                            done[key] = run_batched(replay, args.strategy, seed, args.budget, batch, gpus, opts,
                                                    ramp=args.ramp)
                        if traces_path is not None:
                            _append_trace(traces_path, key, done[key])

    def finished(replay: Replay, opts: dict[str, Any], batch: int = 1, gpus: int = 1) -> dict[int, RunTrace]:
        """The runs of ``replay`` done with these settings, by seed."""
        keys = {s: _trace_key(replay.name, args.strategy, s, args.budget, opts, batch, gpus, args.ramp)
                for s in seeds}
        return {s: done[k] for s, k in keys.items() if k in done}

    by_variant: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for batch, gpus in variants:
        label = args.strategy if (batch, gpus) == (1, 1) else f"{args.strategy}-{gpus}x{batch}"
        label += "" if args.ramp or (batch, gpus) == (1, 1) else "-noramp"
        results = by_variant.setdefault((batch, gpus), [])
        for replay in replays:
            if not (traces := finished(replay, options, batch, gpus)):
                continue
            res = summarise(replay, label, list(traces.values()), args.budget)
            results.append(res)
            if args.plots:
                save_plot(res, Path(args.plots))
    results = by_variant[variants[0]]
    print(format_table(results))
    if batched:
        print()
        print(format_table(by_variant[(1, 1)]))
        print()
        print(format_batch_comparison(results, by_variant[(1, 1)], args.budget))
    comparison: list[dict[str, Any]] = []
    var_results: list[dict[str, Any]] = []
    if variant is not None:
        label = f"{args.strategy} with {' '.join(args.variant)}"
        var_results = [summarise(r, label, list(t.values()), args.budget)
                       for r in replays if (t := finished(r, variant))]

        def by_seed(opts: dict[str, Any]) -> dict[str, dict[int, np.ndarray]]:
            return {r.name: {s: fractions(r, t) for s, t in finished(r, opts).items()} for r in replays}

        comparison = paired_by_family(by_seed(options), by_seed(variant), args.budget)
        print()
        print(format_table(var_results))
        print()
        print(format_variant_comparison(comparison, f"{label} vs {args.strategy}"))
    if args.json_out:
        clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
        doc: dict[str, Any] = {"results": clean}
        if batched:
            doc["batch"], doc["gpus"], doc["ramp"] = args.batch, args.gpus, args.ramp
            doc["sequential"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in by_variant[(1, 1)]]
        if variant is not None:
            doc["variant"] = {"options": variant, "comparison": comparison,
                              "results": [{k: v for k, v in r.items() if not k.startswith("_")} for r in var_results]}
        Path(args.json_out).write_text(json.dumps(doc, indent=2))
    return 0
