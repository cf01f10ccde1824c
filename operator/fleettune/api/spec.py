"""The TuningRun's spec: what to tune, over which parameters, on which node pools."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints, WithJsonSchema

from fleettune.api import kubernetes
from fleettune.api.base import CEL, DNS_LABEL, DNS_SUBDOMAIN, MAX_PREDICTIONS, MAX_TUNED_TARGETS, Model
from fleettune.api.kernelsource import IDENTIFIER, SourceRef, TritonSourceRef
from fleettune.api.reuse import FleetMemorySpec, PublishSpec, WarmStartSpec
from fleettune_job.protocol import MAX_BATCH, PRUNE_RUNS

ParameterType = Literal["integer", "ordinal", "real", "categorical", "boolean", "permutation"]
StrategyName = Literal["bayes", "random", "genetic"]
RetunePolicy = Literal["Manual", "OnDriverChange"]
Dimension = Annotated[int, Field(ge=1, le=2**31 - 1)]
# A problem size as the spec writes it (in code: `fleettune.sizes.ProblemSize`, a tuple).
ProblemSizeSpec = Annotated[list[Dimension], Field(min_length=1, max_length=3)]
MAX_PROBLEM_SIZES = 8

# Kubernetes types kept as plain dicts in code (the operator hands them to the Pod as they
# are), with their real schemas in the CRD, so that the API server rejects a typo in them.
Affinity = Annotated[dict[str, Any], WithJsonSchema(kubernetes.AFFINITY)]
Toleration = Annotated[dict[str, Any], WithJsonSchema(kubernetes.TOLERATION)]
MAX_PULL_SECRETS = 16


class LocalObjectReference(Model):
    """An object of the run's namespace, by name."""

    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN, description="The object's name.")


class KernelSpec(Model):
    model_config = ConfigDict(json_schema_extra={CEL: [
        {"rule": "[has(self.builtin), has(self.source), has(self.triton)].filter(x, x).size() == 1",
         "message": "set exactly one of kernel.builtin, kernel.source or kernel.triton"},
        {"rule": "!(has(self.source) || has(self.triton)) || has(self.defaultConfig)",
         "message": "kernel.source and kernel.triton need kernel.defaultConfig: its outputs are the reference every "
                    "configuration is checked against", "fieldPath": ".defaultConfig"},
        {"rule": "!has(self.pruneSlowerThan) || self.pruneSlowerThan == 0.0 || self.pruneSlowerThan >= 1.0",
         "message": "kernel.pruneSlowerThan: 0 (off) or at least 1", "fieldPath": ".pruneSlowerThan"},
        {"rule": "has(self.problemSize) != has(self.problemSizes)",
         "message": "set exactly one of kernel.problemSize or kernel.problemSizes", "fieldPath": ".problemSize"},
        {"rule": "!has(self.problemSizes) || self.problemSizes.all(s, self.problemSizes.exists_one(t, t == s))",
         "message": "problem sizes must be unique", "fieldPath": ".problemSizes"},
    ]})

    builtin: str | None = Field(
        default=None, pattern=IDENTIFIER, max_length=63,
        description="A kernel shipped in the job image: convolution, gemm or scan.",
    )
    source: SourceRef | None = None
    triton: TritonSourceRef | None = None
    problem_size: ProblemSizeSpec | None = Field(default=None, description="Problem size, e.g. [4096, 4096].")
    problem_sizes: list[ProblemSizeSpec] | None = Field(
        default=None, min_length=1, max_length=MAX_PROBLEM_SIZES,
        description="Several problem sizes, each tuned on every target, side by side (a target's "
        "budget.parallelism shared among them, each learning from the others' results); budget.trialsPerTarget "
        "applies per size.",
    )
    default_config: dict[str, Any] | None = Field(
        default=None,
        description="The kernel's untuned configuration. It is measured first on every target and "
        "speed-ups are reported against it.",
    )
    warmups: int = Field(default=3, ge=0, le=1000, description="Untimed launches before timing each configuration.")
    repeats: int = Field(
        default=7, ge=1, le=1000, description="Timed launches per configuration; the objective is their median."
    )
    prune_slower_than: float = Field(
        default=2, ge=0, le=1000,  # an integer: Helm would re-render a float default as a string
        description=f"A configuration the median of whose first {PRUNE_RUNS} timed launches is more than this "
        "many times the target's best time so far is timed no further and its output is not verified (its "
        f"objective is that median): it cannot become the best, and {PRUNE_RUNS} launches place it for the "
        "optimiser. 0: every configuration gets all its repeats and is verified.",
    )

    @property
    def user(self) -> SourceRef | TritonSourceRef | None:
        """The user's source, CUDA or Triton (None for a built-in)."""
        return self.source or self.triton

    def sizes(self) -> list[tuple[int, ...]]:
        """The problem sizes to tune, in the order given (duplicates dropped)."""
        given = self.problem_sizes if self.problem_sizes is not None else [self.problem_size or []]
        return list(dict.fromkeys(tuple(s) for s in given if s))


class RangeSpec(Model):
    model_config = ConfigDict(json_schema_extra={CEL: [{"rule": "self.min <= self.max", "message": "min > max"}]})

    min: float = Field(description="Smallest value (inclusive).")
    max: float = Field(description="Largest value (inclusive).")
    step: float | None = Field(
        default=None, gt=0, description="Spacing of the values (integers: default 1; reals: default continuous)."
    )


class ParameterSpec(Model):
    model_config = ConfigDict(json_schema_extra={CEL: [
        # (`values` holds scalars of any type, which CEL cannot see: the operator checks it.)
        {"rule": "!(self.type in ['integer', 'real']) || has(self.range)",
         "message": "integer and real parameters need a range"},
        {"rule": "self.type != 'permutation' || has(self.size)", "message": "permutation parameters need a size"},
    ]})

    name: str = Field(
        pattern=IDENTIFIER, max_length=63,
        description="The parameter's name: a C identifier, passed to the kernel as a compile-time define.",
    )
    type: ParameterType = Field(
        default="ordinal",
        description="ordinal: ordered values (e.g. powers of two); integer and real: a range; categorical: "
        "unordered values; boolean: true/false; permutation: an ordering of size elements.",
    )
    values: list[Any] | None = Field(
        default=None, min_length=1, max_length=4096, description="The values (ordinal and categorical)."
    )
    range: RangeSpec | None = Field(default=None, description="The range (integer and real).")
    scale: Literal["linear", "log"] | None = Field(
        default=None, description="How the optimiser sees distances; default: log for powers of two."
    )
    size: int | None = Field(default=None, ge=2, le=12, description="Number of elements (permutation).")
    default: Any = Field(default=None, description="The untuned value (see kernel.defaultConfig).")


class ObjectiveSpec(Model):
    metric: Literal["time"] = Field(default="time", description="Kernel time in milliseconds (median of repeats).")
    direction: Literal["minimize"] = Field(default="minimize", description="Kernel time is minimised.")


class StrategySpec(Model):
    name: StrategyName = Field(
        default="bayes",
        description="bayes: Bayesian optimisation with a feasibility model (default); random; genetic.",
    )
    seed: int = Field(
        default=0, ge=0, le=2**31 - 1,
        description="Seed of the strategy: the same seed and the same results in the same order give the same "
        "suggestions.",
    )
    options: dict[str, Any] | None = Field(
        default=None, description="Options of the strategy; unknown keys are rejected (see the README)."
    )


class BudgetSpec(Model):
    trials_per_target: int = Field(
        default=60, ge=1, le=100_000, description="Trials per target pool (and problem size)."
    )
    parallelism: int = Field(default=2, ge=1, le=256, description="Trials running at once per target pool.")
    max_infra_failures: int = Field(
        default=10, ge=0, le=100_000,
        description="Infrastructure failures (not invalid configurations) tolerated per pool before it fails.",
    )
    trial_timeout_seconds: int = Field(
        default=300, ge=1, le=86_400,
        description="A trial's limit (compile, verify, time); past it the configuration counts as a timeout.",
    )
    patience: int | None = Field(
        default=None, ge=1, le=100_000, description="Stop a pool after this many trials without improvement."
    )
    deadline_seconds: int | None = Field(
        default=None, ge=1, le=30 * 86_400,
        description="Stop every pool this long after the run (or its current round) started; running trials end.",
    )
    trials_per_pod: int | None = Field(
        default=None, ge=1, le=MAX_BATCH,
        description="Configurations one trial Pod measures (one Pod start-up, one CUDA context; compiles run "
        "ahead on the node's CPUs). Unset: chosen per pool from its first measurements, for about podSeconds "
        "of GPU work per Pod, at most 16 per Pod and 32 between a pool's running Pods (the first Pods, before any "
        "measurement, share the default configuration "
        "and the strategy's first picks). 1: one configuration per Pod (the most isolation). With a strategy "
        "that learns from results (not random), a target's first Pods ramp up to this size as results arrive: "
        "never more configurations outstanding than half those measured.",
    )
    pod_seconds: int = Field(
        default=60, ge=5, le=3600,
        description="GPU seconds of verification and timing per trial Pod that batch sizes aim at when "
        "trialsPerPod is unset.",
    )
    stop_when_predicted: bool = Field(default=False, description="Try a confident prediction first; stop if it holds.")


class TargetSpec(Model):
    name: str = Field(
        pattern=DNS_LABEL, max_length=24, description="The pool's name in the status, metrics and published keys."
    )
    node_selector: dict[str, str] | None = Field(
        default=None, description="Labels of the pool's nodes (e.g. nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB)."
    )
    affinity: Affinity | None = Field(
        default=None, description="Affinity of the pool's trial Pods (a Pod's spec.affinity)."
    )
    tolerations: list[Toleration] | None = Field(
        default=None, max_length=32,
        description="Tolerations of the pool's trial Pods (a Pod's spec.tolerations; e.g. GPU node taints).",
    )
    runtime_class_name: str | None = Field(
        default=None, max_length=253, description="Runtime class of the trial Pods (e.g. nvidia on Jetson)."
    )
    image: str | None = Field(default=None, max_length=512, description="Job image for this pool (e.g. arm64).")
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        default=None, max_length=MAX_PULL_SECRETS,
        description="Secrets (in the run's namespace) to pull this pool's image with, added to "
        "jobTemplate.imagePullSecrets.",
    )
    device: str | None = Field(
        default=None, max_length=128,
        description="GPU product for device limits in constraints; default: read from the pool's node labels.",
    )
    gpus: int = Field(default=1, ge=1, le=16, description="GPUs (nvidia.com/gpu) per trial Pod.")
    allow_privileged: bool = Field(
        default=False, description="Run trial pods without the restricted security context (e.g. some edge nodes)."
    )
    allow_shared_gpus: bool = Field(
        default=False,
        description="Also use nodes whose GPUs are shared (time-slicing, MPS); their timings are noisy.",
    )
    queue: QueueSpec | None = Field(
        default=None,
        description="This pool's Kueue queue, instead of spec.queue (e.g. a LocalQueue whose ClusterQueue "
        "dispatches to another cluster through MultiKueue).",
    )


class QueueSpec(Model):
    """The Kueue LocalQueue that admits a run's trial Jobs (docs/operations/multikueue.md)."""

    name: str = Field(
        max_length=63, pattern=DNS_LABEL,
        description="The LocalQueue, in the run's namespace, that admits the trial Jobs (Kueue's "
        "kueue.x-k8s.io/queue-name label); they wait, suspended, until Kueue admits them.",
    )
    priority_class: str | None = Field(
        default=None, max_length=63, pattern=DNS_SUBDOMAIN,
        description="Kueue WorkloadPriorityClass of the trial Jobs: their order in the queue, and whom they may "
        "preempt or be preempted by.",
    )
    max_wait_seconds: int = Field(
        default=900, ge=10, le=604_800,
        description="A pool whose trial Jobs wait longer than this for admission says so (condition QueueDelayed).",
    )


class JobTemplateSpec(Model):
    image: str | None = Field(
        default=None, max_length=512, description="Job image; default: the operator's FLEETTUNE_JOB_IMAGE."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Image pull policy of the trial Pods."
    )
    ttl_seconds_after_finished: int = Field(
        default=3600, ge=0, le=604_800,
        description="Backstop cleanup of finished trial Jobs (the operator deletes them once recorded).",
    )
    backoff_limit: int = Field(default=2, ge=0, le=10, description=(
        "Not used (kept so that existing runs stay valid): a trial Job is never retried by the Job controller; "
        "what its Pod did not answer is measured again in a new Job."))
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        default=None, max_length=MAX_PULL_SECRETS,
        description="Secrets (in the run's namespace) to pull the job image with, added to those the operator's "
        "configuration sets for every trial Pod.",
    )
    service_account_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN,
        description="ServiceAccount of the trial Pods (its token is never mounted); default: the operator's "
        "(FLEETTUNE_TRIAL_SERVICE_ACCOUNT), else the namespace's default. Only the ServiceAccounts the operator's "
        "configuration allows (the chart value trialPolicy.allowedServiceAccounts) are accepted.",
    )


class TuningRunSpec(Model):
    model_config = ConfigDict(json_schema_extra={CEL: [
        {"rule": "self.parameters.all(p, self.parameters.exists_one(q, q.name == p.name))",
         "message": "parameter names must be unique", "fieldPath": ".parameters"},
        {"rule": "self.targets.all(t, self.targets.exists_one(u, u.name == t.name))",
         "message": "target names must be unique", "fieldPath": ".targets"},
        {"rule": "!has(self.kernel.problemSizes) || size(self.targets) * size(self.kernel.problemSizes) <= "
                 f"{MAX_TUNED_TARGETS}",
         "message": f"size(targets) * size(kernel.problemSizes) must be at most {MAX_TUNED_TARGETS}",
         "fieldPath": ".targets"},
        {"rule": f"!has(self.predictFor) || size(self.targets) * size(self.predictFor) <= {MAX_PREDICTIONS}",
         "message": f"size(targets) * size(predictFor) must be at most {MAX_PREDICTIONS}", "fieldPath": ".predictFor"},
    ]})

    kernel: KernelSpec = Field(
        description="The kernel to tune: a built-in of the job image, your CUDA source or your Triton source."
    )
    parameters: list[ParameterSpec] = Field(
        min_length=1, max_length=64, description="The tunable parameters: the search space (with constraints)."
    )
    constraints: list[Annotated[str, StringConstraints(min_length=1, max_length=2048)]] = Field(
        default_factory=list,
        max_length=256,
        description="Known constraints: expressions over parameters and device.<limit>.",
    )
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec, description="What is optimised.")
    strategy: StrategySpec = Field(default_factory=StrategySpec, description="How configurations are chosen.")
    budget: BudgetSpec = Field(default_factory=BudgetSpec, description="How much to spend, per target pool.")
    targets: list[TargetSpec] = Field(
        min_length=1, max_length=16, description="The node pools to tune on; each is tuned separately."
    )
    job_template: JobTemplateSpec = Field(default_factory=JobTemplateSpec, description="The trial Jobs.")
    queue: QueueSpec | None = Field(
        default=None,
        description="Send the trial Jobs through this Kueue LocalQueue (quotas, fair sharing, preemption); "
        "default: the operator's (the chart value trialPolicy.queue), else none.",
    )
    retune_policy: RetunePolicy = Field(
        default="Manual",
        description="OnDriverChange: re-tune a pool, warm-started, when its GPU fingerprint changes. Manual: only mark "
        "it Stale; re-tune when the annotation fleettune.dev/retune-requested-at changes.",
    )
    publish: PublishSpec | None = Field(
        default=None, description="Publish the best configuration per pool to a ConfigMap for applications."
    )
    warm_start: list[WarmStartSpec] | None = Field(
        default=None, min_length=1, max_length=8,
        description="Results you already have (Kernel Tuner caches, T4 files) to start every pool's search from.",
    )
    fleet_memory: FleetMemorySpec = Field(
        default_factory=FleetMemorySpec,
        description="Start from what the run's other pools and earlier runs of the same kernel measured (same "
        "namespace), and keep this run's results for later runs.",
    )
    predict_for: list[ProblemSizeSpec] | None = Field(
        default=None, min_length=1, max_length=MAX_PROBLEM_SIZES,
        description="Problem sizes never tuned: status.predictions recommends a configuration per target for each, "
        "from the tuned sizes' results.",
    )
