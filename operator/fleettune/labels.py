"""Every label and annotation fleettune puts on, or reads from, the objects it owns.

Node labels the operator reads to know a pool's GPUs (GPU Feature Discovery's and the
project's own ``fleettune.dev/gpu.*`` for nodes GFD does not label) belong to the
fingerprint: see `fleettune.fingerprint`.
"""

from __future__ import annotations

from fleettune import GROUP

# On trial Jobs and their Pods.
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "fleettune"  # the value of MANAGED_BY on what the operator creates
RUN_LABEL = f"{GROUP}/run"  # the run's name as a label value (`names.label_value`)
TARGET_LABEL = f"{GROUP}/target"  # the pool key: a target's name, or name.<size>
TRIAL_LABEL = f"{GROUP}/trial"  # the trial index within the pool, over all rounds
ROUND_LABEL = f"{GROUP}/round"  # the pool's tuning round the trial belongs to
CONFIG_KEYS_ANNOTATION = f"{GROUP}/config-keys"  # a trial Job's configuration keys, JSON list, in entry order
# "true" on every trial Job (a batch) and its Pod: any end of the Pod but a disruption is
# final (no retry). Missing: a one-configuration Job of an earlier version (`jobs.from_earlier_version`).
BATCH_LABEL = f"{GROUP}/batch"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # set by the Job controller on its Pods
# Kueue's, on a trial Job of a run that names a queue (spec.queue): its LocalQueue, and the
# WorkloadPriorityClass that orders it in the queue and decides what it may preempt.
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
QUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"

# On the TuningRun.
RETUNE_ANNOTATION = f"{GROUP}/retune-requested-at"  # a new value starts a new round on every pool

# On ConfigMaps.
RESULTS_OF_LABEL = f"{GROUP}/results-of"  # results-store shards: the run's name as a label value
RUN_UID_LABEL = f"{GROUP}/run-uid"  # results-store shards: the uid of the run that owns them
PUBLISHED_BY = f"{GROUP}/published-by"  # the published ConfigMap: the run's name as a label value
PUBLISHED_BY_RUN = f"{GROUP}/published-by-run"  # annotation: the run's whole name
PUBLISHED_BY_UID = f"{GROUP}/published-by-uid"  # annotation: the uid of the run that wrote it last

# On simulated nodes (the local fleet): which pool a fake GPU node belongs to.
POOL_LABEL = f"{GROUP}/pool"
