"""The tables and plots of `fleettune bench timeline`: one table per space, the summary
against Kernel Tuner with the targets met or missed (and why), and a best-so-far plot per
space.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fleettune_dev.bench.timeline.model import KT_PREFIX, FleetModel, Run, TimedSpace
from fleettune_dev.bench.timeline.stats import GPU_S_PER_EVAL_FACTOR, LEVELS, curve, mode_label


def _fmt_s(v: float, reached: int | None = None, seeds: int | None = None) -> str:
    if not math.isfinite(v):
        return "—"
    text = f"{v:.0f}" if v >= 10 else f"{v:.1f}"
    if reached is not None and seeds is not None and reached < seeds:
        text = f"≥{text} ({reached}/{seeds})"
    return text


def format_space_table(rows: Sequence[dict[str, Any]]) -> str:
    head = ["mode", "seeds", "wall→0.95 s", "wall→0.99 s", "GPU-s→0.95", "GPU-s→0.99", "evals→0.95",
            "evals→0.99", "GPU busy", "evals", "GPU-s/eval", "batch", "latency s"]
    lines = [f"### {rows[0]['space']}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in rows:
        n = s["seeds"]
        cells = [mode_label(s), str(n)]
        cells += [_fmt_s(s[f"wall_s_to_{lv}"], s[f"reached_{lv}"], n) for lv in LEVELS]
        cells += [_fmt_s(s[f"gpu_s_to_{lv}"], s[f"reached_{lv}"], n) for lv in LEVELS]
        cells += [f"{s[f'evals_to_{lv}']:.0f}" for lv in LEVELS]
        cells += [f"{s['busy']:.2f}", f"{s['evals']:.0f}", f"{s['gpu_s_per_eval']:.2f}", f"{s['mean_batch']:.1f}",
                  f"{s['latency_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_summary(cmp: dict[str, Any], spaces: dict[str, TimedSpace], model: FleetModel) -> str:
    lines: list[str] = []
    for g, entry in cmp["per_gpus"].items():
        lines += [f"### Summary, {g} GPU{'s' if g != '1' else ''}: batched Pods vs Kernel Tuner's best strategy "
                  "(1 GPU), to 0.95 of the optimum", ""]
        head = ["space", "batch wall s", "pod wall s", "KT best", "KT wall s", "wall ratio", "batch GPU-s",
                "KT GPU-s", "GPU-s ≤ KT", "evals batch/KT", "s/eval batch/KT", "GPU-s/eval (bound)"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in entry["rows"]:
            n = r["seeds"]
            lines.append("| " + " | ".join([
                r["space"].split(".")[0], _fmt_s(r["batch_wall_s"], r["batch_reached"], n), _fmt_s(r["pod_wall_s"]),
                r["kt_best"], _fmt_s(r["kt_wall_s"], r["kt_reached"], n), f"{r['wall_ratio']:.2f}",
                _fmt_s(r["batch_gpu_s"]), f"{_fmt_s(r['kt_gpu_s'])} ({r['kt_best_gpu']})",
                "yes" if r["gpu_ok"] else "**no**", f"{r['batch_evals']:.0f}/{r['kt_evals']:.0f}",
                f"{r['batch_s_per_eval']:.2f}/{r['kt_s_per_eval']:.2f}",
                f"{r['gpu_s_per_eval']:.2f} ({r['gpu_s_per_eval_bound']:.2f})"
                + ("" if r["per_eval_ok"] else " **over**"),
            ]) + " |")
        lines.append(f"| **mean** | | | | | {entry['mean_wall_ratio']:.2f} | | | | | | |")
        lines.append("")
        pod = entry["mean_pod_ratio"]
        lines.append(f"* wall-clock ratio to Kernel Tuner's best: mean {entry['mean_wall_ratio']:.3f}, geometric mean "
                     f"{entry['geomean_wall_ratio']:.3f}, ratio of totals {entry['total_wall_ratio']:.3f}"
                     + (f"; one configuration per Pod (pod mode): mean {pod:.3f}" if math.isfinite(pod) else ""))
        lines.append(f"* GPU-seconds to 0.95, ratio of totals over the spaces: {entry['total_gpu_ratio']:.3f}")
        floor = entry["mean_clairvoyant_ratio"]
        if math.isfinite(floor):
            lines.append(f"* a tuner that knew the answer (the first Pod's start-up, then the cheapest configuration "
                         f"at 0.95 alone): mean ratio {floor:.3f}; per space "
                         + ", ".join(f"{r['space'].split('.')[0]} {r['clairvoyant_ratio']:.3f}" for r in entry["rows"]))
        expected = entry["mean_wall_ratio_expected"]
        if math.isfinite(expected):
            lines.append(f"* with Kernel Tuner's random_sample at its exact expectation (every order of draws, no seed "
                         f"luck) instead of its mean over these seeds: mean ratio {expected:.3f}; random_sample "
                         "expected / measured s: "
                         + ", ".join(f"{r['space'].split('.')[0]} {_fmt_s(r['random_expected_s'])}"
                                     + (f" / {_fmt_s(r['kt_wall_s'])}" if r["kt_best"] == "random_sample" else "")
                                     for r in entry["rows"]))
        if "wall_ratio_target" in entry:
            lines.append(f"* target: wall-clock to 0.95 ≤ {entry['wall_ratio_target']:.3g} × Kernel Tuner's best, "
                         f"mean over spaces: {entry['mean_wall_ratio']:.3f} — "
                         f"{'met' if entry['wall_ratio_met'] else 'MISSED'}"
                         + (f" (the clairvoyant floor is {floor:.3f}: the target leaves "
                            f"{entry['wall_ratio_target'] / floor:.2f}× of it)" if math.isfinite(floor) else ""))
        lines.append("* target: GPU-seconds to 0.95 never more than Kernel Tuner's best: "
                     + ("met" if entry["gpu_never_more"] else "MISSED on " + ", ".join(entry["gpu_misses"])))
        lines.append(f"* target: GPU-seconds per evaluation ≤ {GPU_S_PER_EVAL_FACTOR} × recorded verification + "
                     "benchmark + start-up / batch: "
                     + ("met on every space" if not entry["per_eval_misses"]
                        else "MISSED on " + ", ".join(entry["per_eval_misses"])))
        for space in entry["per_eval_misses"]:
            lines.append("  * " + _why_per_eval(spaces.get(space), model))
        for r in entry["rows"]:
            if not r["gpu_ok"] or ("wall_ratio_target" in entry and r["wall_ratio"] > entry["wall_ratio_target"]):
                lines.append("  * " + _why_slow(r, spaces.get(r["space"]), model))
        lines.append("")
    return "\n".join(lines)


def _why_per_eval(ts: TimedSpace | None, model: FleetModel) -> str:
    if ts is None:
        return "?"
    ok = ~ts.compile_failed
    compile_per = float(np.median(ts.compile_s[ok])) / model.cpus
    gpu = float(np.median(ts.gpu_s(model.framework_on_gpu)[ok]))
    if compile_per > gpu:
        return (f"{ts.name}: compile-bound — median compile {np.median(ts.compile_s[ok]):.2f} s in {model.cpus} "
                f"processes = {compile_per:.2f} s per configuration > median GPU time {gpu:.3f} s: the GPU waits "
                "for compiles")
    return (f"{ts.name}: median GPU time {gpu:.3f} s, compile {compile_per:.3f} s per configuration in "
            f"{model.cpus} processes; the start-up dominates")


def _why_slow(r: dict[str, Any], ts: TimedSpace | None, model: FleetModel) -> str:
    parts = [f"{r['space']}: wall ratio {r['wall_ratio']:.2f}, GPU-s {r['batch_gpu_s']:.0f} vs {r['kt_gpu_s']:.0f}"]
    parts.append(f"evaluations to 0.95 {r['batch_evals']:.0f} vs {r['kt_evals']:.0f}")
    parts.append(f"seconds per evaluation {r['batch_s_per_eval']:.2f} vs {r['kt_s_per_eval']:.2f}")
    if ts is not None:
        ok = ~ts.compile_failed
        gpu = float(np.median(ts.gpu_s()[ok]))
        kt = float(np.median((ts.compile_s + ts.verify_s + ts.bench_s + ts.framework_s)[ok]))
        if gpu >= 0.7 * kt:
            parts.append(f"benchmark time dominates (median GPU {gpu:.2f} s of Kernel Tuner's {kt:.2f} s per "
                         "configuration): batching can only save the compile")
        elif kt < model.startup.p50_s:
            parts.append(f"cheap configurations (Kernel Tuner {kt:.2f} s each): a Pod start-up "
                         f"({model.startup.p50_s:g} s median) costs more than several evaluations")
    return "; ".join(parts)


def save_plots(runs: Sequence[Run], optima: dict[str, float], directory: Path) -> list[Path]:
    """One plot per space: mean fraction of optimum against wall-clock, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    by_space: dict[str, dict[str, list[Run]]] = {}
    for r in runs:
        label = r.mode if r.mode.startswith(KT_PREFIX) else f"{r.mode} ×{r.gpus}"
        by_space.setdefault(r.space, {}).setdefault(label, []).append(r)
    out = []
    for space, modes in by_space.items():
        ends = [r.end for rs in modes.values() for r in rs if r.end > 0]
        firsts = [float(r.times[0]) for rs in modes.values() for r in rs if len(r.times)]
        if not ends or not firsts:
            continue
        grid = np.geomspace(max(min(firsts) * 0.8, 1e-3), max(ends), 400)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, rs in sorted(modes.items()):
            ys = []
            for r in rs:
                t, f = curve(r, optima[space])
                pos = np.searchsorted(t, grid, side="right") - 1
                ys.append(np.where(pos >= 0, f[np.clip(pos, 0, None)] if len(f) else 0.0, 0.0))
            ax.plot(grid, np.mean(ys, axis=0), label=label, linestyle="--" if label.startswith(KT_PREFIX) else "-")
        ax.set_xscale("log")
        ax.set_xlabel("wall-clock (simulated seconds)")
        ax.set_ylabel("fraction of optimum (mean over seeds)")
        ax.set_ylim(0.5, 1.005)
        ax.set_title(space.split(".")[0])
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        path = directory / f"timeline-{space.split('.')[0]}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        out.append(path)
    return out
