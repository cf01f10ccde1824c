"""What the rows of `fleettune bench warmstart` add up to, and the tables it prints.

`summarise` averages one pair's per-seed rows (`fleettune_dev.bench.warmstart_run.run_seed`)
and says whether warm meets `TARGET_RATIO`; `ordered_summary` the figures over all the
pairs of ``--all-ordered-pairs`` (worst and mean warm/cold ratio, per kernel family), with
`seed_spread`, their spread over the seeds; `compare_variant` a ``--variant`` against the
baseline on the seeds both ran. The ``format_*`` functions turn each into Markdown. Plain
data in and out: this module runs no study.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fleettune_dev.bench.replay import family
from fleettune_dev.bench.warmstart_run import CHECKPOINTS, LEVELS

TARGET_RATIO = 1 / 3  # warm needs at most this share of cold's evaluations to reach 0.95 (docs/benchmarks.md)
# The target: on no ordered pair may warm need more than this multiple of cold's evaluations
# to reach 0.95 (and over the pairs the mean ratio stays within TARGET_RATIO).
HARM_RATIO = 1.1
# The seed bootstrap of the --all-ordered-pairs summary (`seed_spread`).
RESAMPLES = 2000
INTERVAL = 0.9


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
