"""The tables and plots `fleettune bench strategy` prints, from its summaries.

Each takes the dictionaries `fleettune_dev.bench.strategy.summarise` and
`paired_by_family` return (plain data: this module runs no replay) and returns Markdown:
`format_table` the strategy's fraction of the optimum per space, with what uniform random
sampling is expected to reach; `format_batch_comparison` batched against sequential
replays, with the target line; `format_variant_comparison` a variant against its baseline
per kernel family. `save_plot` draws one convergence curve (matplotlib, imported lazily).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np


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
