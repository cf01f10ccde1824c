"""A recorded search space as the replays use it, and what uniform random sampling
would reach on it.

A `Replay` is one Kernel Tuner cache reduced to index rows, times and failures. It can be
restricted to a subspace (``block_size_x>=32``): the configurations a user's constraints
would leave, with the recorded times and failures of exactly those — how the replays make
a space where a larger share fails without inventing any measurement.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fleettune_job.protocol import Outcome

FAILURE_OUTCOME = {"compile": Outcome.COMPILE_ERROR, "runtime": Outcome.RUNTIME_ERROR, "invalid": Outcome.COMPILE_ERROR}
_CONDITION = re.compile(r"^\s*(\w+)\s*(>=|<=|=)\s*([^\s].*?)\s*$")


@dataclass
class Replay:
    """A recorded space reduced to what a replay needs."""

    name: str
    space: Any
    rows: np.ndarray  # (N, d) index rows of the cached configurations
    time_ms: np.ndarray  # (N,) nan where the configuration failed
    failure: list[str | None]
    times: list[list[float]]
    path: Path | None = None  # the recording it was read from (another tool replays the file)
    optimum: float = field(init=False)

    def __post_init__(self) -> None:
        self.optimum = float(np.nanmin(self.time_ms))


def family(name: str) -> str:
    """A recording's kernel family: its name before the first '-' (``gemm-RTX_3090``: gemm;
    a restricted one, ``convolution[block_size_y=8]-RTX_3090``, is a family of its own)."""
    return name.split("-", 1)[0]


def load_replay(path: str | Path, where: Sequence[str] = ()) -> Replay:
    """The recording at ``path``, restricted by ``where`` (see `restrict`) if given."""
    from fleettune_dev.interop import read_kernel_tuner_cache

    rec = read_kernel_tuner_cache(path)
    time_ms = np.array([np.nan if r.time_ms is None else float(r.time_ms) for r in rec.records])
    replay = Replay(
        name=Path(path).name,
        space=rec.space,
        rows=np.asarray(rec.rows, dtype=np.int32),
        time_ms=time_ms,
        failure=[r.failure for r in rec.records],
        times=[list(r.times or []) for r in rec.records],
        path=Path(path),
    )
    return restrict(replay, where) if where else replay


def restrict(replay: Replay, where: Sequence[str]) -> Replay:
    """The configurations of ``replay`` that meet every condition of ``where``, each
    ``NAME=V1,V2,…``, ``NAME>=V`` or ``NAME<=V`` on a parameter's value. The name says
    which: ``convolution[block_size_y=8]-RTX_3090.json.gz``."""
    names = list(replay.space.names)
    keep = np.ones(len(replay.rows), dtype=bool)
    for text in where:
        m = _CONDITION.match(text)
        if m is None or m.group(1) not in names:
            raise ValueError(f"a restriction is NAME=V1,V2, NAME>=V or NAME<=V on one of {names}: {text!r}")
        column = names.index(m.group(1))
        values = replay.space.parameters[column].values
        wanted = [_value(v, values) for v in m.group(3).split(",")]
        if m.group(2) == "=":
            ok = [i for i, v in enumerate(values) if v in wanted]
        elif m.group(2) == ">=":
            ok = [i for i, v in enumerate(values) if v >= wanted[0]]
        else:
            ok = [i for i, v in enumerate(values) if v <= wanted[0]]
        keep &= np.isin(replay.rows[:, column], ok)
    if not np.isfinite(replay.time_ms[keep]).any():
        raise ValueError(f"no configuration of {replay.name} meeting {list(where)} ran")
    stem, _, rest = replay.name.partition("-")
    idx = np.flatnonzero(keep)
    return Replay(name=f"{stem}[{','.join(w.replace(' ', '') for w in where)}]-{rest}", space=replay.space,
                  rows=replay.rows[idx], time_ms=replay.time_ms[idx], failure=[replay.failure[i] for i in idx],
                  times=[replay.times[i] for i in idx], path=replay.path)


def scramble(replay: Replay) -> Replay:
    """``replay`` with each parameter's values relabelled in a fixed random order: every
    time and failure is recorded, but a configuration's neighbours are no longer the
    configurations its time resembles. A space whose structure a model's encoding cannot
    see, where a model-based search can do no better than uniform random sampling and
    must do no worse. Named ``convolution~scrambled-RTX_3090.json.gz``, a family of its own."""
    rng = np.random.default_rng(11)
    rows = replay.rows.copy()
    for column, parameter in enumerate(replay.space.parameters):
        rows[:, column] = rng.permutation(len(parameter.values))[rows[:, column]]
    stem, _, rest = replay.name.partition("-")
    return Replay(name=f"{stem}~scrambled-{rest}", space=replay.space, rows=rows, time_ms=replay.time_ms,
                  failure=replay.failure, times=replay.times, path=None)


def _value(text: str, values: Sequence[Any]) -> Any:
    for v in values:
        if str(v) == text.strip():
            return v
    try:
        return type(values[0])(text.strip())
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not one of the values {list(values)}") from None


def fractions_of(replay: Replay, best: np.ndarray) -> np.ndarray:
    """Fraction of the optimum of best-so-far times (0 where nothing has run yet)."""
    return np.where(np.isfinite(best), replay.optimum / best, 0.0)


def random_expectation(replay: Replay, budget: int) -> np.ndarray:
    """The expected fraction of the optimum after each of ``budget`` evaluations of uniform
    random sampling without replacement (a failure counts as an evaluation), exactly:
    the best of ``n`` draws is the ``k``-th best configuration with probability
    C(N−k, n−1) / C(N, n)."""
    score = np.sort(np.nan_to_num(replay.optimum / replay.time_ms, nan=0.0))[::-1]
    total = len(score)
    k = np.arange(1, total + 1)
    out = np.zeros(budget)
    for n in range(1, min(budget, total) + 1):
        valid = k <= total - n + 1
        logp = (_lchoose(total - k[valid], n - 1) - _lchoose(np.array([total]), n)).astype(float)
        out[n - 1] = float(np.sum(np.exp(logp) * score[valid]))
    out[min(budget, total):] = float(score[0])
    return out


def _lchoose(n: np.ndarray, r: int) -> np.ndarray:
    lgamma = np.vectorize(math.lgamma)
    return lgamma(n + 1) - lgamma(r + 1) - lgamma(n - r + 1)
