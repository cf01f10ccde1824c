"""Index rows and the plain configurations they stand for.

A configuration is handled as an *index row*: one integer per parameter, the position of its
value in that parameter's value list (``parameters[j].values``). Rows are what the optimiser
stores and models; Jobs, results and caches speak in plain values. This module is the
crossing between the two, for a space's parameters and independent of its constraints:
checking the shape of rows, rows → ``{name: value}`` and back, the stable string key of a
configuration (Kernel Tuner's cache key), and the rows one move away from a row.
`fleettune.space.space.SearchSpace` exposes these as its methods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fleettune.space.errors import SpaceError
from fleettune.space.params import Parameter


def as_rows(rows: Any, width: int) -> np.ndarray:
    """``rows`` (one row or several) as a 2-D integer array of ``width`` columns."""
    arr = np.asarray(rows)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != width:
        raise SpaceError("rows", f"expected index rows of width {width}, got shape {np.shape(rows)}")
    if arr.size and arr.dtype.kind not in "iu":
        raise SpaceError("rows", f"index rows must be integers, got {arr.dtype}")
    return arr


def rows_from_cols(cols: Mapping[int, np.ndarray], n: int, width: int) -> np.ndarray:
    """``n`` int32 rows from one value-index column per parameter."""
    out = np.empty((n, width), dtype=np.int32)
    for j in range(width):
        out[:, j] = cols[j]
    return out


def to_configs(parameters: Sequence[Parameter], arr: np.ndarray) -> list[dict[str, Any]]:
    """Index rows (checked by `as_rows`) as name → plain value dicts."""
    names = [p.name for p in parameters]
    for j, p in enumerate(parameters):
        col = arr[:, j]
        size = len(p.values)
        if col.size and (col.min() < 0 or col.max() >= size):
            raise SpaceError("rows", f"index out of range for parameter {names[j]!r} "
                                     f"(it has {size} values)")
    columns = [[p.plain(p.values[i]) for i in arr[:, j].tolist()] for j, p in enumerate(parameters)]
    return [dict(zip(names, vals, strict=True)) for vals in zip(*columns, strict=True)] if columns else []


def to_rows(parameters: Sequence[Parameter], configs: Iterable[Mapping[str, Any]]) -> np.ndarray:
    """Index rows of configurations given as name → value; `SpaceError` if one is not in the space."""
    configs = list(configs)
    names = {p.name for p in parameters}
    for i, config in enumerate(configs):
        if not isinstance(config, Mapping):
            raise SpaceError(f"configs[{i}]", f"expected a mapping of parameter name to value, got "
                                              f"{type(config).__name__}")
        if config.keys() != names:
            extra = set(config) - names
            if extra:
                raise SpaceError(f"configs[{i}]", f"unknown parameter {sorted(map(str, extra))[0]!r}")
            missing = [p.name for p in parameters if p.name not in config]
            raise SpaceError(f"configs[{i}]", f"missing parameter {missing[0]!r}")
    out = np.empty((len(configs), len(parameters)), dtype=np.int32)
    for j, p in enumerate(parameters):
        lookup = p.lookup
        # Numbers look themselves up directly (value_key of a number is the number); anything
        # else, and misses, go through index_of for the type-aware rules.
        direct = p.kind == "numeric"
        for i, config in enumerate(configs):
            v = config[p.name]
            idx = lookup.get(v) if direct and type(v) in (int, float) else None
            if idx is None:
                idx = p.index_of(v)
                if idx is None:
                    raise SpaceError(f"configs[{i}].{p.name}", f"{v!r} is not a value of {p.name!r}")
            out[i, j] = idx
    return out


def row_key(parameters: Sequence[Parameter], row: np.ndarray) -> str:
    """Stable string key: the values joined by "," in parameter order (Kernel Tuner's cache key)."""
    parts = []
    for j, p in enumerate(parameters):
        if not 0 <= row[j] < len(p.values):
            raise SpaceError("rows", f"index out of range for parameter {p.name!r}")
        v = p.values[int(row[j])]
        parts.append("(" + " ".join(map(str, v)) + ")" if p.type == "permutation" else str(v))
    return ",".join(parts)


def neighbour_candidates(parameters: Sequence[Parameter], base: np.ndarray) -> np.ndarray:
    """Rows one move away from ``base``, valid or not: the adjacent value of a numeric parameter,
    any other value of a categorical/boolean one, or a swap of two items of a permutation."""
    candidates: list[np.ndarray] = []
    for j, p in enumerate(parameters):
        cur = int(base[j])
        if p.kind == "numeric":
            order = p.sorted_order
            rank = int(np.flatnonzero(order == cur)[0])
            alts = [int(order[r]) for r in (rank - 1, rank + 1) if 0 <= r < len(order)]
        elif p.kind == "permutation":
            perm = list(p.values[cur])
            alts = []
            for a in range(len(perm)):
                for b in range(a + 1, len(perm)):
                    swapped = perm.copy()
                    swapped[a], swapped[b] = swapped[b], swapped[a]
                    alts.append(p.lookup[tuple(swapped)])
        else:
            alts = [i for i in range(len(p.values)) if i != cur]
        for a in alts:
            cand = base.copy()
            cand[j] = a
            candidates.append(cand)
    if not candidates:
        return np.zeros((0, len(parameters)), dtype=np.int32)
    return np.stack(candidates)
