"""The fleet as one learner (pure): every pool's search starts from what the run's other
pools measure at its problem size and its target measures at the other sizes, refreshed as
their results arrive, and from what earlier runs of the same kernel measured (the fleet's
memory; the shell reads their stores, `fleettune.store.MemoryReader`).

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleettune.api import PriorKind, TuningRunSpec
from fleettune.controller.pool import Observation, Pool, best_of, in_space, relative_prior
from fleettune.fleetprediction import MIN_CONFIDENCE, ranked
from fleettune.results import StoredRun, TrialRecord
from fleettune.space.devices import normalise_product
from fleettune_job.protocol import Outcome

# A warm study fits its prior model to every prior observation (cubic in their number):
# the fleet's groups beyond this many observations are left out (the run's other pools
# first, then earlier runs' of the pool's own GPU, then the newest).
MAX_OBSERVATIONS = 2000
# A run re-reads the memory for a pool that builds its search later than this after the
# last read (a new round, a pool whose nodes came later): runs may have finished meanwhile.
REFRESH_S = 300.0
# The status and the event name this many sources per pool (the event says how many in all).
MAX_NAMED = 8


def kernel_id(spec: TuningRunSpec, source_digest: str | None) -> str | None:
    """The kernel's identity across runs (the module's docstring says what counts); None for
    a source not read yet (``source_digest``)."""
    kernel = spec.kernel
    if kernel.user is not None and source_digest is None:
        return None
    doc: dict[str, Any] = {"v": 1, "parameters": sorted(p.name for p in spec.parameters),
                           "objective": spec.objective.dump()}
    if kernel.builtin is not None:
        from fleettune_job.kernels import BUILTINS

        code = BUILTINS[kernel.builtin].source if kernel.builtin in BUILTINS else ""
        doc["builtin"] = {"name": kernel.builtin, "code": hashlib.sha256(code.encode()).hexdigest()}
    else:
        assert kernel.user is not None
        source = kernel.user.dump()
        doc["triton" if kernel.triton is not None else "source"] = {
            "digest": source_digest, "function": source["function"], "grid": source.get("grid"),
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

    def prior(self, pool: Pool, pools: Iterable[Pool], records: Iterable[TrialRecord], namespace: str,
              fleet: bool) -> FleetPrior:
        """``pool``'s prior from the run's other ``pools`` (their ``records``) and, with the
        fleet's memory on (``fleet``), the earlier runs."""
        assert pool.space is not None
        return fleet_prior(pool, peers_of(pool, pools, records, fleet), self.runs if fleet else [], namespace,
                           in_space(pool.space))

    def accept(self, kernel: str, runs: Sequence[StoredRun], problems: Sequence[str], mono: float) -> list[str]:
        """The stores as just read; returns the problems not said before."""
        new = [p for p in problems if p not in self.problems]
        self.kernel, self.runs, self.read_at = kernel, list(runs), mono
        self.problems += new
        return new


@dataclass(frozen=True)
class FleetPrior:
    """What a pool's prior took from the fleet: the run's other pools of its size, and
    earlier runs of its kernel, each with its results in the pool's space."""

    observations: list[Observation]
    sources: list[tuple[PriorKind, str, int]]  # (kind "Pool" or "Run", name, results in the pool's space), most first
    peer_records: int  # the other pools' records it was built from (`outgrown`)
    first: list[dict[str, Any]] = field(default_factory=list)  # what the pool measures first (`first_picks`)

    def summary(self, pool: str) -> str:
        named = ", ".join(f"{kind.lower()} {name} ({n})" for kind, name, n in self.sources[:MAX_NAMED])
        if len(self.sources) > MAX_NAMED:
            named += f" and {len(self.sources) - MAX_NAMED} more"
        return f"{pool}: starts from {len(self.observations)} results of the fleet in its space: {named}"


def is_peer(q: Pool, pool: Pool, fleet: bool) -> bool:
    """Whether ``q`` informs ``pool`` while both tune: its target's other problem sizes (the
    same GPUs; always), and with the fleet's memory on (``fleet``) another target's pool of
    its size."""
    if q.spec.name == pool.spec.name:
        return q.key != pool.key
    return fleet and q.problem_size == pool.problem_size


def peers_of(pool: Pool, pools: Iterable[Pool], records: Iterable[TrialRecord],
             fleet: bool) -> list[tuple[str, list[TrialRecord]]]:
    """The pools that inform ``pool`` (`is_peer`), with their current round's observations
    (the same kernel, measured now on other GPUs or at other sizes)."""
    return [(q.key, seen) for q in pools
            if is_peer(q, pool, fleet) and (seen := [r for r in q.records(records) if r.is_observation])]


def outgrown(pools: Sequence[Pool], records: Iterable[TrialRecord], fleet: bool) -> list[Pool]:
    """The unfinished pools with a study whose prior the pools that inform it have outgrown
    (`refresh_due`): each pool's observations counted once."""
    seen = {q.key: sum(r.is_observation for r in q.records(records)) for q in pools}
    return [p for p in pools if p.study is not None and not p.done and refresh_due(
        p.peer_records, sum(seen[q.key] for q in pools if is_peer(q, p, fleet)))]


def refresh_due(built_from: int, now: int) -> bool:
    """Whether a prior built from ``built_from`` of the other pools' results is rebuilt now
    that they have ``now``: a quarter more (two at least), so that a run rebuilds each study
    a few dozen times at most."""
    return now >= max(built_from + 2, 1.25 * built_from)


def fleet_prior(pool: Pool, peers: Sequence[tuple[str, list[TrialRecord]]], runs: Sequence[StoredRun],
                namespace: str, valid: Callable[[dict[str, Any]], bool]) -> FleetPrior:
    """The observations that ``valid`` keeps (the pool's space), relative to the best of their
    group (one other pool, or one earlier run's pool of one round and size): the run's other
    pools first, then earlier runs' groups of the pool's own GPU, then the newest."""
    Group = tuple[PriorKind, str, list[TrialRecord]]
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
    ordered: list[Group] = [("Pool", key, records) for key, records in peers]
    ordered += [("Run", labels[uid], records) for (uid, *_), records in ranked]
    observations: list[Observation] = []
    counts: dict[tuple[PriorKind, str], int] = {}
    own_groups: list[list[Observation]] = []
    other_groups: list[list[Observation]] = []
    for kind, name, records in ordered:
        if observations and len(observations) + len(records) > MAX_OBSERVATIONS:
            continue
        kept = relative_prior([[(r.config, r.outcome, r.objective) for r in records]], valid)
        if kept:
            observations += kept
            counts[kind, name] = counts.get((kind, name), 0) + len(kept)
            if not other_gpu(records):
                own_groups.append(kept)
            elif kind == "Run":  # a pool still tuning has not yet measured what is fast on it
                other_groups.append(kept)
    sources = sorted(((kind, name, n) for (kind, name), n in counts.items()), key=lambda s: (-s[2], s[0], s[1]))
    return FleetPrior(observations, sources, sum(len(records) for _, records in peers),
                      first_picks(own_groups, other_groups))


def first_picks(own: Sequence[Sequence[Observation]], other: Sequence[Sequence[Observation]]) -> list[dict[str, Any]]:
    """What a warm start measures first when earlier runs on three or more other GPUs
    inform it (``other``, one group each): the best of each group of the pool's own GPU
    (``own``: another size, an earlier run), then the other GPUs' consensus
    (`fleetprediction.ranked`) instead of each of their bests, which is often fast on that
    GPU only. Empty (the prior's fastest first) with fewer; the measurements behind the
    rule are in docs/decisions.md."""
    if len(other) < MIN_CONFIDENCE:
        return []
    bests = [best for group in own if (best := best_of(group)) is not None]
    consensus = ranked([[(config, objective if outcome == Outcome.OK else None) for config, outcome, objective in g]
                        for g in other])
    return [*bests, *consensus]
