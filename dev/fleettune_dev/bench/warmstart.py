"""`fleettune bench warmstart`: what a warm start from another GPU's results is worth.

For each seed: tune the *source* recording for ``--source-budget`` evaluations; then
tune the *target* recording (same kernel, another GPU or driver) twice with the same
seed — warm, with every source observation as ``prior=``, and cold — and count the
evaluations each needs to reach 0.95 and 0.99 of the target's recorded optimum.
Only target evaluations count: the source results already exist when a pool is
re-tuned. Replay protocol as `fleettune bench strategy`: candidates are the recorded
configurations, a failed configuration counts as an evaluation, a run that never
reaches a level counts as budget + 1 (reported as censored).

A warm start can only lead to what the source measured: each seed also records the
best fraction of the target's optimum among the source's measurements
(``source_reach``), and the summary splits the seeds by whether that reaches 0.95.

``--all-ordered-pairs DIR``: every ordered pair of recordings of the same kernel in DIR
(a warm start must never be clearly worse than a cold one), with a summary of
the worst and the mean ratio over the pairs and per kernel family.

``--variant KEY=VALUE``: the same seeds again with that option or tuning knob (the
strategy's internal knobs, which a TuningRun cannot set) changed on the target's studies
(the source runs as the baseline's), compared pair by pair; a variant of warm-only ones
keeps the baseline's cold runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from fleettune_dev.bench.replay import Replay, family, load_replay
from fleettune_dev.bench.strategy import parse_options
from fleettune_dev.bench.warmstart_run import Drive, run_seed
from fleettune_dev.bench.warmstart_summary import (
    compare_variant,
    format_ordered_summary,
    format_reach,
    format_table,
    format_variant_comparison,
    ordered_summary,
    summarise,
)

# Same kernel, another GPU (source -> target), by recording name in data/spaces: --all-pairs.
PAIRS = (
    ("convolution_milo-A100", "convolution_milo-A4000"),
    ("convolution_milo-A4000", "convolution_milo-A100"),
    ("convolution-RTX_2080_Ti", "convolution-RTX_3090"),
    ("gemm-RTX_2080_Ti", "gemm-RTX_3090"),
    ("pnpoly-RTX_2080_Ti", "pnpoly-RTX_3090"),
    ("dedispersion_milo-A100", "dedispersion_milo-A4000"),
)


def ordered_pairs(
    directory: Path, loaded: dict[Path, Replay] | None = None
) -> tuple[list[tuple[Path, Path]], list[str]]:
    """Every ordered (source, target) pair of Kernel Tuner caches in ``directory`` of the
    same kernel family that record the same parameters, and a note for each file left
    out (one that is no Kernel Tuner cache, such as a T4 results file). ``loaded``: filled
    with the recordings read, so that they are read once."""
    from fleettune.space.errors import SpaceError

    groups: dict[tuple[str, tuple[str, ...]], list[Path]] = {}
    skipped: list[str] = []
    for path in sorted(directory.glob("*.json.gz")):
        try:
            replay = load_replay(path)
        except (SpaceError, ValueError, KeyError) as exc:
            skipped.append(f"{path.name}: {exc}")
            continue
        if loaded is not None:
            loaded[path] = replay
        params = tuple(p.name for p in replay.space.parameters)
        groups.setdefault((family(_name(path)), params), []).append(path)
    pairs = [(s, t) for paths in groups.values() for s in paths for t in paths if s != t]
    return sorted(pairs, key=lambda st: (family(_name(st[0])), _name(st[0]), _name(st[1]))), skipped


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleettune bench warmstart", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", help="Kernel Tuner cache of the GPU tuned first")
    p.add_argument("--target", help="Kernel Tuner cache of the GPU re-tuned with the source's results")
    p.add_argument("--all-pairs", metavar="DIR",
                   help="run the standard source → target pairs (`PAIRS`: one per family) from the recordings in DIR")
    p.add_argument("--all-ordered-pairs", metavar="DIR",
                   help="run every ordered pair of recordings of the same kernel in DIR, with a summary")
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=100, help="target evaluations per run")
    p.add_argument("--source-budget", type=int, default=100, help="source evaluations per seed")
    p.add_argument("--strategy", default="bayes")
    p.add_argument("--option", action="append", default=[],
                   help="strategy option or tuning knob KEY=VALUE (JSON value)")
    p.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE",
                   help="also run the warm and cold studies with this option or tuning knob changed (repeatable; "
                        "the source runs as the baseline does), and compare it with the baseline pair by pair; the "
                        "cold runs are the baseline's when every one changed is warm-only")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--json", dest="json_out", help="write per-seed rows and summaries here")
    p.add_argument("--traces", help="JSON-lines file of finished seeds: appended to, and resumed from")
    args = p.parse_args(argv)
    if sum(map(bool, (args.all_pairs, args.all_ordered_pairs, args.source or args.target))) != 1 or (
            (args.source or args.target) and not (args.source and args.target)):
        p.error("give --source and --target, --all-pairs DIR or --all-ordered-pairs DIR")
    return args


def _pairs(args: argparse.Namespace, loaded: dict[Path, Replay]) -> list[tuple[Path, Path]]:
    if args.all_pairs:
        d = Path(args.all_pairs)
        return [(d / f"{s}.json.gz", d / f"{t}.json.gz") for s, t in PAIRS]
    if args.all_ordered_pairs:
        pairs, skipped = ordered_pairs(Path(args.all_ordered_pairs), loaded)
        for note in skipped:
            print(f"left out {note}", file=sys.stderr)
        return pairs
    return [(Path(args.source), Path(args.target))]


def _name(path: Path) -> str:
    return path.name.removesuffix(".gz").removesuffix(".json")


def _seed_key(pair: str, seed: int, args: argparse.Namespace, options: dict[str, Any],
              source_options: dict[str, Any] | None = None) -> str:
    key: list[Any] = [pair, args.strategy, seed, args.source_budget, args.budget, options]
    if source_options is not None and source_options != options:
        key.append({"source": source_options})
    return json.dumps(key, sort_keys=True)


def _load_rows(path: Path | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if path is None or not path.exists():
        return out
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a crash: that seed runs again
                continue
            out[rec["key"]] = rec["row"]
    return out


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(max(1, args.threads))
    options = parse_options(args.option, args.strategy)
    changed = parse_options(args.variant, args.strategy)
    variant = {**options, **changed} if changed else None
    # A variant of warm-only options leaves the cold studies as they are: the baseline's serve.
    reuse_cold = variant is not None and all(_declared(args.strategy)[k].warm_only for k in changed)
    traces = Path(args.traces) if args.traces else None
    done = _load_rows(traces)
    replays: dict[Path, Replay] = {}
    pairs: list[tuple[str, Replay, Replay]] = []
    for src_path, tgt_path in _pairs(args, replays):
        for path in (src_path, tgt_path):
            if path not in replays:
                replays[path] = load_replay(path)
        source, target = replays[src_path], replays[tgt_path]
        if [p.name for p in source.space.parameters] != [p.name for p in target.space.parameters]:
            print(f"{src_path} and {tgt_path} do not record the same parameters", file=sys.stderr)
            return 2
        pairs.append((f"{_name(src_path)} → {_name(tgt_path)}", source, target))
    rows: dict[str, list[dict[str, Any]]] = {pair: [] for pair, _, _ in pairs}
    vrows: dict[str, list[dict[str, Any]]] = {pair: [] for pair, _, _ in pairs}
    seconds = dict.fromkeys(rows, 0.0)
    vseconds = dict.fromkeys(rows, 0.0)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    memo: dict[tuple[Any, ...], Drive] = {}
    # All ordered pairs go seed by seed (a run cut short has the same seeds on every pair,
    # and a seed's source and cold runs are shared by the pairs that need them, then
    # freed); the other modes pair by pair, with each pair's line as soon as it is done.
    ordered = bool(args.all_ordered_pairs)
    order = ([(s, p) for s in seeds for p in pairs] if ordered else [(s, p) for p in pairs for s in seeds])
    results: list[dict[str, Any]] = []
    for n, (seed, (pair, source, target)) in enumerate(order):
        if ordered and n and seed != order[n - 1][0]:
            memo.clear()
        settings = [(options, rows, seconds)] + ([(variant, vrows, vseconds)] if variant is not None else [])
        for opts, into, spent in settings:
            key = _seed_key(pair, seed, args, opts, options)
            if key in done:
                into[pair].append(done[key])
                continue
            started = time.perf_counter()
            reuse = rows[pair][-1] if into is vrows and reuse_cold else None
            into[pair].append(run_seed(source, target, args.strategy, seed, args.source_budget, args.budget,
                                       opts, memo, source_options=options, cold_row=reuse))
            spent[pair] += time.perf_counter() - started
            if traces is not None:
                with traces.open("a") as fh:
                    fh.write(json.dumps({"key": key, "row": into[pair][-1]}) + "\n")
            print(f"  {pair} seed {seed}{' (variant)' if into is vrows else ''}: "
                  + " ".join(f"{k}={v}" for k, v in into[pair][-1].items() if k != "seed"), file=sys.stderr, flush=True)
        if not ordered and len(rows[pair]) == args.seeds:
            results.append(_summary(pair, rows[pair], args.budget, seconds[pair]))
            print(format_table([results[-1]]).splitlines()[-1], flush=True)
    if ordered:
        results = [_summary(pair, rows[pair], args.budget, seconds[pair]) for pair, _, _ in pairs]
    print(format_table(results))
    for line in filter(None, map(format_reach, results)):
        print(line)
    summary = ordered_summary(results, rows) if ordered else None
    if summary is not None:
        print()
        print(format_ordered_summary(summary))
    doc: dict[str, Any] = {
        "strategy": args.strategy, "source_budget": args.source_budget, "budget": args.budget,
        "options": options, "results": results, "per_seed": rows,
    }
    if summary is not None:
        doc["summary"] = summary
    if variant is not None:
        label = f"{args.strategy} with {' '.join(args.variant)}"
        vresults = [_summary(pair, vrows[pair], args.budget, vseconds[pair]) for pair, _, _ in pairs]
        print(f"\n### {label}" + (" (the baseline's cold runs: only warm-start options change)" if reuse_cold else ""))
        print(format_table(vresults))
        vsummary = ordered_summary(vresults, vrows) if ordered else None
        if vsummary is not None:
            print()
            print(format_ordered_summary(vsummary))
        comparison = compare_variant(rows, vrows)
        print()
        print(format_variant_comparison(comparison, label))
        doc["variant"] = {"options": variant, "reused_cold": reuse_cold, "results": vresults, "per_seed": vrows,
                          "summary": vsummary, "comparison": comparison}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2))
    return 0


def _declared(strategy: str) -> dict[str, Any]:
    """The strategy's declared options and tuning knobs, by name."""
    from fleettune.optimize import describe_options, describe_tuning

    return {o.name: o for o in (*describe_options(strategy), *describe_tuning(strategy))}


def _summary(pair: str, rows: list[dict[str, Any]], budget: int, seconds: float) -> dict[str, Any]:
    res = summarise(pair, rows, budget)
    res["seconds"] = round(seconds, 1)
    return res
