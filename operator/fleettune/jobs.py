"""Render the Kubernetes Job of a batch of trials (pure: no API calls).

Every trial Job measures a batch — a batch of one where a Pod measures one configuration.
One Job per (run, target pool, first trial index); its trials have the consecutive
indexes from there. The name is deterministic, so an operator that restarts
finds — adopts — the Jobs it created instead of duplicating them. The Job carries its
work in an environment variable and is owned by its TuningRun, so deleting the run
garbage-collects its Jobs and their Pods.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from fleettune import GROUP, KIND, VERSION
from fleettune.admission import TrialPolicy, default_job_image
from fleettune.api import QueueSpec, TargetSpec, TuningRunSpec
from fleettune.labels import (
    BATCH_LABEL,
    CONFIG_KEYS_ANNOTATION,
    MANAGED_BY,
    MANAGER,
    QUEUE_NAME_LABEL,
    QUEUE_PRIORITY_LABEL,
    RUN_LABEL,
    TARGET_LABEL,
    TRIAL_LABEL,
)
from fleettune.metrics import parse_time
from fleettune.names import label_value
from fleettune_job.protocol import CONTAINER_NAME, TERMINATION_LOG, TRIAL_ENV, Batch

# The job's own watchdog ends a trial at its timeout with a `timeout` verdict; the Job's
# deadline is only a backstop, so it also allows for image pulls and start-up.
STARTUP_ALLOWANCE_S = 120
# The Job controller ends a Job at its deadline within seconds (it queues a sync for that
# moment). A trial Job still running this long after it has been lost track of: its Pod
# lost (evicted, its node deleted), the controller neither started another nor failed the
# Job, waiting for a Pod event it never saw (its "expectations"; seen in CI). Those expire
# after 5 minutes, but only a later event on the Job would wake it, and none may come: the
# trial would hang forever. The operator deletes such a Job and measures its configurations
# again (`controller.plan`).
STALL_GRACE_S = 60


def job_name(run: str, target: str, index: int) -> str:
    name = f"{run}-{target}-{index:04d}"
    if len(name) <= 63:
        return name
    # Keep names unique and deterministic when the run name is long: the hash stands for the
    # whole (run, target), the index stays whole. (A name is also the Pods' job-name label
    # value: at most 63 characters, ending alphanumeric; a cut run name must not end in '.'.)
    digest = hashlib.sha256(f"{run}/{target}".encode()).hexdigest()[:8]
    tail = f"-{digest}-{target}-{index:04d}"
    if len(tail) > 40:  # a long target key (several problem sizes): the hash names it
        tail = f"-{digest}-{index:04d}"
    return f"{run[: max(62 - len(tail), 1)].rstrip('-.')}{tail}"  # 62: the names of earlier versions


def run_label(run: str) -> str:
    """The value of RUN_LABEL: the run's name, or a hashed form of a name longer than a label
    value may be (run names go up to 253 characters)."""
    return label_value(run)


def run_selector(run: str) -> str:
    return f"{MANAGED_BY}={MANAGER},{RUN_LABEL}={run_label(run)}"


KERNEL_DIR = "/etc/fleettune/kernel"


def kernel_ref(spec: TuningRunSpec, source_digest: str | None = None) -> dict[str, Any]:
    """The trial's `kernel`: a built-in's name, or the user source's mount path, geometry,
    arguments and verification (data keys resolved to their mounted files), and the digest
    of the source the operator checked."""
    kernel = spec.kernel
    source = kernel.user
    if source is None:
        return {"builtin": kernel.builtin}
    arguments = []
    for arg in source.arguments:
        doc = arg.model_dump(exclude_none=True, exclude={"data_key"})
        if arg.data_key:
            doc["data_path"] = f"{KERNEL_DIR}/{arg.data_key}"
        arguments.append(doc)
    check = source.verification
    return {
        "source_path": f"{KERNEL_DIR}/{source.key}",
        "source_sha256": source_digest,
        "function": source.function,
        "grid": source.grid,
        "block": kernel.source.block if kernel.source is not None else None,
        "language": "triton" if kernel.triton is not None else "cuda",
        "arguments": arguments,
        # Unset tolerances take the job protocol's defaults (one home for them).
        "verification": {"reference_config": kernel.default_config or {}}
        | check.model_dump(exclude_none=True, include={"reference_function", "atol", "rtol"}),
    }


def prune_above_ms(factor: float, best_ms: float | None) -> float | None:
    """The time (ms) above which a trial's timing stops early: `kernel.pruneSlowerThan`
    (``factor``) × the target's best so far; None when nothing is measured yet or pruning
    is off (0).

    Never below the best (a factor under 1, which the CRD rejects, counts as 1): a pruned
    configuration is not verified, and that is safe only because it reports a time above
    the cut-off, so it can never become the best."""
    return max(factor, 1.0) * best_ms if factor > 0 and best_ms is not None and best_ms > 0 else None


def make_batch(run: str, spec: TuningRunSpec, target: TargetSpec, index: int, configs: Sequence[dict[str, Any]],
               key: str | None = None, problem_size: Sequence[int] | None = None,
               source_digest: str | None = None, best_ms: float | None = None) -> Batch:
    """The work of a Job measuring ``configs`` as trials ``index``, ``index + 1``, ..."""
    kernel = spec.kernel
    return Batch.model_validate(
        {
            "run": run,
            "target": key or target.name,
            "kernel": kernel_ref(spec, source_digest),
            "entries": [{"index": index + n, "config": c} for n, c in enumerate(configs)],
            "problem_size": list(problem_size or kernel.sizes()[0]),
            "warmups": kernel.warmups,
            "repeats": kernel.repeats,
            "timeout_s": float(spec.budget.trial_timeout_seconds),
            "prune_above_ms": prune_above_ms(kernel.prune_slower_than, best_ms),
        }
    )


def queue_of(spec: TuningRunSpec, target: TargetSpec, policy: TrialPolicy) -> QueueSpec | None:
    """The Kueue queue of a pool's trial Jobs: the target's, the run's, else the operator's default."""
    if target.queue is not None or spec.queue is not None:
        return target.queue or spec.queue
    return QueueSpec(name=policy.default_queue) if policy.default_queue else None


def suspended(job: Mapping[str, Any]) -> bool:
    """Whether a trial Job is held by its queue: created suspended and not admitted yet, or
    suspended again (Kueue preempted it). Its configurations are waiting, not failing."""
    return bool((job.get("spec") or {}).get("suspend"))


def deadline_at(job: Mapping[str, Any]) -> float | None:
    """When (epoch seconds) a trial Job reaches its `activeDeadlineSeconds`; None with no
    deadline, or while a queue holds it. The deadline counts from the Job's start (reset
    when a queue admits it again), or from its creation while the Job controller has not
    started it."""
    deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
    if suspended(job) or deadline is None:
        return None
    started = (job.get("status") or {}).get("startTime") or (job.get("metadata") or {}).get("creationTimestamp")
    start = parse_time(started)
    return None if start is None else start + deadline


def past_deadline_s(job: Mapping[str, Any], wall: float) -> float | None:
    """How many seconds past its deadline (`deadline_at`) a trial Job is at `wall` (epoch
    seconds; negative: before it); None with no deadline, or while a queue holds it."""
    at = deadline_at(job)
    return None if at is None else wall - at


def suspended_since(job: Mapping[str, Any]) -> str | None:
    """When a suspended Job last started waiting (RFC 3339): its Suspended condition's
    transition, else its creation (Kueue's webhook suspends it as it is created)."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Suspended" and cond.get("status") == "True" and cond.get("lastTransitionTime"):
            return str(cond["lastTransitionTime"])
    return (job.get("metadata") or {}).get("creationTimestamp")


def with_node_expressions(affinity: dict[str, Any] | None, expressions: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The target's affinity with `expressions` added to every required node-selector term
    (terms are ORed, expressions within a term ANDed: each term must also exclude them)."""
    if not expressions:
        return affinity
    out = copy.deepcopy(affinity) if affinity else {}
    required = out.setdefault("nodeAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchExpressions", []).extend(copy.deepcopy(expressions))
    return out


def _security(target: TargetSpec, policy: TrialPolicy) -> tuple[dict[str, Any], dict[str, Any]]:
    # The run is checked against the operator's trial policy before any Job is rendered;
    # this is the second lock on the same door.
    if target.allow_privileged and policy.allow_privileged:
        return {}, {}
    pod: dict[str, Any] = {"runAsNonRoot": True}
    if policy.run_as_user is not None:  # None: the platform assigns them (OpenShift restricted-v2)
        pod |= {"runAsUser": policy.run_as_user, "runAsGroup": policy.run_as_user, "fsGroup": policy.run_as_user}
    pod["seccompProfile"] = {"type": "RuntimeDefault"}
    container = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
    return pod, container


def render_job(
    *,
    run: str,
    namespace: str,
    uid: str,
    spec: TuningRunSpec,
    target: TargetSpec,
    index: int,
    configs: Sequence[tuple[dict[str, Any], str]],
    pin: dict[str, str] | None = None,
    node_expressions: list[dict[str, Any]] | None = None,
    key: str | None = None,
    problem_size: Sequence[int] | None = None,
    source_digest: str | None = None,
    policy: TrialPolicy | None = None,
    best_ms: float | None = None,
) -> dict[str, Any]:
    """The Job of a batch: one Pod measures `configs` (configuration, key) in order, as the
    trials `index`, `index + 1`, ... (a batch of one: one configuration). `pin` adds
    node-selector labels (the driver the pool's round is tuned for); `node_expressions`
    keep the Pod off ineligible nodes (mid driver upgrade, shared GPUs); `key` and
    `problem_size` name one of several tuned problem sizes (see `fleettune.sizes.pool_key`);
    `policy`: the operator's trial policy (default: read from its environment).

    `best_ms`: the target's best time so far, which sets where timing is pruned
    (`prune_above_ms`); None for a batch with the kernel's default configuration, the
    baseline of the speed-up, which is always timed in full.

    The Pod answers every configuration in its termination message, an invalid one
    included: that verdict ends nothing and costs no retry. The Job controller never
    retries a Pod that ended (backoffLimit 0): a retry would measure its finished
    configurations again; the operator measures the ones its Pod did not answer again
    instead. A Pod disrupted (preempted, evicted, drained for a driver upgrade, its node
    lost: the `DisruptionTarget` condition) says nothing about its configurations: the
    pod failure policy ignores it and the Job starts another Pod, whose answers stand in
    for those the first never wrote (the first answer of an entry is kept).

    With a queue (`queue_of`), the Job is created suspended, labelled for Kueue, which
    admits it (un-suspends it) when the queue's quota allows: a Job is never started behind
    the queue's back, even where no Kueue webhook suspends it."""
    if not configs:
        raise ValueError("a trial Job needs at least one configuration")
    key = key or target.name
    policy = policy or TrialPolicy.from_env()
    labels = {MANAGED_BY: MANAGER, RUN_LABEL: run_label(run), TARGET_LABEL: key, TRIAL_LABEL: str(index),
              BATCH_LABEL: "true"}
    queue = queue_of(spec, target, policy)
    job_labels = dict(labels)
    if queue is not None:
        job_labels[QUEUE_NAME_LABEL] = queue.name
        if queue.priority_class:
            job_labels[QUEUE_PRIORITY_LABEL] = queue.priority_class
    timeout = spec.budget.trial_timeout_seconds
    work = make_batch(run, spec, target, index, [c for c, _ in configs], key, problem_size, source_digest,
                      best_ms).to_env()
    annotations = {CONFIG_KEYS_ANNOTATION: json.dumps([k for _, k in configs])}
    job_spec = {
        "backoffLimit": 0,
        # Each configuration has its own timeout in the Pod; one more covers a fresh worker's
        # start after a configuration that broke its CUDA context.
        "activeDeadlineSeconds": (len(configs) + 1) * timeout + STARTUP_ALLOWANCE_S,
        "podFailurePolicy": {"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]},
    }
    pod_security, container_security = _security(target, policy)
    tmpl = spec.job_template
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    if spec.kernel.user is not None:
        volumes.append({"name": "kernel", "configMap": {"name": spec.kernel.user.config_map}})
        mounts.append({"name": "kernel", "mountPath": KERNEL_DIR, "readOnly": True})
    gpus = str(target.gpus)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security,
        "containers": [
            {
                "name": CONTAINER_NAME,
                "image": target.image or tmpl.image or default_job_image(),
                "imagePullPolicy": tmpl.image_pull_policy,
                "env": [
                    {"name": TRIAL_ENV, "value": work},
                    {"name": "CUPY_CACHE_DIR", "value": "/tmp/cupy"},
                    {"name": "HOME", "value": "/tmp"},
                ],
                "resources": {
                    "requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": gpus},
                    "limits": {"memory": "4Gi", "nvidia.com/gpu": gpus},
                },
                "securityContext": container_security,
                "terminationMessagePath": TERMINATION_LOG,
                "terminationMessagePolicy": "File",
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    selector = {**(target.node_selector or {}), **(pin or {})}
    if selector:
        pod_spec["nodeSelector"] = selector
    affinity = with_node_expressions(target.affinity, node_expressions or [])
    if affinity:
        pod_spec["affinity"] = affinity
    if target.tolerations:
        pod_spec["tolerations"] = target.tolerations
    if target.runtime_class_name:
        pod_spec["runtimeClassName"] = target.runtime_class_name
    # The operator's, then the run's, then the pool's (its own image may come from elsewhere).
    secrets = [*policy.image_pull_secrets, *(s.name for s in tmpl.image_pull_secrets or ()),
               *(s.name for s in target.image_pull_secrets or ())]
    if secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in dict.fromkeys(secrets)]
    # Allowed by the operator's policy (admission.check_trial_policy); its token stays unmounted.
    account = tmpl.service_account_name or policy.service_account
    if account:
        pod_spec["serviceAccountName"] = account
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(run, key, index),
            "namespace": namespace,
            "labels": job_labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": KIND,
                    "name": run,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            **job_spec,
            **({"suspend": True} if queue is not None else {}),
            "ttlSecondsAfterFinished": tmpl.ttl_seconds_after_finished,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def work_of(job: Mapping[str, Any]) -> Batch:
    """What a rendered Job measures, read back from its environment."""
    env = job["spec"]["template"]["spec"]["containers"][0].get("env") or []
    return _parsed_work(next(e["value"] for e in env if e["name"] == TRIAL_ENV))


def _parse_work(text: str) -> Batch:
    raw = json.loads(text)
    if isinstance(raw, dict) and "entries" not in raw:
        # A one-configuration Job of an earlier version (`from_earlier_version`): its trial,
        # as the batch of one it is now, so that its configuration can be handed back.
        common = {k: v for k, v in raw.items() if k not in ("index", "config")}
        raw = common | {"entries": [{"index": raw.get("index"), "config": raw.get("config")}]}
    return Batch.model_validate(raw)


# Every step reads the work of each of its run's Jobs, and a Job's work never changes: parse
# each once (the models are frozen). Bounded by about the Jobs a busy operator holds.
_parsed_work = functools.lru_cache(maxsize=8192)(_parse_work)


def entries_of(job: Mapping[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(index, configuration) of each trial a Job measures."""
    return [(e.index, e.config) for e in work_of(job).entries]


def from_earlier_version(job: Mapping[str, Any]) -> bool:
    """Whether a trial Job is a one-configuration Job of an operator before every Job was a
    batch (no `BATCH_LABEL`): its protocol is no longer read. Still running after an
    upgrade, or ended and not recorded, it is deleted and its configuration measured again
    in a batch (`controller.plan.collect`)."""
    return ((job.get("metadata") or {}).get("labels") or {}).get(BATCH_LABEL) != "true"
