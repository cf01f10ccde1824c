"""The rules people use today to pick a configuration for an untuned problem, as predictors.

Each class states its rule; all of them implement `rows.Predictor` and only look at the
training rows and the predicted row's problem, group, family, device and volume. A
predictor that has nothing to go on for a row returns ``[]``: that row is "not
applicable" for it, and is not scored for it.

*The kind of problem* (`signature`) is the row's string fields (dtype, layout, direction,
device, ...); for MIOpen also its filter, padding, stride and dilation, the README's
"nearest problem with the same layout/dtype/direction/filter/pad/stride". The numeric
fields left are the sizes a distance is measured over.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleettune_dev.bench.predict.rows import Config, Measure, Predictor, Row, config_key

_EXACT_NUMERIC = re.compile(r"fil|pad|stride|dil", re.IGNORECASE)  # MIOpen fields a neighbour must share
_MISSING = 64.0  # distance per numeric field one of two problems lacks: any real neighbour is nearer
_PREFILTER = 256  # nearest rows sorted in full per query before falling back to sorting the whole bucket


def signature(row: Row, drop_device: bool = False) -> tuple[tuple[str, Any], ...]:
    """The fields a neighbour must share (sorted (name, value) pairs); ``drop_device``: not
    the device's (for the rules that copy from another GPU)."""
    exact = _exact_fields(row.kind, tuple(row.problem))
    out = [(name, v) for name, v in row.problem.items() if name in exact or isinstance(v, str | bool)]
    if drop_device:
        out = [(name, v) for name, v in out if "device" not in name.lower() and v != row.device]
    return tuple(sorted(out))


@functools.cache
def _exact_fields(kind: str, names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(n for n in names if kind.startswith("miopen") and _EXACT_NUMERIC.search(n))


def sizes(row: Row) -> dict[str, float]:
    """The numeric fields outside the signature: what a distance is measured over."""
    shared = {n for n, _ in signature(row)}
    return {n: float(v) for n, v in row.problem.items()
            if n not in shared and not isinstance(v, str | bool)}


def _config(key: str) -> dict[str, Any]:
    return dict(json.loads(key))


def _distinct(configs: Sequence[Config], k: int) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for c in configs:
        key = config_key(c)
        if key not in seen:
            seen.add(key)
            out.append(dict(c))
            if len(out) == k:
                break
    return out


@dataclass
class _Bucket:
    rows: list[Row]
    keys: list[str]  # config_key of each row's best
    fields: list[str]
    x: np.ndarray  # (n, fields) transformed sizes, nan where a row lacks a field
    codes: dict[str, int]  # shape family -> its number
    family: np.ndarray  # (n,) each row's family number
    tie: np.ndarray  # (volume, key) rank: equally near rows, the smaller problem first


class Nearest:
    """The best configuration of the training row with the nearest problem.

    Among the training rows of the same group and the same kind of problem (`signature`;
    all rows of the group when none is of the same kind), the nearest by Euclidean
    distance over the sizes, on a log2 scale (``log2``; values below 0.5 count as 0.5) or
    as they are (``linear``: vLLM's run-time rule, the table entry with the nearest M).
    Equally near rows: the same shape family first, then the smaller problem. The ranking
    goes on with the next nearest rows' bests (distinct configurations). vLLM's tuned-size
    lookup is the case of a table's own other sizes, which differ only in M.
    """

    def __init__(self, scale: str = "log2") -> None:
        self.scale = scale
        self.name = f"nearest-{scale}"
        self._kind: dict[tuple[str, tuple[Any, ...]], _Bucket] = {}
        self._group_rows: dict[str, list[Row]] = {}
        self._group: dict[str, _Bucket] = {}

    def _transform(self, v: np.ndarray) -> np.ndarray:
        return np.log2(np.maximum(v, 0.5)) if self.scale == "log2" else v

    def _bucket(self, rows: list[Row]) -> _Bucket:
        measured = [sizes(r) for r in rows]
        fields = sorted({f for m in measured for f in m})
        x = np.array([[m.get(f, np.nan) for f in fields] for m in measured], dtype=np.float64)
        x = self._transform(x.reshape(len(rows), len(fields)))
        codes: dict[str, int] = {}
        family = np.array([codes.setdefault(r.family, len(codes)) for r in rows], dtype=np.int64)
        order = sorted(range(len(rows)), key=lambda i: (rows[i].volume, rows[i].key))
        tie = np.empty(len(rows), dtype=np.int64)
        tie[order] = np.arange(len(rows))
        return _Bucket(rows, [config_key(r.best) for r in rows], fields, x, codes, family, tie)

    def fit(self, train: Sequence[Row]) -> None:
        kinds: dict[tuple[str, tuple[Any, ...]], list[Row]] = {}
        groups: dict[str, list[Row]] = {}
        for r in train:
            kinds.setdefault((r.group, signature(r)), []).append(r)
            groups.setdefault(r.group, []).append(r)
        self._kind = {k: self._bucket(v) for k, v in kinds.items()}
        self._group_rows, self._group = groups, {}

    def rank(self, row: Row, k: int) -> list[dict[str, Any]]:
        b = self._kind.get((row.group, signature(row)))
        if b is None:
            if row.group not in self._group_rows:
                return []
            if row.group not in self._group:  # built when first needed: most rows have their own kind
                self._group[row.group] = self._bucket(self._group_rows[row.group])
            b = self._group[row.group]
        own = sizes(row)
        q = self._transform(np.array([own.get(f, np.nan) for f in b.fields], dtype=np.float64))
        diff = np.nan_to_num(b.x - q, nan=_MISSING)
        extra = len(set(own) - set(b.fields))  # fields of this row no training row has
        d = np.sqrt((diff**2).sum(axis=1) + extra * _MISSING**2)
        other = b.family != b.codes.get(row.family, -1)
        idx = np.arange(len(d))
        if len(d) > _PREFILTER:
            idx = np.flatnonzero(d <= np.partition(d, _PREFILTER - 1)[_PREFILTER - 1])
        while True:
            seen: dict[str, int] = {}
            for i in idx[np.lexsort((b.tie[idx], other[idx], d[idx]))]:
                seen.setdefault(b.keys[i], int(i))
                if len(seen) == k:
                    break
            if len(seen) == k or len(idx) == len(d):
                return [dict(b.rows[i].best) for i in seen.values()]
            idx = np.arange(len(d))


class Majority:
    """The group's most frequent best configuration in training; the ranking goes on by
    frequency (equally frequent: by configuration key)."""

    name = "majority"

    def __init__(self) -> None:
        self._ranked: dict[str, list[dict[str, Any]]] = {}

    def fit(self, train: Sequence[Row]) -> None:
        counts: dict[str, Counter[str]] = {}
        for r in train:
            counts.setdefault(r.group, Counter())[config_key(r.best)] += 1
        self._ranked = {g: [_config(key) for key, _ in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))]
                        for g, c in counts.items()}

    def rank(self, row: Row, k: int) -> list[dict[str, Any]]:
        return [dict(c) for c in self._ranked.get(row.group, [])[:k]]


def _same_problem_elsewhere(index: dict[tuple[Any, ...], list[Row]], row: Row) -> list[Row]:
    """Training rows of this row's problem (family, volume and kind, device aside) on other
    devices, by device name."""
    rows = index.get((row.family, row.volume, signature(row, drop_device=True)), [])
    return sorted((r for r in rows if r.device != row.device), key=lambda r: (r.device, r.key))


def _index(train: Sequence[Row]) -> dict[tuple[Any, ...], list[Row]]:
    index: dict[tuple[Any, ...], list[Row]] = {}
    for r in train:
        index.setdefault((r.family, r.volume, signature(r, drop_device=True)), []).append(r)
    return index


class CopyBest:
    """What people do by hand: the best configuration of the same problem (same shape
    family, volume and kind) tuned on another device; with several, devices by name.
    ``[]`` where no other device has tuned it. Not restricted to the group, which for
    tables is the device itself."""

    name = "copy-best"

    def __init__(self) -> None:
        self._index: dict[tuple[Any, ...], list[Row]] = {}

    def fit(self, train: Sequence[Row]) -> None:
        self._index = _index(train)

    def rank(self, row: Row, k: int) -> list[dict[str, Any]]:
        return _distinct([r.best for r in _same_problem_elsewhere(self._index, row)], k)


class Default:
    """The space's default configuration, where the data names one; else ``[]``."""

    name = "default"

    def fit(self, train: Sequence[Row]) -> None:
        pass

    def rank(self, row: Row, k: int) -> list[dict[str, Any]]:
        return [dict(row.default)] if row.default and k > 0 else []


def _slowdowns(row: Row) -> dict[str, float]:
    """log(time / this row's best time) of every configuration that ran on it."""
    assert row.times is not None
    ok = {c: t for c, t in row.times.items() if c not in row.invalid and math.isfinite(t) and t > 0}
    if not ok:
        return {}
    best = min(ok.values())
    return {c: math.log(t / best) for c, t in ok.items()}


class Fleet:
    """The fleet's consensus, the rule the operator recommends to a GPU with no result yet
    (`fleettune.fleetprediction`): where training rows of the same problem on other
    devices have times, the configurations that ran on them, by the mean over those
    devices of log(time / that device's best). One row per device (the first by key);
    ``[]`` where no other device has times.

    Measuring (`rank_measured`), the mean is weighted by how well each device explains
    the pool's own times so far: once ``EARN_AFTER`` of its picks ran, a device's weight
    is ``exp(-v / median v)``, ``v`` the variance of the difference between the pool's
    log times and the device's over those picks (an offset is free: GPUs differ in
    speed), so the devices that rank like this GPU lead the next picks. Only with at least
    three other devices: with two, three measurements hand one of them all the weight (on
    the three-GPU GEMM recordings that cost 4 points of the optimum at 10 measurements)."""

    name = "fleet"
    EARN_AFTER = 3

    def __init__(self) -> None:
        self._index: dict[tuple[Any, ...], list[Row]] = {}

    def fit(self, train: Sequence[Row]) -> None:
        self._index = _index(train)

    def _consensus(self, row: Row) -> tuple[list[str], np.ndarray]:
        """The configurations that ran on every other device, and their log slow-downs
        there (devices × configurations)."""
        per_device: dict[str, Row] = {}
        for r in _same_problem_elsewhere(self._index, row):
            if r.times:
                per_device.setdefault(r.device, r)
        slow = [s for s in map(_slowdowns, per_device.values()) if s]
        if not slow:
            return [], np.zeros((0, 0))
        common = sorted(set(slow[0]).intersection(*slow[1:]))
        return common, np.array([[s[c] for c in common] for s in slow])

    def rank(self, row: Row, k: int) -> list[dict[str, Any]]:
        """The operator's own rule (`fleettune.fleetprediction.pick`), on the other devices."""
        from fleettune.fleetprediction import Table, pick

        tables = {}
        for r in _same_problem_elsewhere(self._index, row):
            if r.times and r.device not in tables:
                observed = [(_config(c), t) for c, t in r.times.items() if c not in r.invalid]
                table = Table.of([*observed, *((_config(c), None) for c in r.invalid)])
                if table.times:
                    tables[r.device] = table
        if not tables:
            return []
        chosen = pick(tables)
        return [chosen.configs[key] for key in chosen.ranked[:k]]

    def rank_measured(self, row: Row, k: int, measure: Measure) -> list[dict[str, Any]]:
        configs, slow = self._consensus(row)
        weights = np.ones(len(slow))
        chosen: list[int] = []
        ran: dict[int, float] = {}
        while len(chosen) < min(k, len(configs)):
            score = weights @ slow / weights.sum()
            score[chosen] = np.inf
            j = int(np.argmin(score))
            chosen.append(j)
            t = measure(_config(configs[j]))
            if t is not None:
                ran[j] = math.log(t)
            if len(ran) >= self.EARN_AFTER and len(slow) >= 3:
                cols = list(ran)
                diff = np.array([ran[c] for c in cols])[None, :] - slow[:, cols]
                v = diff.var(axis=1)
                weights = np.exp(-v / max(float(np.median(v)), 1e-12))
        return [_config(configs[j]) for j in chosen]


def _learned() -> Predictor:
    from fleettune_dev.bench.predict.learned import Learned

    return Learned()


def _size(row: Row) -> tuple[int, ...]:
    return tuple(int(v) for _, v in sorted(sizes(row).items()))


class GaussianProcess:
    """fleettune's own answer for an untuned size (`fleettune.prediction.recommend`: a
    Gaussian process over configuration and log2 size, fitted to how much slower than
    each tuned size's best every measured configuration ran), for Kernel Tuner caches:
    from the training rows of the same group, shape family and device with times at
    other sizes. It ranks one configuration, the recommendation; ``[]`` for other kinds
    of data and where no other size of the kernel on this device was tuned.

    The space is the Cartesian product of the values the training rows measured, as
    `read_kernel_tuner_cache` builds it from a cache's ``tune_params``.
    """

    name = "gp"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._tuned: dict[tuple[str, str, str], list[Row]] = {}
        self._spaces: dict[tuple[str, str, str], Any] = {}

    def fit(self, train: Sequence[Row]) -> None:
        self._tuned, self._spaces = {}, {}
        for r in train:
            if r.kind == "kt-caches" and r.times and sizes(r):
                self._tuned.setdefault((r.group, r.family, r.device), []).append(r)

    def _space(self, where: tuple[str, str, str]) -> Any:
        if where not in self._spaces:
            from fleettune.space import SearchSpace
            from fleettune.space.records import parameter_spec

            values: dict[str, set[Any]] = {}
            for r in self._tuned[where]:
                for key in (*(r.times or {}), *r.invalid):
                    for name, v in _config(key).items():
                        values.setdefault(name, set()).add(v)
            specs = [parameter_spec(n, sorted(v, key=lambda x: (str(type(x)), x)), n) for n, v in values.items()]
            self._spaces[where] = SearchSpace.from_spec(specs, [])
        return self._spaces[where]

    def rank(self, row: Row, k: int) -> list[dict[str, Any]]:
        from fleettune.prediction import recommend

        where = (row.group, row.family, row.device)
        size = _size(row)
        tuned = [r for r in self._tuned.get(where, []) if len(_size(r)) == len(size) and _size(r) != size]
        if row.kind != "kt-caches" or not size or not tuned or k < 1:
            return []
        records: dict[tuple[int, ...], list[tuple[dict[str, Any], float | None]]] = {}
        for r in tuned:
            assert r.times is not None
            records.setdefault(_size(r), []).extend(
                [(_config(c), None if c in r.invalid else t) for c, t in r.times.items()]
                + [(_config(c), None) for c in r.invalid if c not in r.times])
        try:
            return [dict(recommend(self._space(where), records, size, seed=self.seed).config)]
        except ValueError:
            return []


# name -> factory; the order is the tables' order.
PREDICTORS: dict[str, Callable[[], Predictor]] = {
    "nearest-log2": lambda: Nearest("log2"),
    "nearest-linear": lambda: Nearest("linear"),
    "majority": Majority,
    "gp": GaussianProcess,
    "learned": _learned,
    "copy-best": CopyBest,
    "default": Default,
    "fleet": Fleet,
}
NOT_AVAILABLE = {"occupancy": "the occupancy model is not built yet"}
NAMES = (*PREDICTORS, *NOT_AVAILABLE)


def applicable(name: str, rows: Sequence[Row]) -> bool:
    """Whether predictor ``name`` can apply to any of ``rows``: what the defaults run."""
    if name in NOT_AVAILABLE:
        return False
    if name == "gp":
        return any(r.kind == "kt-caches" and r.times for r in rows)
    if name == "default":
        return any(r.default for r in rows)
    if name == "fleet":
        return any(r.times for r in rows) and len({r.device for r in rows}) > 1
    if name == "copy-best":
        return len({r.device for r in rows}) > 1
    return True


def make(name: str) -> Predictor:
    return PREDICTORS[name]()
