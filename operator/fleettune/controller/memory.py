"""The fleet's memory: what earlier runs of the same kernel measured, as a prior for every
pool of a new run (pure; the shell reads the stores, `fleettune.store.MemoryReader`).

A kernel's identity (`kernel_id`) is its code and its interface, not its search space: a
built-in's name and the digest of the CUDA code the job image ships for it, or a user
source's digest with its function, launch geometry and arguments; the parameters' names and
the objective. Parameter values, constraints, problem sizes, GPUs and drivers may differ:
each earlier pool's results count where they fall in the new pool's space, times relative
to their own best (another GPU or size runs at another speed; how much slower than the best
a configuration is carries over). A changed source is another kernel.

Each result carries its kernel's identity (`TrialRecord.kernel`), stamped when it is
recorded, so that a run whose source changed mid-way never hands a later run the old
kernel's results as the new one's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleettune.api import TuningRunSpec
from fleettune.controller.pool import Observation, Pool, relative_prior
from fleettune.results import StoredRun, TrialRecord
from fleettune.space.devices import normalise_product

# A warm study fits its prior model to every prior observation (cubic in their number):
# the memory's groups beyond this many observations are left out, the pool's own GPU's
# first, then the newest.
MAX_OBSERVATIONS = 2000
# A run re-reads the memory for a pool that builds its search later than this after the
# last read (a later size, a new round): runs may have finished meanwhile.
REFRESH_S = 300.0
# The status and the event name this many earlier runs per pool (the event says how many in all).
MAX_NAMED = 8


def kernel_id(spec: TuningRunSpec, source_digest: str | None) -> str:
    """The kernel's identity across runs (the module's docstring says what counts)."""
    kernel = spec.kernel
    doc: dict[str, Any] = {"v": 1, "parameters": sorted(p.name for p in spec.parameters),
                           "objective": spec.objective.dump()}
    if kernel.builtin is not None:
        from fleettune_job.kernels import BUILTINS

        code = BUILTINS[kernel.builtin].source if kernel.builtin in BUILTINS else ""
        doc["builtin"] = {"name": kernel.builtin, "code": hashlib.sha256(code.encode()).hexdigest()}
    else:
        assert kernel.source is not None
        source = kernel.source.dump()
        doc["source"] = {"digest": source_digest, "function": source["function"], "grid": source.get("grid"),
                         "block": source.get("block"), "arguments": source.get("arguments")}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def stamped(records: list[TrialRecord], kernel: str, rounds: Mapping[str, int]) -> list[TrialRecord]:
    """``records`` with those of each pool's current round (``rounds``) saying which kernel
    they measured, for later runs to find; an older round's may be another kernel's."""
    return [r.model_copy(update={"kernel": kernel}) if r.kernel is None and rounds.get(r.target) == r.round else r
            for r in records]


@dataclass
class FleetMemory:
    """The earlier runs' records of the run's kernel, as last read."""

    kernel: str | None = None
    runs: list[StoredRun] = field(default_factory=list)
    read_at: float | None = None  # monotonic seconds; None: not read for this kernel
    problems: list[str] = field(default_factory=list)  # what could not be read, said once

    def reset(self) -> None:
        self.kernel, self.runs, self.read_at, self.problems = None, [], None, []

    def due(self, kernel: str, mono: float, building: bool) -> bool:
        """Whether to read the stores: never for this kernel, or stale while a pool is about
        to build its search (``building``)."""
        if kernel != self.kernel or self.read_at is None:
            return True
        return building and mono - self.read_at >= REFRESH_S

    def accept(self, kernel: str, runs: Sequence[StoredRun], problems: Sequence[str], mono: float) -> list[str]:
        """The stores as just read; returns the problems not said before."""
        new = [p for p in problems if p not in self.problems]
        self.kernel, self.runs, self.read_at = kernel, list(runs), mono
        self.problems += new
        return new


@dataclass(frozen=True)
class MemoryUse:
    """What a pool's prior took from the memory: per earlier run, the results in its space."""

    observations: list[Observation]
    per_run: list[tuple[str, int]]  # (run label, results in the pool's space), most first

    def summary(self, pool: str) -> str:
        named = ", ".join(f"{run} ({n})" for run, n in self.per_run[:MAX_NAMED])
        if len(self.per_run) > MAX_NAMED:
            named += f" and {len(self.per_run) - MAX_NAMED} more"
        return (f"{pool}: starts from {len(self.observations)} results of {len(self.per_run)} earlier run(s) "
                f"of this kernel in its space: {named}")


def memory_prior(pool: Pool, runs: Sequence[StoredRun], namespace: str,
                 valid: Callable[[dict[str, Any]], bool]) -> MemoryUse:
    """The observations of ``runs`` that ``valid`` keeps (the pool's space), relative to the
    best of their group: one earlier pool (run, target, round, problem size) each."""
    groups: dict[tuple[str, str, int, tuple[int, ...]], list[TrialRecord]] = {}
    labels: dict[str, str] = {}
    for run in runs:
        labels[run.uid] = run.label(namespace)
        for rec in run.records:
            if rec.is_observation:
                groups.setdefault((run.uid, rec.target, rec.round, tuple(rec.problem_size or ())), []).append(rec)

    own = normalise_product(pool.device)  # node labels and drivers spell products differently

    def other_gpu(records: list[TrialRecord]) -> bool:
        return own not in {normalise_product(r.fingerprint.product) for r in records if r.fingerprint is not None}

    ranked = sorted(groups.items(), key=lambda item: max(r.recorded_at for r in item[1]), reverse=True)
    ranked.sort(key=lambda item: other_gpu(item[1]))  # stable: the pool's own GPU first, each newest first
    observations: list[Observation] = []
    counts: dict[str, int] = {}
    for (uid, *_), records in ranked:
        if observations and len(observations) + len(records) > MAX_OBSERVATIONS:
            continue
        kept = relative_prior([[(r.config, r.outcome, r.objective) for r in records]], valid)
        if kept:
            observations += kept
            counts[labels[uid]] = counts.get(labels[uid], 0) + len(kept)
    per_run = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return MemoryUse(observations, per_run)
