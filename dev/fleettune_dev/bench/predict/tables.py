"""The table `fleettune bench predict` prints for one data set and split (Markdown), from
its result dictionaries (plain data: this module scores nothing).

One line per group and predictor, the groups by name and "all" last; shares and the
fraction of the optimum as percentages with one decimal, the slow-down as a factor, the
difference from nearest-log2 in percentage points with its 95 % interval. A column no
line has a value for is left out (the time scores of best-only data, top-1 outside the
MIOpen find-db).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def _percent(v: Any) -> str:
    return f"{100 * v:.1f}"


def _factor(v: Any) -> str:
    return f"{v:.3f}×"


def _points(v: Any) -> str:
    return f"{100 * v:+.1f}"


def _versus(v: Any) -> str:
    if v.get("difference") is None:
        return "–"
    if v.get("low") is None:
        return _points(v["difference"])
    return f"{_points(v['difference'])} [{_points(v['low'])}, {_points(v['high'])}]"


COLUMNS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("n", "n", str),
    ("exact", "exact %", _percent),
    ("per_parameter", "per param %", _percent),
    ("best_of_10_exact", "best in top k %", _percent),
    ("top1", "top-1 %", _percent),
    ("slowdown_geomean", "slow-down", _factor),
    ("fraction_of_optimum", "of optimum %", _percent),
    ("invalid_share", "invalid %", _percent),
    ("fraction_p10", "p10 %", _percent),
    ("share_ge_0_9", "≥ 0.9 %", _percent),
    ("fraction_at_5", "best of 5 measured %", _percent),
    ("fraction_at_10", "best of 10 measured %", _percent),
    ("vs_nearest", "vs nearest-log2 (points, 95 % CI)", _versus),
)


def format_table(title: str, results: Sequence[dict[str, Any]]) -> str:
    """``results``: the result dictionaries of one (data, split), in the order to print."""
    if not results:
        return ""
    shown = [c for c in COLUMNS if any(r.get(c[0]) is not None for r in results)]
    metrics = sorted({r["vs_nearest"]["metric"] for r in results if r.get("vs_nearest")})
    head = ["group", "predictor", *[h for _, h, _ in shown]]
    lines = [f"### {title}", ""]
    if metrics:
        lines += [f"vs nearest-log2: the difference in {' / '.join(m.replace('_', ' ') for m in metrics)}, "
                  "on the rows both apply to.", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    previous = None
    for r in results:
        group = r["group"]
        label = "" if group == previous else ("**all**" if group == "all" else group)
        previous = group
        cells = [label, r["predictor"]]
        cells += ["–" if r.get(key) is None else fmt(r[key]) for key, _, fmt in shown]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
