"""`fleettune bench predict`: how well a rule predicts the best configuration of a problem
nobody tuned, from the problems that were tuned (offline: no GPU, no tuning).

Each ``--data KIND:PATH`` is read into rows (one tuned problem each, see `predict.data`),
split into training and held-out rows by ``--split`` (see `predict.splits`: alternate
sizes, leave one out, extrapolation beyond a size (``extrap:V``), leave one shape family
or one GPU out, a random fifth by a hash of the problem, MIOpen's largest batch of each
problem), and every predictor learns from the training rows and ranks configurations for
each held-out row. The predictors (`predict.baselines`): ``nearest-log2`` and
``nearest-linear`` (the best of the nearest tuned problem of the same kind; vLLM's
run-time rule is the linear one), ``majority`` (the group's most frequent best),
``copy-best`` (the same problem's best on another GPU), ``default``, ``fleet`` (the
configurations that ran well on every other GPU), ``gp`` (fleettune's own recommendation
for an untuned size, on Kernel Tuner caches) and ``learned`` (`predict.learned`).
``occupancy`` is not built yet. By default, every predictor that can apply to the data.

Scores per group (MIOpen solver, vLLM device, kernel family) and over all rows: exact
match of the whole configuration, per-parameter accuracy, the best among the first
``--k``, top-1 on the find-db, and, where the data has times, the slow-down of the
prediction, its fraction of the optimum, the share of invalid predictions; each
predictor's difference from nearest-log2 with a 95 % paired bootstrap interval. A
predictor that has nothing to go on for a row (returns no configuration) is not scored on
that row: ``n`` counts the rows each applies to. ``--json`` writes every line
(``results``: one per data, split, group and predictor; shares as fractions, null where a
score does not apply).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from fleettune_dev.bench.predict.baselines import NAMES, NOT_AVAILABLE, PREDICTORS, applicable, make
from fleettune_dev.bench.predict.rows import Measuring, Row, measurer
from fleettune_dev.bench.predict.scores import MEASURED, RowScore, score, summarise, versus
from fleettune_dev.bench.predict.tables import format_table

Scores = dict[str, list[RowScore | None]]  # predictor -> its score of each held-out row (None: not applicable)
BASE = "nearest-log2"  # what every predictor is compared with
SPLIT_HELP = ("alt (every other size held out), loo (each size in turn), extrap (the larger half of the sizes) or "
              "extrap:V (volume ≥ V held out), lofo (a shape family out), logo (a GPU out), random (a fifth, by a hash "
              "of the problem), batchmax (MIOpen: the largest batch of each problem)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleettune bench predict", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", action="append", required=True, metavar="KIND:PATH",
                   help="tuned data: kt-caches, vllm-tables, miopen-perfdb or miopen-finddb, and its file or folder "
                        "(repeatable)")
    p.add_argument("--split", required=True, help=SPLIT_HELP)
    p.add_argument("--predictor", action="append", choices=NAMES, metavar="NAME",
                   help=f"one of {', '.join(NAMES)} (repeatable; default: every one that can apply to the data)")
    p.add_argument("--k", type=int, default=10, help="the best is counted as found when among the first K")
    p.add_argument("--min-group", type=int, default=50, metavar="N",
                   help="a group with fewer held-out rows is counted in the 'all' line only")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (gp, learned)")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="write every line's scores here")
    args = p.parse_args(argv)
    if args.k < 1:
        p.error("--k must be at least 1")
    return args


def predict(name: str, folds: Sequence[tuple[Sequence[Row], Sequence[Row]]], k: int) -> list[list[dict[str, Any]]]:
    """The rankings of predictor ``name`` for every held-out row, fold by fold (a fresh
    predictor per fold, fitted on its training rows); a predictor that learns from what it
    measures (`Measuring`) measures its picks one by one where the row has times."""
    out = []
    for train, test in folds:
        predictor = make(name)
        predictor.fit(train)
        for row in test:
            if isinstance(predictor, Measuring) and row.times is not None:
                out.append(predictor.rank_measured(row, max(k, *MEASURED), measurer(row)))
            else:
                out.append(predictor.rank(row, k))
    return out


def results(tests: Sequence[Row], scores: Scores, split: str,
            min_group: int) -> list[dict[str, Any]]:
    """One line per group (with at least ``min_group`` held-out rows) and predictor, then
    the "all" lines."""
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(tests):
        groups.setdefault(row.group, []).append(i)
    chosen = [(g, groups[g]) for g in sorted(groups) if len(groups[g]) >= min_group and len(groups) > 1]
    out = []
    for group, idx in [*chosen, ("all", list(range(len(tests))))]:
        for name, s in scores.items():
            mine = [s[i] for i in idx]
            line: dict[str, Any] = {"data": tests[0].data, "kind": tests[0].kind, "split": split,
                                    "predictor": name, "group": group, **summarise(mine, tests[0].kind)}
            base = scores.get(BASE) if name != BASE else None
            line["vs_nearest"] = versus(mine, [base[i] for i in idx]) if base is not None else None
            out.append(line)
    return out


def _available(name: str) -> str | None:
    """Why predictor ``name`` cannot run here, or None."""
    if name in NOT_AVAILABLE:
        return NOT_AVAILABLE[name]
    if name == "learned":
        try:
            from fleettune_dev.bench.predict import learned  # noqa: F401
        except ImportError as exc:
            return f"its module does not import ({exc})"
    return None


def score_all(rows: Sequence[Row], split: str, args: argparse.Namespace) -> tuple[list[Row], Scores]:
    """The held-out rows of ``split`` over ``rows`` and every predictor's scores on them
    (nearest-log2's always: every predictor is compared with it)."""
    from fleettune_dev.bench.predict.splits import folds as make_folds

    folds = make_folds(rows, split)
    tests = [row for _, test in folds for row in test]
    if not tests:
        return [], {}
    names = args.predictor or [n for n in PREDICTORS if applicable(n, rows)]
    scores: Scores = {}
    for name in dict.fromkeys([*names, BASE]):
        why = _available(name)
        if why is not None:
            print(f"predictor {name} is not available: {why}", file=sys.stderr)
            continue
        start = time.perf_counter()
        rankings = predict(name, folds, args.k)
        scores[name] = [score(row, r, args.k) for row, r in zip(tests, rankings, strict=True)]
        applied = sum(s is not None for s in scores[name])
        print(f"  {split} {name}: {applied} of {len(tests)} held-out rows in {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)
    return tests, scores


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(format="%(message)s", stream=sys.stderr)
    logging.getLogger("fleettune_dev.bench.predict").setLevel(logging.INFO)
    if any(n in ("gp", "learned") for n in args.predictor or ("gp", "learned")):
        import torch

        torch.set_num_threads(max(1, args.threads))
    from fleettune_dev.bench.predict.data import load

    start = time.perf_counter()
    # Read together and split together: a leave-one-GPU-out split over two MIOpen files
    # needs both, and each data set's table is over its own held-out rows.
    try:
        loaded = [(spec, load(spec)) for spec in args.data]
        tests, scores = score_all([r for _, rows in loaded for r in rows], args.split, args)
    except ValueError as exc:
        print(f"fleettune bench predict: {exc}", file=sys.stderr)
        return 2
    shown = [n for n in scores if n != BASE or args.predictor is None or BASE in args.predictor]
    everything: list[dict[str, Any]] = []
    for spec, rows in loaded:
        mine = [i for i, t in enumerate(tests) if t.data == rows[0].data] if rows else []
        if not mine:
            print(f"{spec}: split {args.split} holds out none of its rows", file=sys.stderr)
            continue
        lines = results([tests[i] for i in mine], {n: [s[i] for i in mine] for n, s in scores.items()},
                        args.split, args.min_group)
        lines = [r for r in lines if r["predictor"] in shown]
        everything += lines
        title = f"{spec}, split {args.split}: {len(mine)} held-out rows ({time.perf_counter() - start:.0f} s)"
        print(format_table(title, lines) + "\n", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"results": everything}, fh, indent=1)
    return 0
