"""What `fleettune bench predict` reads, and what a predictor is (pure: no I/O here).

Every data kind is read into :class:`Row` s: one tuned problem (a size of a kernel on a
GPU, a batch size of one vLLM table, one MIOpen convolution problem for one solver) with
the best configuration the tuner found and, where the data has them, the times of the
other configurations. Splits, predictors and scores only ever see rows, so a predictor
works on every kind of data that carries what it needs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from fleettune.fleetprediction import config_key

Config = Mapping[str, Any]
Descriptor = Mapping[str, float | int | str]


def stable_hash(text: str) -> int:
    """A hash that does not change between processes (Python's ``hash`` of a str does)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


@dataclass(frozen=True)
class Row:
    """One tuned problem.

    ``problem`` describes the problem to a predictor: numbers (sizes, channels, batch) and
    strings (dtype, layout, device, direction). ``times`` maps :func:`config_key` of every
    measured configuration to its time (ms) where the data has them, ``None`` for best-only
    data; ``invalid`` holds the keys of configurations that failed on this problem.
    ``default`` is the space's default configuration where the data names one.
    """

    data: str  # the data set's name (from --data)
    kind: str  # kt-caches | vllm-tables | miopen-perfdb | miopen-finddb
    group: str  # solver (MIOpen), device (tables), kernel family (caches)
    family: str  # the shape family, for leave-one-family-out
    device: str  # the GPU, for leave-one-GPU-out
    key: str  # canonical problem key (the hash split hashes it)
    volume: float  # the problem's work (product of its sizes; M for a vLLM table)
    problem: Descriptor
    best: Config
    times: Mapping[str, float] | None = None
    invalid: frozenset[str] = field(default_factory=frozenset)
    default: Config | None = None

    @property
    def parameters(self) -> tuple[str, ...]:
        return tuple(sorted(self.best))


class Predictor(Protocol):
    """A predictor learns from the tuned rows and ranks configurations for an untuned one.

    ``rank`` returns up to ``k`` distinct configurations, best first: the first is the
    prediction, the first ``k`` what a pool would measure first. It must only use what
    ``fit`` was given plus ``row.problem``, ``row.group``, ``row.device``, ``row.family``,
    ``row.volume`` and ``row.default`` of the row it predicts — never ``row.best`` or
    ``row.times``. An empty list means the predictor does not apply to this row.
    """

    name: str

    def fit(self, train: Sequence[Row]) -> None: ...

    def rank(self, row: Row, k: int) -> list[dict[str, Any]]: ...


Measure = Callable[[Config], "float | None"]  # a configuration's time on the row's problem; None: it failed


@runtime_checkable
class Measuring(Predictor, Protocol):
    """A predictor that, where the held-out row has times, ranks as a pool would measure:
    each configuration is measured (``measure``) before the next is chosen, so the first
    is the prediction with no measurement and the later ones use what the earlier ones
    showed. It sees only the times of the configurations it chose."""

    def rank_measured(self, row: Row, k: int, measure: Measure) -> list[dict[str, Any]]: ...


def measurer(row: Row) -> Measure:
    """What measuring a configuration on ``row``'s problem returns: its recorded time, None
    where it failed or was not recorded (the pool would find it does not run)."""
    times = row.times or {}

    def measure(config: Config) -> float | None:
        key = config_key(config)
        t = times.get(key)
        return None if t is None or key in row.invalid or not t > 0 else float(t)

    return measure
