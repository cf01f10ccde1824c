"""Uniform random search over the candidates: the floor every strategy must beat."""

from __future__ import annotations

import numpy as np

from .problem import History
from .strategy import Strategy, take_random


class RandomSearch(Strategy):
    name = "random"  # no options (`StrategyOptions` declares none)
    learns = False  # a batch chosen blind loses nothing

    def propose(self, n: int, history: History, pending: np.ndarray, available: np.ndarray) -> np.ndarray:
        # Seeded by the state only: a sequence of single suggestions differs from one batch
        # of the same size, and that is fine, but a replay must not.
        return take_random(self.rng(history, pending), available, n)
