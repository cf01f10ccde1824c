"""`fleettune bench fleet`: one kernel tuned on N GPUs at once, as a TuningRun with N pools
would be, replayed from the recordings (no cluster): does sharing results between the
pools while they tune beat independent pools?

The recordings (``--cache``) are grouped by kernel family (the name before the first
'-'); a family of fewer than two is left out. For each seed, each family is replayed in
three modes, every pool with the same seed and budget (`fleet_run`):

  independent  each pool a cold study (today's behaviour; a pool's replay is
               `bench strategy`'s, batched as one GPU's Pods with ``--batch``);
  sharing      the pools advance in lockstep rounds, each round every pool gets its
               next batch (``--batch``, ramped as the operator's Pods are) and the
               round's results arrive in GPU order; as in the operator, a pool's
               study is rebuilt with every other pool's results so far as its prior
               whenever they have grown by a quarter
               (one group per pool, times relative to that pool's best, as the
               operator's warm starts are) and its own results observed again. A prior
               that misleads is dropped as in any warm start (``prior_patience``);
  sequential   the pools tuned one after another, each warm-started from every
               earlier pool's full results (budget). The best of all N! orders would
               cost N! replays: this tries the N orders that start from each pool, the
               others following in GPU order, and keeps the one with the least mean
               fleet GPU-seconds over the seeds (evaluations without costs).

And a fourth, ``memory``: a second run of the kernel on each GPU that the first run (the
independent pools of the other GPUs, their full budget) did not tune, started from the
first run's results as the fleet's memory gives them (one group per pool, times relative to
its best), against that GPU's cold run of the same seed.

Per pool: the evaluations (budget + 1 where never: censored) and GPU-seconds (recorded
verification + benchmark time; null without costs) to 0.95 and 0.99 of its own
recorded optimum. Per fleet, at 0.95: the rounds until the last pool got there
(wall clock, the pools run in parallel) and the GPU-seconds all pools spent in those
rounds (sequential: every earlier pool's full budget and the last pool's seconds
until it got there). ``--json``: ``summary`` per family (sharing against independent:
ratio of the mean evaluations to 0.95 over pools and seeds, of the mean fleet
GPU-seconds, and the pool with the largest ratio with its paired difference per seed and
standard error) and ``pools``, one row per pool per mode (per-seed figures and means).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from fleettune_dev.bench.fleet_run import (
    LEVELS,
    Pool,
    PriorBuilder,
    fleet_parallel,
    fleet_sequential,
    load_pool,
    lockstep,
    pool_figures,
    sequential,
)
from fleettune_dev.bench.fleet_summary import compare, family_summary, format_family, pool_rows
from fleettune_dev.bench.replay import family
from fleettune_dev.bench.strategy import parse_options


def orders(n: int) -> list[list[int]]:
    """The sequential orders tried: each pool first, the others in GPU order."""
    return [[first, *(j for j in range(n) if j != first)] for first in range(n)]


def run_family_seed(pools: list[Pool], strategy: str, seed: int, budget: int, batch: int = 1, *,
                    options: dict[str, Any] | None = None, ramp: bool = True,
                    with_sequential: bool = True) -> dict[str, Any]:
    """One seed of one family: every mode's per-pool and fleet figures (`fleet_summary`'s record)."""
    stop = max(LEVELS)
    names = [p.name for p in pools]

    def view(traces: list[Any]) -> dict[str, Any]:
        return {"pools": {n: pool_figures(p, t) for n, p, t in zip(names, pools, traces, strict=True)},
                "fleet": fleet_parallel(pools, traces)}

    # Independent pools run their full budget: a pool's run is also the first of a sequential order.
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(mode: str) -> None:
        nonlocal clock
        seconds[mode], clock = time.perf_counter() - clock, time.perf_counter()

    cold = lockstep(pools, strategy, seed, budget, batch, options=options, ramp=ramp)
    lap("independent")
    shared = lockstep(pools, strategy, seed, budget, batch, share=True, options=options, ramp=ramp, stop_at=stop)
    lap("sharing")
    builder = PriorBuilder(pools)
    memory = [lockstep([pool], strategy, seed, budget, batch, options=options, ramp=ramp, stop_at=stop, priors=[
        builder.groups(i, [t.observations for j, t in enumerate(cold) if j != i])])[0] for i, pool in enumerate(pools)]
    lap("memory")
    record: dict[str, Any] = {"seed": seed, "independent": view(cold), "sharing": view(shared), "memory": view(memory),
                              "sequential": []}
    if with_sequential:
        for order in orders(len(pools)):
            traces = sequential(pools, order, strategy, seed, budget, batch, options=options, ramp=ramp,
                                first=cold[order[0]], stop_at=stop)
            record["sequential"].append({
                "order": [names[i] for i in order],
                "pools": {names[i]: pool_figures(pools[i], traces[i]) for i in order},
                "fleet": fleet_sequential(pools, traces, order)})
        lap("sequential")
    record["replay_seconds"] = {k: round(v, 1) for k, v in seconds.items()}
    return record


def group(paths: list[str], where: list[str]) -> dict[str, list[Pool]]:
    """The recordings by kernel family, in the order given; a file that is no Kernel Tuner
    cache, or records other parameters than its family's first, is left out with a note,
    and so is a family of fewer than two."""
    from fleettune.space.errors import SpaceError

    families: dict[str, list[Pool]] = {}
    for path in paths:
        try:
            pool = load_pool(path, where)
        except (SpaceError, ValueError, KeyError) as exc:
            print(f"left out {Path(path).name}: {exc}", file=sys.stderr)
            continue
        members = families.setdefault(family(pool.name), [])
        params = [p.name for p in pool.replay.space.parameters]
        if members and params != [p.name for p in members[0].replay.space.parameters]:
            print(f"left out {pool.name}: records other parameters than {members[0].name}", file=sys.stderr)
            continue
        if any(m.name == pool.name for m in members):
            print(f"left out {pool.name}: given twice", file=sys.stderr)
            continue
        members.append(pool)
    for name in [f for f, members in families.items() if len(members) < 2]:
        print(f"left out family {name}: {len(families.pop(name))} GPU (a fleet needs two)", file=sys.stderr)
    return families


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleettune bench fleet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", action="append", default=[], nargs="+",
                   help="Kernel Tuner cache of one GPU (repeatable, or several at once); grouped by kernel family")
    p.add_argument("--where", action="append", default=[],
                   help="replay only the configurations with NAME=V1,V2 / NAME>=V / NAME<=V (repeatable), "
                        "on every recording")
    p.add_argument("--strategy", default="bayes")
    p.add_argument("--option", action="append", default=[],
                   help="strategy option or tuning knob KEY=VALUE (JSON value), for every study")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=60, help="evaluations per pool")
    p.add_argument("--batch", type=int, default=1, help="configurations per pool per round (one Pod's)")
    p.add_argument("--no-ramp", dest="ramp", action="store_false",
                   help="with --batch: every batch takes --batch from the start, rather than ramping up as "
                        "results arrive as the operator's Pods do (slow_start)")
    p.add_argument("--no-sequential", dest="sequential", action="store_false",
                   help="leave out the sequential warm starts (N × (N − 1) more replays per seed)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--json", dest="json_out", help="write the summary and the rows per pool per mode here")
    args = p.parse_args(argv)
    args.cache = [c for group in args.cache for c in group]
    if not args.cache:
        p.error("give at least two --cache FILE of one kernel")
    if args.batch < 1 or args.budget < 1 or args.seeds < 1:
        p.error("--batch, --budget and --seeds must be at least 1")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(max(1, args.threads))
    options = parse_options(args.option, args.strategy)
    families = group(args.cache, args.where)
    if not families:
        print("no kernel family with two recordings or more", file=sys.stderr)
        return 2
    doc: dict[str, Any] = {"summary": {}, "pools": []}
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for name, pools in families.items():
        records = []
        for seed in seeds:
            started = time.perf_counter()
            records.append(run_family_seed(pools, args.strategy, seed, args.budget, args.batch, options=options,
                                           ramp=args.ramp, with_sequential=args.sequential))
            r = records[-1]
            took = ", ".join(f"{m} {v:.0f}" for m, v in r["replay_seconds"].items())
            print(f"  {name} seed {seed} ({time.perf_counter() - started:.0f} s: {took}): evaluations to {LEVELS[0]} "
                  + "; ".join(f"{m} " + ",".join(str(f[f"evals_{LEVELS[0]}"]) for f in r[m]["pools"].values())
                              for m in ("independent", "sharing")),
                  file=sys.stderr, flush=True)
        names = [p.name for p in pools]
        sharing, seq, order = family_summary(names, records)
        second = compare(names, records, "memory", None)
        rows = pool_rows(name, names, records, order)
        print(format_family(name, names, rows, sharing, seq, second, args.budget, args.batch), flush=True)
        print()
        doc["summary"][name] = {**sharing, "second_run": second}
        doc["pools"].extend(rows)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2))
    return 0
