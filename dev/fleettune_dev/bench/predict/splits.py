"""Deterministic train/test folds over rows (no random generator: a hash where a split is random).

A *series* is the rows of one (kind, group, family, device) ordered by volume: one vLLM table
over M, one kernel on one GPU over problem sizes, one MIOpen solver on one problem over
batch sizes. ``folds(rows, split)`` returns ``[(train, test), …]``; a split that does not apply
to the data (nothing to hold out, or nothing left to learn from) returns ``[]``. Only series of
at least two rows give test rows to the series splits: a lone size has no neighbour to be
predicted from.

* ``alt``: one fold; the rows at odd positions of every series are test (interpolation).
* ``loo``: leave one size out with few refits: fold i holds out the positions p ≡ i (mod
  ``LOO_MAX_FOLDS``) of every series (as many folds as the longest series has rows, at most
  ``LOO_MAX_FOLDS``: an MIOpen problem has up to 251 batch sizes, and a learned predictor is
  refit once per fold; a held-out row's neighbours still train).
* ``extrap``: one fold; per series the smaller half by volume trains (the middle row of an odd
  series too), the larger half is test.
  ``extrap:V``: train on every row of volume < V, test on every row of volume ≥ V. For vLLM
  tables the volume is the batch size M, so ``extrap:512`` tunes M ≤ 256 and predicts M ≥ 512.
* ``lofo``: leave one shape family out: 5 folds, a family's rows are test in fold
  ``stable_hash(family) % 5`` (a whole vLLM (E, N) table on every GPU at once; the other
  families, the same GPU's other tables included, train).
* ``logo``: leave one GPU out: one fold per device (sorted), when there are at least two.
* ``random``: one fold; test = the rows with ``stable_hash(key) % 5 == 0`` (about 20 %).
* ``batchmax``: MIOpen kinds only: in every (kind, family, device) with at least two batch
  sizes, the rows of the largest batch are test; other kinds' rows only train.

Folds are computed over all the rows given, so several data sets loaded together share them
(and train on each other); rows of one data set only are what a single ``--data`` gives.
Within a fold, train and test keep the rows' input order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fleettune_dev.bench.predict.rows import Row, stable_hash

SPLITS = ("alt", "loo", "extrap", "lofo", "logo", "random", "batchmax")
LOFO_FOLDS = 5
LOO_MAX_FOLDS = 12
RANDOM_SHARE = 5  # one row in RANDOM_SHARE is test
MIOPEN_KINDS = ("miopen-perfdb", "miopen-finddb")

Fold = tuple[list[Row], list[Row]]


def series_key(row: Row) -> tuple[str, str, str, str]:
    return (row.kind, row.group, row.family, row.device)


def series(rows: Sequence[Row]) -> list[list[int]]:
    """The indices into ``rows`` of each series, ordered by volume (then key, for ties)."""
    by: dict[tuple[str, str, str, str], list[int]] = {}
    for i, row in enumerate(rows):
        by.setdefault(series_key(row), []).append(i)
    return [sorted(idx, key=lambda i: (rows[i].volume, rows[i].key, i)) for idx in by.values()]


def folds(rows: Sequence[Row], split: str) -> list[Fold]:
    """The (train, test) folds of ``split`` (one of :data:`SPLITS`, or ``extrap:V``) over ``rows``."""
    name, sep, arg = split.partition(":")
    if name not in SPLITS or (sep and name != "extrap"):
        raise ValueError(f"split is one of {', '.join(SPLITS)} or extrap:VOLUME: {split!r}")
    if sep:
        try:
            threshold = float(arg)
        except ValueError:
            raise ValueError(f"extrap:V needs a number V: {split!r}") from None
        tests = [{i for i, r in enumerate(rows) if r.volume >= threshold}]
    else:
        tests = _TESTS[name](rows)
    return [fold for test in tests if (fold := _fold(rows, test))[0] and fold[1]]


def _fold(rows: Sequence[Row], test: set[int]) -> Fold:
    train: list[Row] = []
    held: list[Row] = []
    for i, row in enumerate(rows):
        (held if i in test else train).append(row)
    return train, held


def _long_series(rows: Sequence[Row]) -> list[list[int]]:
    return [s for s in series(rows) if len(s) >= 2]


def _alt(rows: Sequence[Row]) -> list[set[int]]:
    return [{i for s in _long_series(rows) for i in s[1::2]}]


def _loo(rows: Sequence[Row]) -> list[set[int]]:
    long = _long_series(rows)
    n = min(max((len(s) for s in long), default=0), LOO_MAX_FOLDS)
    return [{i for s in long for pos, i in enumerate(s) if pos % n == k} for k in range(n)]


def _extrap(rows: Sequence[Row]) -> list[set[int]]:
    return [{i for s in _long_series(rows) for i in s[(len(s) + 1) // 2:]}]


def _lofo(rows: Sequence[Row]) -> list[set[int]]:
    fold_of = {f: stable_hash(f) % LOFO_FOLDS for f in {r.family for r in rows}}
    return [{i for i, r in enumerate(rows) if fold_of[r.family] == k} for k in range(LOFO_FOLDS)]


def _logo(rows: Sequence[Row]) -> list[set[int]]:
    devices = sorted({r.device for r in rows})
    if len(devices) < 2:
        return []
    return [{i for i, r in enumerate(rows) if r.device == d} for d in devices]


def _random(rows: Sequence[Row]) -> list[set[int]]:
    return [{i for i, r in enumerate(rows) if stable_hash(r.key) % RANDOM_SHARE == 0}]


def batch_size(row: Row) -> float | None:
    """A MIOpen row's batch size (``batchsize`` in both MIOpen kinds; ``N`` accepted)."""
    value = row.problem.get("batchsize", row.problem.get("N"))
    return float(value) if isinstance(value, int | float) else None


def _batchmax(rows: Sequence[Row]) -> list[set[int]]:
    by: dict[tuple[str, str, str], list[int]] = {}
    for i, r in enumerate(rows):
        if r.kind in MIOPEN_KINDS and batch_size(r) is not None:
            by.setdefault((r.kind, r.family, r.device), []).append(i)
    test: set[int] = set()
    for idx in by.values():
        batches = {batch_size(rows[i]) for i in idx}
        if len(batches) >= 2:
            largest = max(b for b in batches if b is not None)
            test |= {i for i in idx if batch_size(rows[i]) == largest}
    return [test]


_TESTS: dict[str, Callable[[Sequence[Row]], list[set[int]]]] = {
    "alt": _alt, "loo": _loo, "extrap": _extrap, "lofo": _lofo, "logo": _logo, "random": _random,
    "batchmax": _batchmax,
}
