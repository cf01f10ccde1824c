"""What the seeds of `fleettune bench fleet` add up to, and the tables it prints.

A seed's record (`fleettune_dev.bench.fleet.run_family_seed`) holds, per mode, every
pool's figures (`fleet_run.pool_figures`) and the fleet's (`fleet_run.fleet_parallel`,
`fleet_sequential`); the sequential mode one such record per order tried. `best_order`
picks the order, `pool_rows` makes the rows per pool per mode, `family_summary` the
figures per family (sharing against independent; `compare` any mode against it),
`format_family` the table. Plain data
in and out: this module runs no study.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

MODES = ("independent", "sharing", "memory", "sequential")
LEVEL = 0.95


def _mean(values: list[Any]) -> float | None:
    return float(np.mean(values)) if values and None not in values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fleet_cost(fleet: dict[str, Any]) -> float:
    """What orders are compared by: GPU-seconds, or evaluations where a recording has no costs."""
    return fleet["gpu_seconds"] if fleet["gpu_seconds"] is not None else float(fleet["evaluations"])


def best_order(records: list[dict[str, Any]]) -> int:
    """The sequential order (index into each record's ``sequential``) with the least mean
    fleet GPU-seconds to `LEVEL` over the seeds (evaluations without costs): one order for
    every seed, as a fleet's operator would have to fix it before tuning."""
    n = len(records[0]["sequential"])
    return min(range(n), key=lambda k: float(np.mean([fleet_cost(r["sequential"][k]["fleet"]) for r in records])))


def mode_view(record: dict[str, Any], mode: str, order: int | None) -> dict[str, Any]:
    """One seed's figures of ``mode`` (the sequential mode's in order ``order``)."""
    return record["sequential"][order or 0] if mode == "sequential" else record[mode]


def pool_rows(family: str, pools: list[str], records: list[dict[str, Any]], order: int | None
              ) -> list[dict[str, Any]]:
    """A row per pool per mode: each figure per seed and its mean (None where a recording
    has no costs), with the fleet's figures of each seed beside them. ``order``: the
    sequential order's index; None: the sequential mode was not run."""
    rows = []
    for mode in MODES if order is not None else MODES[:-1]:
        views = [mode_view(r, mode, order) for r in records]
        for name in pools:
            figs = [v["pools"][name] for v in views]
            row: dict[str, Any] = {"family": family, "pool": name, "mode": mode, "seeds": [r["seed"] for r in records]}
            if mode == "sequential":
                row["order"] = views[0]["order"]
                row["position"] = views[0]["order"].index(name)
            for key in figs[0]:
                per_seed = [f[key] for f in figs]
                row[key] = per_seed
                if not key.startswith("censored"):
                    row[f"mean_{key}"] = _mean(per_seed)
                else:
                    row[key] = int(sum(per_seed))
            for key in ("gpu_seconds", "rounds", "evaluations", "censored"):
                row[f"fleet_{key}"] = [v["fleet"][key] for v in views]
            rows.append(row)
    return rows


def compare(pools: list[str], records: list[dict[str, Any]], mode: str, order: int | None) -> dict[str, Any]:
    """``mode`` against independent pools: the ratio of the mean evaluations to `LEVEL`
    over pools and seeds, of the mean fleet GPU-seconds over seeds (None without costs),
    and the pool with the largest ratio of its own mean evaluations, with the paired
    difference (``mode`` − independent) of its evaluations per seed and its standard error."""
    key = f"evals_{LEVEL}"

    def evals(m: str, name: str) -> np.ndarray:
        return np.array([mode_view(r, m, order)["pools"][name][key] for r in records], dtype=float)

    ind = {p: evals("independent", p) for p in pools}
    var = {p: evals(mode, p) for p in pools}
    mean_ratio = float(np.mean([var[p].mean() for p in pools]) / np.mean([ind[p].mean() for p in pools]))
    secs = [(mode_view(r, mode, order)["fleet"]["gpu_seconds"], r["independent"]["fleet"]["gpu_seconds"])
            for r in records]
    fleet_ratio = None
    if all(a is not None and b is not None for a, b in secs):
        fleet_ratio = _ratio(float(np.mean([a for a, _ in secs])), float(np.mean([b for _, b in secs])))
    worst = max(pools, key=lambda p: var[p].mean() / ind[p].mean())
    d = var[worst] - ind[worst]
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else None
    return {"mean_evals_ratio": mean_ratio, "fleet_gpu_seconds_ratio": fleet_ratio, "worst_pool": worst,
            "worst_pool_paired_difference": float(d.mean()), "worst_pool_standard_error": se}


def family_summary(pools: list[str], records: list[dict[str, Any]]
                   ) -> tuple[dict[str, Any], dict[str, Any] | None, int | None]:
    """Sharing against independent (the ``--json`` summary of the family), the best
    sequential order against independent, and that order's index (None, None: the
    sequential mode was not run)."""
    sharing = compare(pools, records, "sharing", None)
    if not records[0]["sequential"]:
        return sharing, None, None
    order = best_order(records)
    return sharing, compare(pools, records, "sequential", order), order


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def _cell(row: dict[str, Any], key: str, fmt: str = ".1f") -> str:
    text = _num(row[f"mean_{key}"], fmt)
    cens = row.get(f"censored_{LEVEL}", 0) if key.endswith(str(LEVEL)) else 0
    return f"≥{text}" if cens and text != "-" else text


def format_family(family: str, pools: list[str], rows: list[dict[str, Any]], sharing: dict[str, Any],
                  seq: dict[str, Any] | None, second: dict[str, Any], budget: int, batch: int) -> str:
    by = {(r["mode"], r["pool"]): r for r in rows}
    seeds = len(rows[0]["seeds"])
    nothing = {f"mean_{k}_{level}": None for k in ("evals", "gpu_seconds") for level in (LEVEL, 0.99)}
    order = by[("sequential", pools[0])]["order"] if seq is not None else None
    head = ["pool", "indep. →0.95", "sharing →0.95", "ratio", "seq. →0.95", "2nd run →0.95", "indep. GPU-s",
            "sharing GPU-s", "seq. GPU-s", "indep. →0.99", "sharing →0.99", "seq. →0.99"]
    lines = [f"### {family}: {len(pools)} pools, {seeds} seeds, budget {budget}, batch {batch} "
             f"(evaluations and GPU-seconds to 0.95 of each pool's optimum, mean over seeds; ≥: some seeds censored "
             f"at budget + 1)", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in pools:
        a, b, c = by[("independent", p)], by[("sharing", p)], by.get(("sequential", p), nothing)
        ratio = _ratio(b[f"mean_evals_{LEVEL}"], a[f"mean_evals_{LEVEL}"])
        lines.append("| " + " | ".join([
            p, _cell(a, f"evals_{LEVEL}"), _cell(b, f"evals_{LEVEL}"), _num(ratio, ".2f"), _cell(c, f"evals_{LEVEL}"),
            _cell(by[("memory", p)], f"evals_{LEVEL}"),
            _cell(a, f"gpu_seconds_{LEVEL}", ".0f"), _cell(b, f"gpu_seconds_{LEVEL}", ".0f"),
            _cell(c, f"gpu_seconds_{LEVEL}", ".0f"), _num(a["mean_evals_0.99"]), _num(b["mean_evals_0.99"]),
            _num(c["mean_evals_0.99"])]) + " |")
    lines.append("")
    for mode in ("independent", "sharing", "sequential") if order else ("independent", "sharing"):
        r = by[(mode, pools[0])]
        secs = r["fleet_gpu_seconds"]
        cens = sum(map(bool, r["fleet_censored"]))
        lines.append(f"fleet at {LEVEL}, {mode}: {_num(_mean(secs), '.0f')} GPU-s, "
                     f"{float(np.mean(r['fleet_rounds'])):.1f} rounds (wall clock), "
                     f"{float(np.mean(r['fleet_evaluations'])):.1f} evaluations"
                     + (f" ({cens} of {seeds} seeds censored: some pool never got there)" if cens else ""))
    lines.append(
        f"sharing / independent: mean evaluations ratio {sharing['mean_evals_ratio']:.2f}, fleet GPU-seconds "
        f"ratio {_num(sharing['fleet_gpu_seconds_ratio'], '.2f')}; worst pool {sharing['worst_pool']} "
        f"({sharing['worst_pool_paired_difference']:+.1f} ± {_num(sharing['worst_pool_standard_error'])} "
        f"evaluations per seed)")
    lines.append(
        f"a second run on each GPU from the first run's results on the others (the fleet's memory) / cold: mean "
        f"evaluations ratio {second['mean_evals_ratio']:.2f}; worst pool {second['worst_pool']} "
        f"({second['worst_pool_paired_difference']:+.1f} ± {_num(second['worst_pool_standard_error'])})")
    if seq is None or order is None:
        return "\n".join(lines)
    lines.append(
        f"sequential warm starts (order {' → '.join(order)}: the best by fleet GPU-seconds of the {len(pools)} "
        f"orders that start from each pool, the rest in GPU order — not all {math.factorial(len(pools))}) / "
        f"independent: mean evaluations ratio {seq['mean_evals_ratio']:.2f}, fleet GPU-seconds ratio "
        f"{_num(seq['fleet_gpu_seconds_ratio'], '.2f')}; worst pool {seq['worst_pool']} "
        f"({seq['worst_pool_paired_difference']:+.1f} ± {_num(seq['worst_pool_standard_error'])})")
    return "\n".join(lines)
