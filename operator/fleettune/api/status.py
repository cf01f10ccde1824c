"""The TuningRun's status: bounded counters, the best configurations and the fingerprint
of each pool, predictions, and conditions."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from fleettune.api.base import MAX_PREDICTIONS, MAX_TUNED_TARGETS, Model

Phase = Literal["Pending", "Running", "Succeeded", "Failed"]
TargetPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unschedulable"]


class Condition(Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class Fingerprint(Model):
    """The device the pool's latest trials reported running on (the driver's product name)."""

    product: str = ""
    compute_capability: str = ""
    driver_version: str = ""
    cuda_runtime_version: str = ""
    simulated: bool = False
    synthetic: bool = False


class TunedFor(Model):
    """The GPU fingerprint (from node labels) a pool's current round is tuned for."""

    # The status form of `fleettune.fingerprint.GpuFingerprint` (its to_status/from_status);
    # also each published entry's "fingerprint". All optional: unset fields are left out.

    product: str | None = None
    compute_capability: str | None = None
    driver_version: str | None = None
    cuda_runtime_version: str | None = None
    mig_profile: str | None = None
    sharing: str | None = None
    replicas: int | None = None
    arch: str | None = None
    l4t_version: str | None = Field(default=None, alias="l4tVersion")
    family: str | None = None
    memory_mib: int | None = None
    source: str | None = None


class ConfigResult(Model):
    config: dict[str, Any]
    objective_ms: float
    trial: int


class RankedConfig(Model):
    """One of the best configurations, on one line (`kubectl describe` stays short)."""

    config: str = Field(description="The configuration as name=value pairs.")
    objective_ms: float
    trial: int


class TrialCounts(Model):
    completed: int = 0
    valid: int = 0
    invalid: int = 0
    infra_failed: int = 0
    running: int = 0


class TargetStatus(TrialCounts):
    name: str = Field(description="The target, or target.size when the run tunes several problem sizes.")
    target: str | None = Field(default=None, description="The target's name, when `name` is one size of it.")
    problem_size: list[int] | None = None
    phase: TargetPhase = "Pending"
    budget: int = 0
    space_size: int | None = Field(
        default=None, description="Valid configurations on this pool's GPU (at most 2^63-1 is shown)."
    )
    device: str = ""
    fingerprint: Fingerprint | None = None
    best: ConfigResult | None = None
    top: list[RankedConfig] = Field(
        default_factory=list, max_length=5, description="The best configurations, best first (`best` in full)."
    )
    round: int = Field(default=1, description="Tuning round; a driver change or a retune request starts the next.")
    round_started_at: str | None = None
    tuned_for: TunedFor | None = None
    stale: str | None = Field(default=None, description="What changed since the round started (old → new).")
    default_ms: float | None = None
    speedup: float | None = Field(default=None, description="Default configuration's time / best time.")
    message: str = ""


class Prediction(Model):
    """A recommended configuration for a problem size that was never tuned."""

    target: str
    problem_size: list[int]
    config: dict[str, Any] | None = None
    predicted_ms: float | None = None
    basis: str = ""


class ResultsRef(Model):
    config_map_prefix: str
    shards: int = 0
    records: int = 0


class TuningRunStatus(Model):
    phase: Phase = "Pending"
    observed_generation: int | None = None
    progress: str = Field(default="", description="Trials recorded / budget, for `kubectl get`.")
    best_summary: str = Field(default="", description="Best time per pool in short form, for `kubectl get`.")
    trials: TrialCounts = Field(default_factory=TrialCounts)
    targets: list[TargetStatus] = Field(default_factory=list, max_length=MAX_TUNED_TARGETS)
    predictions: list[Prediction] = Field(default_factory=list, max_length=MAX_PREDICTIONS)
    results: ResultsRef | None = None
    space_hash: str | None = Field(default=None, description="Hash of kernel, parameters, constraints, objective.")
    source_digest: str | None = Field(
        default=None, description="SHA-256 of the user kernel's source that the current rounds measure."
    )
    last_handled_retune_at: str | None = Field(
        default=None, description="The fleettune.dev/retune-requested-at token last acted on."
    )
    published: str | None = Field(default=None, description="ConfigMap holding the published best configurations.")
    conditions: list[Condition] = Field(default_factory=list, max_length=16)
    started_at: str | None = None
    completed_at: str | None = None
