"""One target pool's search state, and the pure decisions about it.

A run that tunes several problem sizes has one Pool per (target, size), keyed
``target.size``: the sizes of a target tune side by side, sharing the target's Pods,
each with the others' results as its prior as they arrive (`controller.memory`: the
landscape of a kernel moves little with the problem size, and its compile and resource
failures not at all).

A pool tunes in *rounds*. Round 1 starts with the run; a new round starts when the
pool's GPU fingerprint changes (driver upgrade, with `retunePolicy: OnDriverChange`),
when a re-tune is requested, or when the search space changes. A new round is
warm-started from the observations of the older ones, and its Jobs are pinned to the
driver it is tuned for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fleettune.api import PriorKind, TargetSpec, TargetStatus, TuningRunSpec
from fleettune.controller.lifecycle import PoolPhase
from fleettune.controller.spec import SpecError
from fleettune.fingerprint import GpuFingerprint, PoolFingerprint
from fleettune.results import Records, TrialRecord
from fleettune_job.protocol import Outcome

if TYPE_CHECKING:  # the optimiser stack is heavy: loaded when a pool first builds its search
    from fleettune.optimize import Study
    from fleettune.space import SearchSpace


def iso_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


def _epoch(iso: str | None) -> float | None:
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else None
    except ValueError:
        return None


@dataclass
class Pool:
    spec: TargetSpec
    seed: int
    key: str = ""  # the records' and Jobs' target label: spec.name, or spec.name.<size>
    problem_size: tuple[int, ...] = ()
    phase: PoolPhase = PoolPhase.PENDING
    message: str = ""
    device: str = ""
    round: int = 1
    round_started: float | None = None  # epoch seconds
    tuned_for: GpuFingerprint | None = None
    current: PoolFingerprint | None = None
    stale: str | None = None
    prior_dropped: bool = False  # the study stopped using the warm-start data (said once in the message)
    space: SearchSpace | None = None
    study: Study | None = None
    space_size: int | None = None
    default_key: str | None = None
    default_config: dict[str, Any] | None = None
    observed: set[int] = field(default_factory=set)
    trials_per_pod: int = 1  # of the pool's latest trial Pod
    requeue: list[dict[str, Any]] = field(default_factory=list)  # `hand_back`: measured first
    index_floor: int = 0  # `hand_back`: the pool's next trial index is at least this
    nodes_missing_since: float | None = None  # epoch seconds: none of its nodes exists (scaled to zero)
    # budget.stopWhenPredicted: the fleet's confident prediction its round's first Pods
    # measure, (key, configuration); kept in memory only (a restart tunes the round on).
    predicted: tuple[str, dict[str, Any]] | None = None
    # What its prior holds of the fleet (`controller.memory`): (kind, name, results in its space),
    # and how many of the run's other pools' records it was built from.
    learned_from: list[tuple[PriorKind, str, int]] = field(default_factory=list)
    peer_records: int = 0
    prior_weight: float | None = None  # its study's (`Study.prior_weight`), as last reported

    @property
    def done(self) -> bool:
        return self.phase.done

    def move(self, phase: PoolPhase, message: str = "") -> None:
        """Change phase (only along the lifecycle's transitions) and say why."""
        self.phase, self.message = self.phase.to(phase), message

    def __post_init__(self) -> None:
        self.key = self.key or self.spec.name

    def restore(self, old: TargetStatus | None, records: Iterable[TrialRecord]) -> None:
        """After a restart: the round from the records and the last status, and from the
        status the fingerprint tuned for, staleness, a finished phase and the round's start."""
        rounds = [r.round for r in self.records(records, all_rounds=True)]
        self.round = max([old.round if old else 1, *rounds])
        if old is None:
            return
        if old.tuned_for is not None:
            self.tuned_for = GpuFingerprint.from_status(old.tuned_for)
        self.stale = old.stale
        self.learned_from = [(p.kind, p.name, p.results) for p in old.learned_from]
        self.prior_weight = old.prior_weight
        if old.phase in (PoolPhase.SUCCEEDED, PoolPhase.FAILED):
            self.phase, self.message = PoolPhase(old.phase), old.message
        self.round_started = _epoch(old.round_started_at)

    def hand_back(self, entries: Iterable[tuple[int, dict[str, Any]]]) -> None:
        """Take back the entries (index, configuration) of a Job deleted before it measured
        them (preempted, stalled, withdrawn): measured first, in a Job whose first index is
        above theirs, so never one named like the deleted Job, which may still be going."""
        for index, config in entries:
            self.requeue.append(config)
            self.index_floor = max(self.index_floor, index + 1)

    def records(self, records: Iterable[TrialRecord], *, all_rounds: bool = False) -> list[TrialRecord]:
        """The pool's records (this round's, or all rounds') among ``records``: found by
        target when they are `Records`, else by a scan."""
        mine = records.of(self.key) if isinstance(records, Records) else (r for r in records if r.target == self.key)
        return [r for r in mine if all_rounds or r.round == self.round]


def build_search(spec: TuningRunSpec, pool: Pool, product: str | None, where: str) -> None:
    """Build the pool's search space for its device (raises SpecError naming the field).

    `where` is the target's path (spec.targets[i]) for errors about its device."""
    from fleettune.space import SearchSpace, SpaceError, lookup_device

    pool.device = product or "unknown"
    device = None
    if product:
        try:
            device = lookup_device(product)
        except SpaceError as exc:
            if pool.spec.device:
                raise SpecError(f"{where}.device: {exc.message}") from None
            # A GPU the catalog does not know: tune without device limits (constraints
            # that use device.* then fail naming themselves).
            device = None
    params = [p.dump() for p in spec.parameters]
    try:
        space = SearchSpace.from_spec(params, list(spec.constraints), device)
        size = space.count()
    except SpaceError as exc:
        raise SpecError(f"spec.{exc}") from None
    if size == 0:
        raise SpecError(f"spec.constraints: no configuration satisfies the constraints on {pool.device}")
    pool.default_key = pool.default_config = None
    default = spec.kernel.default_config
    if default is not None:
        try:
            row = space.to_rows([default])
        except SpaceError as exc:
            raise SpecError(f"spec.kernel.defaultConfig: {exc}") from None
        if not bool(space.is_valid(row)[0]):
            raise SpecError(f"spec.kernel.defaultConfig: violates the constraints on {pool.device}")
        pool.default_key, pool.default_config = space.key(default), default
    pool.space, pool.space_size = space, size


Observation = tuple[dict[str, Any], Outcome, float | None]  # (config, outcome, objective)


def warm_start_prior(pool: Pool, records: Iterable[TrialRecord],
                     external: Sequence[Sequence[Observation]] = ()) -> list[Observation]:
    """Observations that exist in the pool's current space from its own older rounds, and
    from `external` groups (results the user already had: `spec.warmStart`). The other sizes
    and pools of this round inform it through `controller.memory`.

    Times are divided by the best of their group (round, or file): older drivers and other
    GPUs run at other speeds, and only how much slower than the best a configuration is
    carries over."""
    if pool.space is None:
        return []
    return relative_prior([*older_rounds(pool, records), *external], in_space(pool.space))


def older_rounds(pool: Pool, records: Iterable[TrialRecord]) -> list[list[Observation]]:
    """The pool's observations of each of its older rounds, oldest round first."""
    groups: dict[int, list[Observation]] = {}
    for rec in records:
        if rec.target == pool.key and rec.round < pool.round and rec.is_observation:
            groups.setdefault(rec.round, []).append((rec.config, rec.outcome, rec.objective))
    return [groups[r] for r in sorted(groups)]


def best_of(group: Sequence[Observation]) -> dict[str, Any] | None:
    """The fastest configuration of ``group`` (None where none ran)."""
    ran = [(objective, i) for i, (_, outcome, objective) in enumerate(group) if outcome == Outcome.OK and objective]
    return group[min(ran)[1]][0] if ran else None


def in_space(space: SearchSpace) -> Callable[[dict[str, Any]], bool]:
    """Whether a configuration is a valid one of ``space``."""
    from fleettune.space import SpaceError

    def valid(config: dict[str, Any]) -> bool:
        try:
            return bool(space.is_valid(space.to_rows([config]))[0])
        except SpaceError:
            return False  # another space: the space changed, or a file's parameters differ

    return valid


def relative_prior(groups: Iterable[Sequence[Observation]], valid: Callable[[dict[str, Any]], bool]
                   ) -> list[Observation]:
    """The observations of ``groups`` that ``valid`` keeps, each time divided by the best of
    its group (see `warm_start_prior`)."""
    prior: list[Observation] = []
    for group in groups:
        best = min((objective for _, _, objective in group if objective), default=None)
        prior.extend((config, outcome, objective / best if objective and best else objective)
                     for config, outcome, objective in group if valid(config))
    return prior


def make_study(spec: TuningRunSpec, pool: Pool, records: Iterable[TrialRecord],
               external: Sequence[Sequence[Observation]] = (), relative: Sequence[Observation] = (),
               first: Sequence[dict[str, Any]] = ()) -> None:
    """The pool's Study, warm-started from `warm_start_prior` and ``relative`` (observations
    already in the pool's space, times relative to their group's best: `controller.memory`),
    measuring ``first`` first (`memory.first_picks`), after its own older rounds' bests."""
    from fleettune.optimize import Study

    assert pool.space is not None, "build_search first"
    prior = [*warm_start_prior(pool, records, external), *relative]
    if first:  # the pool's own GPU first: its older rounds' bests, the newest first
        bests = [best for group in reversed(older_rounds(pool, records)) if (best := best_of(group)) is not None]
        first = [*bests, *first]
    pool.study = Study(
        pool.space, strategy=spec.strategy.name, seed=pool.seed + 104_729 * (pool.round - 1),
        options=spec.strategy.options, prior=prior, prior_first=first,
    )
    pool.observed = set()
