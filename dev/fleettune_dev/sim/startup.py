"""How long a trial container takes to start measuring: a small, pure model.

Between kwok (or a kubelet) reporting a trial Pod Running and the job's first compile,
a real container starts its interpreter, imports the job (cupy, NVRTC bindings) and
creates a CUDA context: a couple of seconds, with a long tail when a node is busy. The
fleet simulator adds one draw of :class:`PodStartup` before a Pod's first configuration
when start-up modelling is on; a batch Pod pays it once for all its configurations,
which is what batching saves.

The default quantiles (p50 ≈ 2 s, p99 ≈ 5 s) are what the batch-protocol plan assumes for
the job image on a warm node (image already pulled). Only the standard library is
imported, so timeline benchmarks can use the same model without a cluster client.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Final

from fleettune_dev.sim.recordings import unit_hash

Z99: Final = statistics.NormalDist().inv_cdf(0.99)


@dataclass(frozen=True)
class PodStartup:
    """A log-normal start-up time given by its median and 99th percentile (seconds).

    ``p99_s == p50_s`` gives a constant start-up. Draws are either deterministic per key
    (:meth:`for_pod`: the simulator's, stable whatever the order Pods start in) or from a
    caller's ``random.Random`` (:meth:`sample`).
    """

    p50_s: float = 2.0
    p99_s: float = 5.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.p50_s) and math.isfinite(self.p99_s)) or not 0 < self.p50_s <= self.p99_s:
            raise ValueError(f"pod start-up needs 0 < p50 <= p99 (got p50={self.p50_s:g}, p99={self.p99_s:g})")

    @property
    def mu(self) -> float:
        """Mean of the underlying normal (log seconds)."""
        return math.log(self.p50_s)

    @property
    def sigma(self) -> float:
        """Spread of the underlying normal (log seconds)."""
        return math.log(self.p99_s / self.p50_s) / Z99

    def quantile(self, q: float) -> float:
        """The start-up time below which a share ``q`` (0 < q < 1) of Pods start."""
        if not 0 < q < 1:
            raise ValueError("q must be in (0, 1)")
        return self.at(statistics.NormalDist().inv_cdf(q))

    def at(self, z: float) -> float:
        """The start-up ``z`` standard deviations from the median on the log scale: for a
        caller with its own normal draws (`fleettune bench timeline`: numpy's)."""
        return math.exp(self.mu + self.sigma * z)

    def sample(self, rng: random.Random) -> float:
        return rng.lognormvariate(self.mu, self.sigma)

    def for_pod(self, seed: int, key: str) -> float:
        """A draw fixed by ``seed`` and ``key`` (a Pod's uid), the same in every process."""
        return self.quantile(unit_hash(seed, "pod-startup", key))
