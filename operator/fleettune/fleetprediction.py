"""Recommend a configuration to a GPU that has no valid result yet, from the other GPUs of
the run at the same problem size (pure: it takes observations, never records).

A new node pool, a pool scaled to zero waiting for its node, a Jetson pool that has not
measured yet: each can run something better than the default before its first
measurement. The rule, measured offline (`fleettune bench predict --split logo`, one
kernel recorded on six GPUs, each left out in turn): the *consensus* of the other GPUs
reached 0.85–0.86 of the left-out GPU's optimum, copying a single other GPU's best
0.67–0.84.

* **consensus** (two or more other GPUs with valid results): among the configurations
  measured valid on any of them and failed on none, the one with the smallest mean over
  them of ``log(time / that GPU's best time)``, where a GPU that did not measure a
  configuration counts it at its median (pools that search on their own measure few of
  the same configurations: without this, the consensus of a live run would be little
  more than the default, which every pool measures first; where every GPU measured every
  configuration, as in the offline measurement, it changes nothing). Ties go to the
  configuration that sorts first (its JSON with sorted keys), so the answer does not
  depend on the order of the records.
* **one other GPU**: its best configuration.
* **confidence** (three or more other GPUs): each of them left out in turn, the same rule
  on the rest, scored by the fraction of the left-out GPU's optimum it reaches (best time /
  its time; 0 where it failed there; a GPU that never measured it is left out, and when
  none did there is no confidence). The mean, and the lowest and highest, are the expected
  fraction and its range.

A configuration with a failed measurement on a GPU counts as failed there (a flaky one is
no recommendation), and one that failed on the GPU being predicted for, or that
``allowed`` refuses (its device's constraints), is skipped for the next best. Another GPU's
time is not this one's: no time is predicted.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Observed = Sequence[tuple[Mapping[str, Any], float | None]]  # (configuration, ms or None: invalid)
MIN_CONSENSUS = 2  # other GPUs for a consensus
MIN_CONFIDENCE = 3  # other GPUs to leave one out and still have a consensus of the rest
NO_CONFIDENCE = "no confidence: fewer than three other GPUs"
NOT_MEASURED = "no confidence yet: no GPU left out has measured what the others pick"


def config_key(config: Mapping[str, Any]) -> str:
    """A configuration's canonical key (parameter order does not matter)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class Table:
    """One GPU's results: the best valid time of each configuration never failed there,
    and the configurations that failed there."""

    times: dict[str, float]
    configs: dict[str, dict[str, Any]]
    failed: frozenset[str] = frozenset()

    @classmethod
    def of(cls, observed: Observed) -> Table:
        failed = {config_key(c) for c, ms in observed if not _valid(ms)}
        times: dict[str, float] = {}
        configs: dict[str, dict[str, Any]] = {}
        for config, ms in observed:
            key = config_key(config)
            if key in failed or ms is None:
                continue
            if key not in times or ms < times[key]:
                times[key], configs[key] = ms, dict(config)
        return cls(times, configs, frozenset(failed))

    @property
    def best(self) -> float:
        return min(self.times.values())

    def ranked(self) -> list[str]:
        return sorted(self.times, key=lambda k: (self.times[k], k))


def _valid(ms: float | None) -> bool:
    return ms is not None and math.isfinite(ms) and ms > 0


@dataclass(frozen=True)
class Pick:
    """What the rule chose from some GPUs: configuration keys best first, and how."""

    ranked: list[str]
    configs: dict[str, dict[str, Any]]
    how: str  # the basis, before any skipped configuration and the confidence


def pick(tables: Mapping[str, Table]) -> Pick:
    """The rule on ``tables`` (GPUs with at least one valid result each)."""
    names = sorted(tables)
    if len(names) < MIN_CONSENSUS:
        (only,) = names
        return Pick(tables[only].ranked(), tables[only].configs,
                    f"gpus: the best of {only} (one other GPU; no consensus)")
    # Each GPU's best once: inside the comprehension it is a min per configuration, which
    # takes minutes on a complete recording (thousands of configurations, six GPUs).
    best = {n: tables[n].best for n in names}
    slow = {n: {k: math.log(t / best[n]) for k, t in tables[n].times.items()} for n in names}
    typical = {n: statistics.median(slow[n].values()) for n in names}
    failed = set().union(*(tables[n].failed for n in names))
    candidates = set().union(*(slow[n] for n in names)) - failed
    if not candidates:
        return Pick([], {}, "gpus: no configuration ran valid on any of them")
    score = {k: sum(slow[n].get(k, typical[n]) for n in names) / len(names) for k in candidates}
    configs = {k: c for n in names for k, c in tables[n].configs.items()}
    common = len(set.intersection(*(set(slow[n]) for n in names)))
    everywhere = "both" if len(names) == 2 else f"all {len(names)}"
    return Pick(sorted(candidates, key=lambda k: (score[k], k)), configs,
                f"gpus: consensus of {', '.join(names)} ({common} configuration{'s' * (common != 1)} ran on "
                f"{everywhere}; one a GPU did not measure counts at its median)")


def ranked(groups: Sequence[Observed]) -> list[dict[str, Any]]:
    """Every configuration the rule can choose from ``groups`` (one per other GPU), the
    rule's choice first: by consensus of two or more groups with a valid result, else one
    group's fastest first; empty where none has one. What a warm start measures first."""
    tables = {f"{i:05d}": t for i, group in enumerate(groups) if (t := Table.of(group)).times}
    if not tables:
        return []
    chosen = pick(tables)
    return [chosen.configs[key] for key in chosen.ranked]


def leave_one_out(tables: Mapping[str, Table]) -> tuple[float, float, float, int] | None:
    """(mean, lowest, highest) fraction of the left-out GPU's optimum that the rule on the
    others reaches — 0 where the pick failed there; a left-out GPU that never measured the
    pick tells nothing and is left out — and how many were left out so; None with fewer
    than MIN_CONFIDENCE GPUs or when none measured the pick of the rest."""
    if len(tables) < MIN_CONFIDENCE:
        return None
    fractions: list[float] = []
    unmeasured = 0
    for out in sorted(tables):
        chosen = pick({n: t for n, t in tables.items() if n != out}).ranked[0]
        ms = tables[out].times.get(chosen)
        if ms is not None:
            fractions.append(tables[out].best / ms)
        elif chosen in tables[out].failed:
            fractions.append(0.0)
        else:
            unmeasured += 1
    if not fractions:
        return None
    return sum(fractions) / len(fractions), min(fractions), max(fractions), unmeasured


@dataclass(frozen=True)
class FleetRecommendation:
    config: dict[str, Any]
    basis: str
    expected_fraction: float | None = None
    expected_fraction_range: tuple[float, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The status form (a `Prediction`'s fields; `predictedMs` stays unset)."""
        out: dict[str, Any] = {"source": "gpus", "config": self.config, "basis": self.basis}
        if self.expected_fraction is not None and self.expected_fraction_range is not None:
            out["expectedFraction"] = round(self.expected_fraction, 3)
            out["expectedFractionRange"] = [round(v, 3) for v in self.expected_fraction_range]
        return out


def recommend(own: Observed, others: Mapping[str, Observed],
              allowed: Callable[[dict[str, Any]], bool] | None = None) -> FleetRecommendation | None:
    """A configuration for a GPU whose observations are ``own`` from ``others`` (other GPU
    → its observations at the same size, kernel, space and round); None when it has a
    valid result of its own (its best replaces any prediction) or no other GPU has one."""
    if any(_valid(ms) for _, ms in own):
        return None
    tables = {name: t for name, obs in others.items() if (t := Table.of(obs)).times}
    if not tables:
        return None
    failed_here = {config_key(c) for c, _ in own}
    chosen = pick(tables)
    skipped = 0
    for key in chosen.ranked:
        config = chosen.configs[key]
        if key not in failed_here and (allowed is None or allowed(config)):
            break
        skipped += 1
    else:
        return None
    parts = [chosen.how]
    if skipped:
        parts.append(f"{skipped} better one(s) failed here or are invalid on this GPU")
    loo = leave_one_out(tables)
    if loo is None:
        parts.append(NO_CONFIDENCE if len(tables) < MIN_CONFIDENCE else NOT_MEASURED)
        return FleetRecommendation(config, "; ".join(parts))
    mean, low, high, unmeasured = loo
    said = (f"confidence: each of the {len(tables)} left out in turn, the consensus of the rest reached "
            f"{mean:.2f} ({low:.2f}..{high:.2f}) of its optimum")
    if unmeasured:
        said += f" ({unmeasured} never measured it: left out)"
    parts.append(said)
    return FleetRecommendation(config, "; ".join(parts), mean, (low, high))

