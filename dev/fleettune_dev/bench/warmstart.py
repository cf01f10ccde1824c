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
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fleettune_dev.bench.strategy import FAILURE_OUTCOME, Replay, family, load_replay, parse_options
from fleettune_job.protocol import Outcome

LEVELS = (0.95, 0.99)
CHECKPOINTS = (5, 10, 20, 50, 100)  # fraction of optimum after N target evaluations
TARGET_RATIO = 1 / 3  # warm needs at most this share of cold's evaluations to reach 0.95 (docs/benchmarks.md)
# The target: on no ordered pair may warm need more than this multiple of cold's evaluations
# to reach 0.95 (and over the pairs the mean ratio stays within TARGET_RATIO).
HARM_RATIO = 1.1
# The seed bootstrap of the --all-ordered-pairs summary (`seed_spread`).
RESAMPLES = 2000
INTERVAL = 0.9
# Same kernel, another GPU (source -> target), by recording name in data/spaces: --all-pairs.
PAIRS = (
    ("convolution_milo-A100", "convolution_milo-A4000"),
    ("convolution_milo-A4000", "convolution_milo-A100"),
    ("convolution-RTX_2080_Ti", "convolution-RTX_3090"),
    ("gemm-RTX_2080_Ti", "gemm-RTX_3090"),
    ("pnpoly-RTX_2080_Ti", "pnpoly-RTX_3090"),
    ("dedispersion_milo-A100", "dedispersion_milo-A4000"),
)

Observation = tuple[dict[str, Any], Outcome, float | None]


@dataclass
class Drive:
    best: np.ndarray  # (budget,) best valid time after each evaluation (inf before any)
    observations: list[Observation]


def drive(replay: Replay, study: Any, budget: int, stop_at: float | None = None) -> Drive:
    """Replay ``budget`` sequential suggestions of ``study`` against the recording (the
    protocol of ``bench.strategy.run_once``, keeping the observations for a warm start).

    ``stop_at``: stop once optimum / best reaches this fraction (the rest of the trace
    keeps that best), since nothing after it changes an evals-to-level count."""
    lookup = study.candidates.lookup
    budget = min(budget, len(replay.rows))
    best = np.full(budget, np.inf)
    current = math.inf
    observations: list[Observation] = []
    for i in range(budget):
        configs = study.suggest(1)
        if not configs:
            best[i:] = current
            break
        c = int(lookup(np.asarray(replay.space.to_rows(configs), dtype=np.int32))[0])
        t = replay.time_ms[c]
        if math.isfinite(t):
            obs: Observation = (configs[0], Outcome.OK, float(t))
            study.observe(configs[0], Outcome.OK, float(t), replay.times[c])
            current = min(current, float(t))
        else:
            obs = (configs[0], FAILURE_OUTCOME.get(replay.failure[c] or "runtime", Outcome.RUNTIME_ERROR), None)
            study.observe(obs[0], obs[1])
        observations.append(obs)
        best[i] = current
        if stop_at is not None and replay.optimum / current >= stop_at - 1e-12:
            best[i:] = current
            break
    return Drive(best=best, observations=observations)


def evals_to(best: np.ndarray, optimum: float, level: float) -> int:
    """1-based evaluation at which optimum / best first reaches ``level``; len + 1 if never."""
    frac = np.where(np.isfinite(best), optimum / best, 0.0)
    hit = frac >= level - 1e-12
    return int(np.argmax(hit)) + 1 if hit.any() else len(best) + 1


def study_for(replay: Replay, strategy: str, seed: int, prior: list[Observation] | None,
              options: dict[str, Any] | None) -> Any:
    from fleettune.optimize import Study, split_settings

    return Study(replay.space, strategy=strategy, seed=seed, candidates=replay.rows, prior=prior or (),
                 **split_settings(strategy, options))


def run_seed(
    source: Replay, target: Replay, strategy: str, seed: int, source_budget: int, budget: int,
    options: dict[str, Any] | None = None, memo: dict[tuple[Any, ...], Drive] | None = None, *,
    source_options: dict[str, Any] | None = None, cold_row: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One seed of one pair. ``memo``: runs that do not depend on the pair (a source's own
    run, a target's cold run), by recording name, seed and options, shared by the pairs of
    one invocation (the budgets and strategy must be the same across its calls).

    ``source_options``: the source run's options, where they differ from the target's (a
    ``--variant`` judges a setting for the re-tune; the source's results are an earlier
    round's, tuned as the baseline tunes). ``cold_row``: a row of this pair and seed whose
    cold figures hold for ``options`` too (they differ from its options only in warm-only
    ones, `Option.warm_only`): copied instead of running the cold study again."""
    memo = {} if memo is None else memo
    src_options = options if source_options is None else source_options
    skey = ("source", source.name, seed, _options_key(src_options))
    if skey not in memo:
        memo[skey] = drive(source, study_for(source, strategy, seed, None, src_options), source_budget)
    src = memo[skey]
    # The target study gets its own seed stream, so warm and cold differ only by the prior.
    tseed = seed + 100_003
    last = max(LEVELS)
    warm = drive(target, study_for(target, strategy, tseed, src.observations, options), budget, last)
    runs = [("warm", warm)]
    if cold_row is None:
        ckey = ("cold", target.name, seed, _options_key(options))
        if ckey not in memo:
            memo[ckey] = drive(target, study_for(target, strategy, tseed, None, options), budget, last)
        runs.append(("cold", memo[ckey]))
    # How good the source's own best is on the target: the value of copying it blindly.
    ok = [o for o in src.observations if o[1] == Outcome.OK]
    copied = math.nan
    if ok:
        copied = on_target(target, min(ok, key=lambda o: o[2] or math.inf)[0])
    # The best the source measured at all, on the target: what its data could point to.
    reach = max((on_target(target, o[0]) for o in src.observations), default=0.0)
    out: dict[str, Any] = {"seed": seed, "source_best_on_target": copied, "source_reach": reach}
    for name, run in runs:
        for level in LEVELS:
            out[f"{name}_{level}"] = evals_to(run.best, target.optimum, level)
        # A run stopped at 0.99 keeps that best: fractions after it are a lower bound.
        for n in CHECKPOINTS:
            if n <= len(run.best):
                b = run.best[n - 1]
                out[f"{name}_at_{n}"] = round(float(target.optimum / b) if math.isfinite(b) else 0.0, 4)
    if cold_row is not None:
        out.update({k: v for k, v in cold_row.items() if k.startswith("cold_")})
    return out


def _options_key(options: dict[str, Any] | None) -> str:
    return json.dumps(options or {}, sort_keys=True)


def target_lookup(replay: Replay, config: dict[str, Any]) -> int:
    row = np.asarray(replay.space.to_rows([config]), dtype=np.int32)
    match = np.flatnonzero((replay.rows == row).all(axis=1))
    return int(match[0]) if len(match) else -1


def on_target(target: Replay, config: dict[str, Any]) -> float:
    """Fraction of the target's optimum that ``config`` reaches there (0: fails or not recorded)."""
    t = target.time_ms[c] if (c := target_lookup(target, config)) >= 0 else math.nan
    return target.optimum / float(t) if math.isfinite(t) else 0.0


def summarise(pair: str, rows: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    res: dict[str, Any] = {"pair": pair, "seeds": len(rows), "budget": budget}
    for level in LEVELS:
        for name in ("warm", "cold"):
            v = np.array([r[f"{name}_{level}"] for r in rows], dtype=float)
            res[f"{name}_{level}"] = float(v.mean())
            res[f"{name}_{level}_median"] = float(np.median(v))
            res[f"{name}_{level}_censored"] = int((v > budget).sum())
        res[f"ratio_{level}"] = res[f"warm_{level}"] / res[f"cold_{level}"]
    for n in CHECKPOINTS:
        for name in ("warm", "cold"):
            v = [r[f"{name}_at_{n}"] for r in rows if f"{name}_at_{n}" in r]
            if v:
                res[f"{name}_at_{n}"] = float(np.mean(v))
    copied = np.array([r["source_best_on_target"] for r in rows], dtype=float)
    res["source_best_on_target"] = float(np.nanmean(copied)) if np.isfinite(copied).any() else math.nan
    res["meets_target"] = bool(res["ratio_0.95"] <= TARGET_RATIO)
    if all("source_reach" in r for r in rows):
        res["informed"] = _by_reach(rows, LEVELS[0])
    return res


def _by_reach(rows: list[dict[str, Any]], level: float) -> dict[str, Any]:
    """Evaluations to ``level``, warm and cold, split by whether the source's own
    measurements hold a configuration that reaches ``level`` on the target.

    A warm start can point the target study at a good configuration only if the source
    measured one: where it did not, the prior knows nothing of the target's best region
    and can only be as good as no prior. ``cold_parity_ratio``: the mean ratio if warm
    runs matched cold ones exactly there, and stayed as they are elsewhere."""
    def total(sel: list[dict[str, Any]], name: str) -> float:
        return float(sum(r[f"{name}_{level}"] for r in sel))

    groups = {"with": [r for r in rows if r["source_reach"] >= level - 1e-12],
              "without": [r for r in rows if r["source_reach"] < level - 1e-12]}
    out: dict[str, Any] = {"level": level}
    for name, sel in groups.items():
        n = len(sel)
        out[name] = {"seeds": n, "warm": total(sel, "warm") / n if n else math.nan,
                     "cold": total(sel, "cold") / n if n else math.nan,
                     "ratio": total(sel, "warm") / total(sel, "cold") if n else math.nan}
    parity = total(groups["with"], "warm") + total(groups["without"], "cold")
    cold = total(rows, "cold")
    out["cold_parity_ratio"] = parity / cold if cold else math.nan
    return out


def format_reach(res: dict[str, Any]) -> str | None:
    """One line on how much the source's data could tell (see `_by_reach`)."""
    info = res.get("informed")
    if not info:
        return None
    w, wo = info["with"], info["without"]
    text = (f"{res['pair']}: the source measured a configuration ≥{info['level']} of the target's optimum "
            f"in {w['seeds']}/{res['seeds']} seeds")
    if w["seeds"]:
        text += f"; there warm {w['warm']:.1f} vs cold {w['cold']:.1f} (ratio {w['ratio']:.2f})"
    if wo["seeds"]:
        text += (f"; in the other {wo['seeds']} warm {wo['warm']:.1f} vs cold {wo['cold']:.1f} "
                 f"(ratio {wo['ratio']:.2f}); warm = cold there would give {info['cold_parity_ratio']:.2f}")
    return text


def _cell(res: dict[str, Any], key: str) -> str:
    cens = res.get(f"{key}_censored", 0)
    text = f"{res[key]:.1f}"
    return f"≥{text} ({cens} cens.)" if cens else text


def _pair_cell(res: dict[str, Any], n: int) -> str:
    if f"warm_at_{n}" not in res:
        return "-"
    return f"{res[f'warm_at_{n}']:.3f} / {res[f'cold_at_{n}']:.3f}"


def format_table(results: list[dict[str, Any]]) -> str:
    head = ["source → target", "seeds", "warm →0.95", "cold →0.95", "ratio", "warm →0.99", "cold →0.99",
            "ratio", "@10 warm/cold", "@50 warm/cold", "src best on tgt", "≤1/3"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r["pair"], str(r["seeds"]), _cell(r, "warm_0.95"), _cell(r, "cold_0.95"), f"{r['ratio_0.95']:.2f}",
                 _cell(r, "warm_0.99"), _cell(r, "cold_0.99"), f"{r['ratio_0.99']:.2f}",
                 _pair_cell(r, 10), _pair_cell(r, 50), f"{r['source_best_on_target']:.3f}",
                 "yes" if r["meets_target"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def seed_spread(rows: dict[str, list[dict[str, Any]]], level: float, resamples: int = RESAMPLES,
                seed: int = 0) -> dict[str, Any] | None:
    """How much the target's figures at ``level`` owe to the seeds drawn: the `INTERVAL`
    intervals of the mean and the worst warm/cold ratio over the pairs, and the share of
    resamples that meet the target, from ``resamples`` draws of the seeds with
    replacement. A draw takes the same seeds for every pair (a seed's source and cold runs
    are shared by its pairs). None with fewer than two seeds common to all pairs.

    The ratios of single pairs swing by tenths with a few seeds (a run that misses 0.95
    counts as the budget + 1), so a mean ratio just over 1/3 can be the seeds' luck
    either way; this says how likely."""
    by_seed = [{r["seed"]: r for r in pair_rows} for pair_rows in rows.values()]
    seeds = sorted(set.intersection(*map(set, by_seed))) if by_seed else []
    if len(seeds) < 2:
        return None
    warm, cold = (np.array([[pair[s][f"{name}_{level}"] for s in seeds] for pair in by_seed], dtype=float)
                  for name in ("warm", "cold"))
    draw = np.random.default_rng(seed).integers(0, len(seeds), size=(resamples, len(seeds)))
    ratios = warm[:, draw].mean(axis=2) / cold[:, draw].mean(axis=2)  # (pairs, resamples)
    mean, worst = ratios.mean(axis=0), ratios.max(axis=0)
    tail = 100 * (1 - INTERVAL) / 2
    return {
        "seeds": len(seeds), "resamples": resamples, "interval": INTERVAL,
        "mean_ratio": [float(v) for v in np.percentile(mean, [tail, 100 - tail])],
        "worst_ratio": [float(v) for v in np.percentile(worst, [tail, 100 - tail])],
        "meets_target": float(((worst <= HARM_RATIO) & (mean <= TARGET_RATIO)).mean()),
    }


def ordered_summary(results: list[dict[str, Any]], rows: dict[str, list[dict[str, Any]]] | None = None
                    ) -> dict[str, Any]:
    """The target's figures over the pairs of ``--all-ordered-pairs``: per level the worst
    and the mean warm/cold ratio and the pairs over `HARM_RATIO`; per kernel family the
    mean evaluations, warm and cold, and the mean and worst ratio of its pairs. With the
    per-seed ``rows`` of each pair, at 0.95 also their spread over the seeds
    (`seed_spread`)."""
    out: dict[str, Any] = {"pairs": len(results), "harm_ratio": HARM_RATIO, "target_ratio": TARGET_RATIO}
    if rows is not None and (spread := seed_spread(rows, LEVELS[0])) is not None:
        out[f"spread_{LEVELS[0]}"] = spread
    for level in LEVELS:
        ratios = [r[f"ratio_{level}"] for r in results]
        worst = max(range(len(results)), key=lambda i: ratios[i]) if results else None
        out[f"worst_ratio_{level}"] = ratios[worst] if worst is not None else math.nan
        out[f"worst_pair_{level}"] = results[worst]["pair"] if worst is not None else None
        out[f"mean_ratio_{level}"] = float(np.mean(ratios)) if ratios else math.nan
        out[f"over_{level}"] = [r["pair"] for r in results if r[f"ratio_{level}"] > HARM_RATIO]
    out["meets_target"] = bool(results) and not out["over_0.95"] and out["mean_ratio_0.95"] <= TARGET_RATIO
    families: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        families.setdefault(family(r["pair"].split(" → ")[0]), []).append(r)
    out["families"] = {
        name: {"pairs": len(rows), "seeds": min(r["seeds"] for r in rows),
               **{f"{k}_{level}": float(np.mean([r[f"{k}_{level}"] for r in rows]))
                  for level in LEVELS for k in ("warm", "cold", "ratio")},
               "worst_ratio_0.95": max(r["ratio_0.95"] for r in rows)}
        for name, rows in sorted(families.items())
    }
    return out


def format_ordered_summary(summary: dict[str, Any]) -> str:
    head = ["family", "pairs", "seeds", "warm →0.95", "cold →0.95", "mean ratio", "worst ratio",
            "warm →0.99", "cold →0.99", "mean ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, f in summary["families"].items():
        cells = [name, str(f["pairs"]), str(f["seeds"]), f"{f['warm_0.95']:.1f}", f"{f['cold_0.95']:.1f}",
                 f"{f['ratio_0.95']:.2f}", f"{f['worst_ratio_0.95']:.2f}", f"{f['warm_0.99']:.1f}",
                 f"{f['cold_0.99']:.1f}", f"{f['ratio_0.99']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for level in LEVELS:
        over = summary[f"over_{level}"]
        lines.append(
            f"→{level}: worst ratio {summary[f'worst_ratio_{level}']:.2f} ({summary[f'worst_pair_{level}']}), "
            f"mean ratio over {summary['pairs']} pairs {summary[f'mean_ratio_{level}']:.2f}, "
            f"pairs over {HARM_RATIO}: {len(over)}" + (f" ({', '.join(over)})" if over else ""))
    lines.append(f"warm-start target (→0.95: no pair over {HARM_RATIO}, mean ratio ≤ {TARGET_RATIO:.2f}): "
                 + ("met" if summary["meets_target"] else "not met"))
    if spread := summary.get(f"spread_{LEVELS[0]}"):
        (m0, m1), (w0, w1) = spread["mean_ratio"], spread["worst_ratio"]
        lines.append(
            f"over the seeds ({spread['resamples']:,} resamples of the {spread['seeds']} seeds, "
            f"{100 * spread['interval']:.0f} % intervals): →{LEVELS[0]} mean ratio {m0:.2f}–{m1:.2f}, "
            f"worst ratio {w0:.2f}–{w1:.2f}; the target met in {100 * spread['meets_target']:.0f} % of the resamples")
    return "\n".join(lines)


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


def compare_variant(base: dict[str, list[dict[str, Any]]], variant: dict[str, list[dict[str, Any]]],
                    level: float = LEVELS[0]) -> dict[str, Any]:
    """A ``--variant`` against the baseline, per pair on the seeds both ran: the mean
    evaluations to ``level``, warm and cold, each setting's warm/cold ratio, and the
    paired difference of the warm evaluations (variant − baseline) per seed with its
    standard error; over the pairs, the mean and the worst ratio of each setting."""
    pairs = []
    for pair in base:
        b = {r["seed"]: r for r in base[pair]}
        v = {r["seed"]: r for r in variant.get(pair, [])}
        seeds = sorted(set(b) & set(v))
        if not seeds:
            continue
        wb = np.array([b[s][f"warm_{level}"] for s in seeds], dtype=float)
        wv = np.array([v[s][f"warm_{level}"] for s in seeds], dtype=float)
        cb = np.mean([b[s][f"cold_{level}"] for s in seeds])
        cv = np.mean([v[s][f"cold_{level}"] for s in seeds])
        d = wv - wb
        pairs.append({
            "pair": pair, "seeds": len(seeds), "cold": [float(cb), float(cv)],
            "warm": [float(wb.mean()), float(wv.mean())],
            "ratio": [float(wb.mean() / cb), float(wv.mean() / cv)], "difference": float(d.mean()),
            "se": float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.nan,
            "changed": int((d != 0).sum()),
        })
    out: dict[str, Any] = {"level": level, "pairs": pairs}
    for i, name in enumerate(("baseline", "variant")):
        if pairs:
            worst = max(pairs, key=lambda r: r["ratio"][i])
            out[name] = {"mean_ratio": float(np.mean([r["ratio"][i] for r in pairs])),
                         "worst_ratio": worst["ratio"][i], "worst_pair": worst["pair"]}
    return out


def format_variant_comparison(comparison: dict[str, Any], label: str) -> str:
    level = comparison["level"]
    head = ["source → target", "seeds", f"cold →{level}", f"warm →{level}", "ratio",
            "warm: paired difference per seed", "seeds changed"]
    lines = [f"### {label} against the baseline (baseline → variant)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in comparison["pairs"]:
        cold = f"{r['cold'][0]:.1f}" if r["cold"][0] == r["cold"][1] else f"{r['cold'][0]:.1f} → {r['cold'][1]:.1f}"
        lines.append("| " + " | ".join([
            r["pair"], str(r["seeds"]), cold, f"{r['warm'][0]:.1f} → {r['warm'][1]:.1f}",
            f"{r['ratio'][0]:.2f} → {r['ratio'][1]:.2f}", f"{r['difference']:+.1f} ± {r['se']:.1f}",
            str(r["changed"])]) + " |")
    if comparison["pairs"]:
        b, v = comparison["baseline"], comparison["variant"]
        lines += ["", f"→{level}: mean ratio over {len(comparison['pairs'])} pairs {b['mean_ratio']:.3f} → "
                      f"{v['mean_ratio']:.3f}, worst {b['worst_ratio']:.2f} ({b['worst_pair']}) → "
                      f"{v['worst_ratio']:.2f} ({v['worst_pair']})"]
    return "\n".join(lines)


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
