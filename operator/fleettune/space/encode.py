"""Model features for index rows, by parameter type.

* numeric (integer, ordinal, real): the value scaled to [0, 1] between the parameter's min and
  max, on a log scale when the parameter's scale is "log" (powers of two by default), so that
  16 → 32 is as far as 512 → 1024;
* categorical and boolean: one column per parameter holding the category code i/(k-1). Codes
  only say "same or different": a kernel should compare them for equality (Hamming-type, e.g.
  BoTorch's CategoricalKernel), never by magnitude;
* permutation of n items: the rank vector (position of each item) scaled by 1/(n-1), n columns.
  Euclidean distance between rank vectors is Spearman's distance, which BaCO found to work
  best for loop orders. Each permutation parameter is its own feature group.

Columns are laid out as [all numeric | all categorical | permutation 1 | permutation 2 ...] so
that every kind is one contiguous slice (`feature_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleettune.space.params import Parameter


@dataclass(frozen=True)
class Encoding:
    columns: tuple[tuple[int, np.ndarray], ...]  # (parameter index, table: index -> feature row(s))
    groups: tuple[tuple[str, slice], ...]
    width: int

    def encode(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows)
        out = np.empty((rows.shape[0], self.width), dtype=np.float64)
        col = 0
        for j, table in self.columns:
            feats = table[rows[:, j]]
            if table.ndim == 1:
                out[:, col] = feats
                col += 1
            else:
                out[:, col: col + table.shape[1]] = feats
                col += table.shape[1]
        return out


def numeric_table(param: Parameter) -> np.ndarray:
    vals = np.asarray(param.values, dtype=np.float64)
    if param.scale == "log":
        vals = np.log(vals)
    lo, hi = vals.min(), vals.max()
    if hi == lo:
        return np.zeros(len(vals))
    return (vals - lo) / (hi - lo)


def categorical_table(param: Parameter) -> np.ndarray:
    k = len(param.values)
    return np.arange(k, dtype=np.float64) / (k - 1) if k > 1 else np.zeros(1)


def permutation_table(param: Parameter) -> np.ndarray:
    perms = param.permutation_table  # (n!, n): item at each position
    n = perms.shape[1]
    ranks = np.empty_like(perms)
    rows = np.arange(perms.shape[0])[:, None]
    ranks[rows, perms] = np.arange(n)[None, :]  # rank of item i = its position
    return ranks.astype(np.float64) / (n - 1) if n > 1 else np.zeros_like(ranks, dtype=np.float64)


def build_encoding(params: Sequence[Parameter]) -> Encoding:
    columns: list[tuple[int, np.ndarray]] = []
    groups: list[tuple[str, slice]] = []
    col = 0
    for kind, maker in (("numeric", numeric_table), ("categorical", categorical_table)):
        start = col
        for j, p in enumerate(params):
            if p.kind == kind:
                columns.append((j, maker(p)))
                col += 1
        if col > start:
            groups.append((kind, slice(start, col)))
    for j, p in enumerate(params):
        if p.kind == "permutation":
            table = permutation_table(p)
            columns.append((j, table))
            groups.append(("permutation", slice(col, col + table.shape[1])))
            col += table.shape[1]
    return Encoding(tuple(columns), tuple(groups), col)
