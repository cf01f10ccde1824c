"""Priors: results a user already has (`spec.warmStart`: Kernel Tuner caches, T4 files in
ConfigMaps) as warm-start observations for the pools (pure; how a study uses them is
`fleettune.optimize.warm`'s).

Read once per spec generation; a missing ConfigMap or key is waited for (GitOps may apply
it after the run), a file that cannot be read is an error naming the field. Either is read
again every WARM_RECHECK_S until it is right.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleettune.api import WarmStartSpec
from fleettune.controller.pool import Observation
from fleettune.space import SpaceError
from fleettune.space.kernel_tuner import parse_kernel_tuner_cache
from fleettune.space.records import RecordedSpace
from fleettune.space.t4 import parse_t4
from fleettune_job.protocol import Outcome

WARM_RECHECK_S = 15.0
_FAILURES = {"compile": Outcome.COMPILE_ERROR, "runtime": Outcome.RUNTIME_ERROR}


class WarmStartMissing(LookupError):
    """A ConfigMap or key `spec.warmStart` names does not exist (yet)."""


@dataclass(frozen=True)
class WarmSource:
    targets: frozenset[str] | None  # None: every target
    observations: list[Observation]

    def applies_to(self, target: str) -> bool:
        return self.targets is None or target in self.targets


def observations(recorded: RecordedSpace) -> list[Observation]:
    """A recorded space's measurements; configurations it marks invalid (constraints) are left out."""
    out: list[Observation] = []
    for rec in recorded.records:
        if rec.failure is None and rec.time_ms is not None:
            out.append((rec.config, Outcome.OK, rec.time_ms))
        elif rec.failure in _FAILURES:
            out.append((rec.config, _FAILURES[rec.failure], None))
    return out


def read_sources(specs: Sequence[WarmStartSpec], data: Sequence[Mapping[str, str] | None]) -> list[WarmSource]:
    """`data[i]`: the data of `specs[i]`'s ConfigMap (None: no such ConfigMap). Raises
    WarmStartMissing or ValueError, naming the field."""
    out = []
    for i, (spec, cm) in enumerate(zip(specs, data, strict=True)):
        where = f"spec.warmStart[{i}]"
        if cm is None:
            raise WarmStartMissing(f"{where}.configMap: ConfigMap {spec.config_map!r} not found")
        if spec.key not in cm:
            raise WarmStartMissing(f"{where}.key: ConfigMap {spec.config_map!r} has no key {spec.key!r}")
        parse = parse_kernel_tuner_cache if spec.format == "kernel-tuner" else parse_t4
        try:
            recorded = parse(cm[spec.key], f"{where} ({spec.config_map}/{spec.key})")
        except (SpaceError, ValueError) as exc:
            raise ValueError(f"{where}: not a readable {spec.format} file: {exc}") from None
        found = observations(recorded)
        if not any(outcome == Outcome.OK for _, outcome, _ in found):
            raise ValueError(f"{where}: {spec.config_map}/{spec.key} holds no measured configuration")
        out.append(WarmSource(frozenset(spec.targets) if spec.targets else None, found))
    return out


class WarmStarts:
    """The run's `spec.warmStart` files as last read."""

    def __init__(self) -> None:
        self.sources: list[WarmSource] | None = None  # None: not read yet, or not readable
        self.problem: tuple[str, str] | None = None  # (reason, message) while they cannot be read
        self.read_at = -WARM_RECHECK_S

    def reset(self) -> None:
        """A new spec generation: read them again."""
        self.sources, self.problem, self.read_at = None, None, -WARM_RECHECK_S

    def due(self, specs: Sequence[WarmStartSpec] | None, mono: float) -> bool:
        return bool(specs) and self.sources is None and mono - self.read_at >= WARM_RECHECK_S

    def read(self, specs: Sequence[WarmStartSpec], data: Sequence[Mapping[str, str] | None], mono: float) -> None:
        self.read_at = mono
        try:
            self.sources, self.problem = read_sources(specs, data), None
        except WarmStartMissing as exc:
            self.problem = ("SourceNotFound", str(exc))
        except ValueError as exc:
            self.problem = ("InvalidSpec", str(exc))

    def waiting(self, specs: Sequence[WarmStartSpec] | None) -> tuple[str, str] | None:
        """(reason, message) while the run waits for them: SourceNotFound (a ConfigMap or key
        missing: GitOps may apply it after the run) or InvalidSpec (not readable)."""
        if not specs or self.sources is not None:
            return None
        return self.problem or ("SourceNotFound", "reading spec.warmStart")

    def for_target(self, target: str) -> list[list[Observation]]:
        return [w.observations for w in self.sources or [] if w.applies_to(target)]
