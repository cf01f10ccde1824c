"""The interface every search strategy implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from .problem import Candidates, History


class Strategy(ABC):
    """Chooses candidate numbers. Must be a pure function of (seed, history, pending):

    the operator rebuilds studies from stored results after a restart and must get the
    same next suggestions, so no hidden state may depend on the call sequence (caches
    keyed by the history are fine).
    """

    name: str = "?"

    def __init__(self, candidates: Candidates, seed: int, options: dict[str, Any] | None = None) -> None:
        self.candidates = candidates
        self.seed = int(seed)
        self.options = dict(options or {})

    def rng(self, history: History, pending: np.ndarray, salt: int = 0) -> np.random.Generator:
        """A generator that depends only on the state, never on how often we were called."""
        return np.random.default_rng([self.seed, len(history), len(pending), salt, 0x5EED])

    @abstractmethod
    def propose(self, n: int, history: History, pending: np.ndarray, available: np.ndarray) -> np.ndarray:
        """``n`` distinct candidate numbers among ``available`` (a boolean mask) that are
        not in ``pending``; fewer only if fewer are available."""


def take_random(rng: np.random.Generator, available: np.ndarray, n: int) -> np.ndarray:
    idx = np.flatnonzero(available)
    if len(idx) <= n:
        return rng.permutation(idx)
    return rng.choice(idx, size=n, replace=False)
