"""The TuningRun's status: bounded counters, the best configurations and the fingerprint
of each pool, predictions, and conditions."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic.json_schema import JsonDict

from fleettune.api.base import MAX_PREDICTIONS, MAX_TUNED_TARGETS, Model

Phase = Literal["Pending", "Running", "Succeeded", "Failed"]
TargetPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unschedulable"]
DATE_TIME: JsonDict = {"format": "date-time"}  # RFC 3339, as Kubernetes writes times


class Condition(Model):
    """One aspect of the run's state (Kubernetes' metav1.Condition; kstatus, Flux and Argo CD
    read Ready, Reconciling and Stalled)."""

    type: str = Field(
        description="Ready, Reconciling, Stalled, Progressing, Degraded, Stale, Published or QueueDelayed (one "
        "entry each)."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="Why, in CamelCase (e.g. Tuning, Tuned, InvalidSpec, Forbidden).")
    message: str = Field(default="", description="Why, for people.")
    last_transition_time: str | None = Field(
        default=None, json_schema_extra=DATE_TIME, description="When the status last changed."
    )
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation of the spec this condition was computed from."
    )


class Fingerprint(Model):
    """The device the pool's latest trials reported running on (the driver's product name)."""

    product: str = Field(default="", description="The GPU's product name, as its driver reports it.")
    compute_capability: str = Field(default="", description="The GPU's compute capability (e.g. 8.0).")
    driver_version: str = Field(default="", description="The NVIDIA driver's version.")
    cuda_runtime_version: str = Field(default="", description="The CUDA runtime's version in the job image.")
    simulated: bool = Field(default=False, description="Timed by the fleet simulator, not on a GPU.")
    synthetic: bool = Field(
        default=False, description="Simulated from a model of the device rather than from a recording."
    )
    unverified: bool = Field(
        default=False, description="The best configuration's outputs were never compared with the reference "
        "(the fleet simulator cannot compute them): it may be a wrong one."
    )


PriorKind = Literal["Pool", "Run"]


class PriorSource(Model):
    """Results a pool's search starts from: another pool of the run, or an earlier run of the same kernel."""

    kind: PriorKind = Field(description="Pool: another pool of this run, as it measures (another target at "
                                         "the same problem size, or this target at another size); Run: an earlier "
                                         "run of the same kernel.")
    name: str = Field(description="The pool, or the run (namespace/name when in another namespace).")
    results: int = Field(description="Its results that fall in this pool's search space.")


class TunedFor(Model):
    """The GPU fingerprint (from node labels) a pool's current round is tuned for."""

    # The status form of `fleettune.fingerprint.GpuFingerprint` (its to_status/from_status);
    # also each published entry's "fingerprint". All optional: unset fields are left out.

    product: str | None = Field(default=None, description="GPU product (node label nvidia.com/gpu.product).")
    compute_capability: str | None = Field(default=None, description="Compute capability (e.g. 8.0).")
    driver_version: str | None = Field(default=None, description="NVIDIA driver version.")
    cuda_runtime_version: str | None = Field(default=None, description="CUDA version.")
    mig_profile: str | None = Field(default=None, description="MIG profile of the GPU slice, if partitioned.")
    sharing: str | None = Field(default=None, description="GPU sharing strategy (time-slicing, MPS), if any.")
    replicas: int | None = Field(default=None, description="Shared replicas per GPU, if shared.")
    arch: str | None = Field(default=None, description="CPU architecture of the nodes (kubernetes.io/arch).")
    l4t_version: str | None = Field(default=None, alias="l4tVersion", description="Jetson Linux (L4T) version.")
    family: str | None = Field(default=None, description="GPU family (e.g. ampere).")
    memory_mib: int | None = Field(default=None, description="GPU memory in MiB.")
    source: str | None = Field(
        default=None, description="Whose node labels it was read from (gfd, fleettune), or device (a trial's report)."
    )


class ConfigResult(Model):
    config: dict[str, Any] = Field(description="The configuration: a value per parameter.")
    objective_ms: float = Field(description="Its kernel time in milliseconds (median of repeats).")
    trial: int = Field(description="The trial that measured it.")


class RankedConfig(Model):
    """One of the best configurations, on one line (`kubectl describe` stays short)."""

    config: str = Field(description="The configuration as name=value pairs.")
    objective_ms: float = Field(description="Its kernel time in milliseconds.")
    trial: int = Field(description="The trial that measured it.")


class TrialCounts(Model):
    completed: int = Field(default=0, description="Trials recorded with a verdict on their configuration.")
    valid: int = Field(default=0, description="Configurations that compiled, verified and were timed.")
    invalid: int = Field(
        default=0, description="Configurations that failed (compile, launch, verification, timeout)."
    )
    infra_failed: int = Field(default=0, description="Trials lost to the infrastructure (not counted as completed).")
    running: int = Field(default=0, description="Trials (configurations) being measured now.")
    queued: int = Field(
        default=0, description="Trials (configurations) whose Jobs wait for admission by their Kueue queue."
    )
    pending: int = Field(
        default=0, description="Trials (configurations) whose Pods wait to start (Pending: no node or GPU free yet)."
    )


class TargetStatus(TrialCounts):
    name: str = Field(description="The target, or target.size when the run tunes several problem sizes.")
    target: str | None = Field(default=None, description="The target's name, when `name` is one size of it.")
    problem_size: list[int] | None = Field(default=None, description="The problem size tuned, when several are.")
    phase: TargetPhase = Field(default="Pending", description="Pending, Running, Succeeded, Failed or Unschedulable.")
    budget: int = Field(default=0, description="Trials this pool may run (budget.trialsPerTarget).")
    pods_running: int = Field(default=0, description="Trial Pods (Jobs) running now; each measures trialsPerPod.")
    pods_queued: int = Field(default=0, description="Trial Jobs waiting for admission by their Kueue queue.")
    pods_pending: int = Field(default=0, description="Trial Pods created (and admitted) that have not started yet.")
    queued_since: str | None = Field(
        default=None, json_schema_extra=DATE_TIME, description="Since when the longest-waiting of them waits."
    )
    trials_per_pod: int | None = Field(
        default=None, description="Configurations per trial Pod the pool aims at (budget.trialsPerPod, or the "
        "size chosen from its first measurements); with a fixed size, a target's first Pods take fewer, ramping up "
        "as results arrive."
    )
    space_size: int | None = Field(
        default=None, description="Valid configurations on this pool's GPU (at most 2^63-1 is shown)."
    )
    device: str = Field(default="", description="The GPU whose limits the constraints were checked against.")
    fingerprint: Fingerprint | None = Field(default=None, description="The device the latest trials ran on.")
    best: ConfigResult | None = Field(default=None, description="The best configuration so far.")
    top: list[RankedConfig] = Field(
        default_factory=list, max_length=5, description="The best configurations, best first (`best` in full)."
    )
    round: int = Field(default=1, description="Tuning round; a driver change or a retune request starts the next.")
    round_started_at: str | None = Field(
        default=None, json_schema_extra=DATE_TIME, description="When the current round started."
    )
    tuned_for: TunedFor | None = Field(default=None, description="The GPU fingerprint the current round tunes for.")
    stale: str | None = Field(default=None, description="What changed since the round started (old → new).")
    default_ms: float | None = Field(default=None, description="The default configuration's time in milliseconds.")
    speedup: float | None = Field(default=None, description="Default configuration's time / best time.")
    message: str = Field(default="", description="What the pool is doing or waiting for, or why it failed.")
    learned_from: list[PriorSource] = Field(
        default_factory=list, max_length=8,
        description="What the pool's search starts from: the run's other pools of its size and its target's "
        "other sizes (refreshed as they measure) and earlier runs of the same kernel, most results first.",
    )
    prior_weight: float | None = Field(
        default=None, description="How much the pool's model uses the results it starts from now, 0 to 1 (earned "
        "from how well they agree with its own; 0: dropped).",
    )


class Prediction(Model):
    """A recommended configuration for a problem size that was never tuned (source sizes),
    or for a pool that has no valid result of its own yet (source gpus)."""

    target: str = Field(description="The target it is recommended for.")
    problem_size: list[int] = Field(
        description="The problem size: one of spec.predictFor (source sizes), or the pool's own (source gpus)."
    )
    source: Literal["sizes", "gpus"] = Field(
        default="sizes",
        description="sizes: from the target's tuned sizes (spec.predictFor). gpus: from the other targets' results "
        "at the same size, for a pool with no valid result yet (removed once it has one); the consensus of two or "
        "more GPUs, else the best of the one.",
    )
    config: dict[str, Any] | None = Field(default=None, description="The recommended configuration.")
    predicted_ms: float | None = Field(
        default=None, description="Its predicted time in milliseconds (source sizes; another GPU's time is not "
        "this one's)."
    )
    expected_fraction: float | None = Field(
        default=None, description="Source gpus, with three or more other GPUs: the mean fraction of a GPU's own "
        "optimum (best time / time) that the rule reached on each of them when it was left out."
    )
    expected_fraction_range: list[float] | None = Field(
        default=None, min_length=2, max_length=2,
        description="The lowest and highest of those fractions, [low, high].",
    )
    basis: str = Field(default="", description="What the prediction rests on.")


class ResultsRef(Model):
    config_map_prefix: str = Field(description="Prefix of the ConfigMaps that hold every trial's record.")
    shards: int = Field(default=0, description="How many there are.")
    records: int = Field(default=0, description="How many records they hold.")


class TuningRunStatus(Model):
    phase: Phase = Field(default="Pending", description="Pending, Running, Succeeded or Failed.")
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation of the spec this status was computed from."
    )
    progress: str = Field(default="", description="Trials recorded / budget, for `kubectl get`.")
    best_summary: str = Field(default="", description="Best time per pool in short form, for `kubectl get`.")
    trials: TrialCounts = Field(default_factory=TrialCounts, description="Trials of every pool together.")
    targets: list[TargetStatus] = Field(
        default_factory=list, max_length=MAX_TUNED_TARGETS,
        description="Each target pool (each of its problem sizes, when several are tuned).",
    )
    # Those of spec.predictFor, and at most one per pool (source gpus).
    predictions: list[Prediction] = Field(
        default_factory=list, max_length=MAX_PREDICTIONS + MAX_TUNED_TARGETS,
        description="A recommended configuration per target for each size of spec.predictFor, and per pool that "
        "has no valid result yet, from the other targets (source gpus).",
    )
    results: ResultsRef | None = Field(default=None, description="Where every trial's record is kept.")
    space_hash: str | None = Field(default=None, description="Hash of kernel, parameters, constraints, objective.")
    source_digest: str | None = Field(
        default=None, description="SHA-256 of the user kernel's source that the current rounds measure."
    )
    last_handled_retune_at: str | None = Field(
        default=None, description="The fleettune.dev/retune-requested-at token last acted on."
    )
    published: str | None = Field(default=None, description="ConfigMap holding the published best configurations.")
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="The run's conditions, one per type.",
    )
    started_at: str | None = Field(default=None, json_schema_extra=DATE_TIME, description="When tuning started.")
    completed_at: str | None = Field(
        default=None, json_schema_extra=DATE_TIME, description="When the run finished (Succeeded or Failed)."
    )
