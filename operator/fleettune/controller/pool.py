"""One target pool's search state, and the pure decisions about it.

A run that tunes several problem sizes has one Pool per (target, size), keyed
``target.size``: the sizes of a target tune one after another, each warm-started from
the results of the sizes before it (the landscape of a kernel moves little with the
problem size, and its compile and resource failures not at all).

A pool tunes in *rounds*. Round 1 starts with the run; a new round starts when the
pool's GPU fingerprint changes (driver upgrade, with `retunePolicy: OnDriverChange`),
when a re-tune is requested, or when the search space changes. A new round is
warm-started from the observations of the older ones, and its Jobs are pinned to the
driver it is tuned for.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleettune.api import TargetSpec, TuningRunSpec
from fleettune.fingerprint import NodeFingerprint, PoolFingerprint, pool_fingerprint
from fleettune.results import TrialRecord

PRODUCT_LABELS = ("nvidia.com/gpu.product", "fleettune.dev/gpu.product")

Node = tuple[Mapping[str, str], bool]  # (labels, unschedulable)


class SpecError(ValueError):
    """A spec the API server accepted but the operator cannot run; names the field."""


@dataclass
class Pool:
    spec: TargetSpec
    seed: int
    key: str = ""  # the records' and Jobs' target label: spec.name, or spec.name.<size>
    problem_size: tuple[int, ...] = ()
    after: tuple[str, ...] = ()  # keys of the same target's sizes that tune first
    phase: str = "Pending"
    message: str = ""
    device: str = ""
    round: int = 1
    round_started: float | None = None  # epoch seconds
    tuned_for: NodeFingerprint | None = None
    current: PoolFingerprint | None = None
    stale: str | None = None
    prior_dropped: bool = False  # the study stopped using the warm-start data (said once in the message)
    space: Any = None
    study: Any = None
    space_size: int | None = None
    default_key: str | None = None
    default_config: dict[str, Any] | None = None
    observed: set[int] = field(default_factory=set)
    next_check: float = 0.0

    @property
    def done(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def __post_init__(self) -> None:
        self.key = self.key or self.spec.name

    def records(self, records: Iterable[TrialRecord], *, all_rounds: bool = False) -> list[TrialRecord]:
        return [r for r in records if r.target == self.key and (all_rounds or r.generation == self.round)]


def space_hash(spec: TuningRunSpec) -> str:
    """What makes results comparable: a change starts a new round on every pool."""
    doc = {
        "kernel": spec.kernel.dump(),
        "parameters": [p.dump() for p in spec.parameters],
        "constraints": list(spec.constraints),
        "objective": spec.objective.dump(),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def matching_nodes(nodes: Mapping[str, Node], target: TargetSpec) -> list[Node] | None:
    """The target's nodes by its node selector; None when it selects by affinity only
    (which the operator does not evaluate: the scheduler does)."""
    if not target.node_selector:
        return None
    want = target.node_selector.items()
    return [(labels, cordoned) for labels, cordoned in nodes.values() if all(labels.get(k) == v for k, v in want)]


def current_fingerprint(nodes: list[Node] | None, target: TargetSpec) -> PoolFingerprint | None:
    return pool_fingerprint(nodes, allow_shared=target.allow_shared_gpus) if nodes else None


def product_of(pool: Pool, nodes: list[Node] | None) -> str | None:
    if pool.spec.device:
        return pool.spec.device
    if pool.current is not None and pool.current.fingerprint.product:
        return pool.current.fingerprint.product
    for labels, _ in nodes or []:
        for key in PRODUCT_LABELS:
            if labels.get(key):
                return labels[key]
    return None


def check_options(spec: TuningRunSpec) -> None:
    """Strategy options against the strategy's own defaults: known keys, same types, sane values."""
    from fleettune.optimize import strategy_options

    name = spec.strategy.name
    defaults, off = strategy_options(name)
    for key, value in (spec.strategy.options or {}).items():
        where = f"spec.strategy.options.{key}"
        if key not in defaults:
            known = ", ".join(sorted(defaults)) or "none"
            raise SpecError(f"{where}: not an option of strategy {name!r} (options: {known})")
        default = defaults[key]
        if isinstance(default, str):
            ok, want = isinstance(value, str) and bool(value), "a non-empty string"
        elif isinstance(default, int) and not isinstance(default, bool):
            low = 0 if key in off else 1
            ok, want = isinstance(value, int) and not isinstance(value, bool) and value >= low, f"an integer >= {low}"
        else:  # floats, and options whose default is "automatic" (None)
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
            want = "a positive number"
        if not ok:
            raise SpecError(f"{where}: expected {want}, got {value!r}")


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


def warm_start_prior(pool: Pool, records: Iterable[TrialRecord]) -> list[tuple[dict[str, Any], Any, float | None]]:
    """Observations that exist in the pool's current space from its own older rounds and,
    in this round, from the sizes of its target that tuned before it.

    Times are divided by the best of their (size, round): older drivers and other sizes
    run at other speeds, and only how much slower than the best a configuration is
    carries over."""
    from fleettune.space import SpaceError

    earlier = set(pool.after)
    groups: dict[tuple[str, int], list[TrialRecord]] = {}
    for rec in records:
        older_round = rec.target == pool.key and rec.generation < pool.round
        earlier_size = rec.target in earlier and rec.generation == pool.round
        if (older_round or earlier_size) and rec.is_observation:
            groups.setdefault((rec.target, rec.generation), []).append(rec)
    prior = []
    for group in groups.values():
        best = min((r.objective for r in group if r.objective), default=None)
        for rec in group:
            try:
                row = pool.space.to_rows([rec.config])
            except SpaceError:
                continue  # the space changed under it
            if bool(pool.space.is_valid(row)[0]):
                value = rec.objective / best if rec.objective and best else rec.objective
                prior.append((rec.config, rec.outcome, value))
    return prior


def compute_capability(pool: Pool) -> str | None:
    """The pool's GPU architecture: from its nodes' labels, else from the device catalog."""
    if pool.current is not None and pool.current.fingerprint.compute_capability:
        return pool.current.fingerprint.compute_capability
    from fleettune.space import SpaceError, lookup_device

    try:
        return lookup_device(pool.device).cc if pool.device and pool.device != "unknown" else None
    except SpaceError:
        return None


def make_study(spec: TuningRunSpec, pool: Pool, records: Iterable[TrialRecord]) -> None:
    from fleettune.optimize import Study

    prior = warm_start_prior(pool, records)
    pool.study = Study(
        pool.space, strategy=spec.strategy.name, seed=pool.seed + 104_729 * (pool.round - 1),
        options=spec.strategy.options, prior=prior,
    )
    pool.observed = set()
