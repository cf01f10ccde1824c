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
    scramble,
)
from fleettune_dev.bench.strategy_latency import latency_report
from fleettune_dev.bench.strategy_tables import (
    format_batch_comparison,
    format_table,
    format_variant_comparison,
    save_plot,
)
from fleettune_job.protocol import Outcome

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


def parse_args(argv: list[str]) -> argparse.Namespace:
    from fleettune_dev.bench.peers import PEERS  # it imports RunTrace from here

    p = argparse.ArgumentParser(prog="fleettune bench strategy", description=__doc__)
    p.add_argument("--cache", action="append", default=[], help="Kernel Tuner cache file (repeatable)")
    p.add_argument("--where", action="append", default=[],
                   help="replay only the configurations with NAME=V1,V2 / NAME>=V / NAME<=V (repeatable): "
                        "a subspace as a user's constraints would leave it, e.g. one where more of it fails")
    p.add_argument("--scramble", action="store_true",
                   help="relabel each parameter's values in a fixed random order (after --where): a space whose "
                        "structure the model cannot see, where no strategy should be behind random sampling")
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
    p.add_argument("--peer", action="append", default=[], choices=sorted(PEERS),
                   help="also replay the same seeds with another tool's strategy (repeatable; see "
                        "fleettune_dev.bench.peers) and print the strategy's difference from it per kernel family")
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
    if args.peer and (args.batch > 1 or args.gpus > 1 or args.latency or args.variant):
        p.error("--peer compares sequential replays: not with --batch, --gpus, --latency or --variant")
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
    from fleettune_dev.bench.peers import PEERS

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
    if args.scramble:
        replays = [scramble(r) for r in replays]
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
                for peer in args.peer:
                    key = _trace_key(replay.name, peer, seed, args.budget, {})
                    if key not in done:
                        done[key] = PEERS[peer](replay, seed, args.budget)
                        if traces_path is not None:
                            _append_trace(traces_path, key, done[key])

    def finished(replay: Replay, opts: dict[str, Any], batch: int = 1, gpus: int = 1,
                 strategy: str = args.strategy) -> dict[int, RunTrace]:
        """The runs of ``replay`` done with these settings, by seed."""
        keys = {s: _trace_key(replay.name, strategy, s, args.budget, opts, batch, gpus, args.ramp)
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
    peers: dict[str, Any] = {}
    for peer in args.peer:
        runs = {r.name: finished(r, {}, strategy=peer) for r in replays}
        peer_results = [summarise(r, peer, list(runs[r.name].values()), args.budget) for r in replays if runs[r.name]]
        ours = {r.name: {s: fractions(r, t) for s, t in finished(r, options).items()} for r in replays}
        theirs = {r.name: {s: fractions(r, t) for s, t in runs[r.name].items()} for r in replays}
        peers[peer] = {"results": [{k: v for k, v in r.items() if not k.startswith("_")} for r in peer_results],
                       "comparison": paired_by_family(theirs, ours, args.budget)}
        print()
        print(format_table(peer_results))
        print()
        print(format_variant_comparison(peers[peer]["comparison"], f"{peer} → {args.strategy}"))
    if args.json_out:
        clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
        doc: dict[str, Any] = {"results": clean}
        if batched:
            doc["batch"], doc["gpus"], doc["ramp"] = args.batch, args.gpus, args.ramp
            doc["sequential"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in by_variant[(1, 1)]]
        if variant is not None:
            doc["variant"] = {"options": variant, "comparison": comparison,
                              "results": [{k: v for k, v in r.items() if not k.startswith("_")} for r in var_results]}
        if peers:
            doc["peers"] = peers
        Path(args.json_out).write_text(json.dumps(doc, indent=2))
    return 0
