"""A small synthetic tuning problem with a planted optimum and a planted hidden
(unknown-to-the-tuner) infeasible region, so the optimiser tests need no recorded file."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleettune.space import SearchSpace
from fleettune_job.protocol import Outcome

PARAMS = [
    {"name": "bx", "type": "ordinal", "values": [16, 32, 64, 128, 256, 512, 1024]},
    {"name": "by", "type": "ordinal", "values": [1, 2, 4, 8, 16]},
    {"name": "tile", "type": "integer", "range": {"min": 1, "max": 8}},
    {"name": "layout", "type": "categorical", "values": ["a", "b", "c"]},
    {"name": "unroll", "type": "boolean"},
]
CONSTRAINTS = ["bx * by <= 1024"]


def hidden_infeasible(c: dict) -> bool:
    """The planted resource limit: the tuner only learns it from failures."""
    return c["bx"] * c["tile"] > 1024


def objective(c: dict) -> float:
    # Optimum at bx=128, by=2, tile=6, layout "b", unroll: right next to the failure
    # boundary (bx*tile=768, while tile 8 or bx 256 fail), as real kernels tend to be.
    s = (math.log2(c["bx"]) - 7) ** 2 + 0.6 * (math.log2(c["by"]) - 1) ** 2 + 0.15 * (c["tile"] - 6) ** 2
    s += {"a": 0.8, "b": 0.0, "c": 0.4}[c["layout"]] + (0.0 if c["unroll"] else 0.3)
    return 1.0 + 0.5 * math.exp(0.5 * s) - 0.5


def evaluate(c: dict) -> tuple[Outcome, float | None]:
    if hidden_infeasible(c):
        return Outcome.COMPILE_ERROR, None
    return Outcome.OK, objective(c)


@pytest.fixture(scope="session")
def space() -> SearchSpace:
    return SearchSpace.from_spec(PARAMS, CONSTRAINTS)


@pytest.fixture(scope="session")
def optimum(space: SearchSpace) -> float:
    configs = space.to_configs(space.enumerate())
    return min(objective(c) for c in configs if not hidden_infeasible(c))


def feed(study, n: int) -> list[dict]:
    """``n`` sequential suggestions of ``study``, each evaluated and observed; the configurations."""
    seen = []
    for _ in range(n):
        (c,) = study.suggest(1)
        study.observe(c, *evaluate(c))
        seen.append(c)
    return seen


def run(study, budget: int) -> tuple[np.ndarray, int]:
    """Sequential replay: best value after each evaluation and the number of failures."""
    best, trace, invalid = math.inf, [], 0
    for _ in range(budget):
        (config,) = study.suggest(1)
        outcome, value = evaluate(config)
        study.observe(config, outcome, value)
        if value is not None:
            best = min(best, value)
        else:
            invalid += 1
        trace.append(best)
    return np.array(trace), invalid
