"""How many trial Pods a pool starts in a step, and how many trials each Pod takes (pure).

The planner (`fleettune.controller.planner`) asks, in this order: `pods_at_once` (the
target's parallelism, capped by its GPUs), `share_pods` (that among the target's problem
sizes), `free_slots` (the new Pods a pool may start now), and `batch_sizes` (the trials per
new Pod). The numbers come from `fleettune.optimize.batching`;
this module applies them to a pool's spec, records and running Jobs.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleettune.api import BudgetSpec
from fleettune.controller.fleet import PENDING_WITHOUT_NODES, capacity_note
from fleettune.controller.observed import ObservedJob
from fleettune.optimize.batching import batch_size, queue_slots, slow_start
from fleettune.results import TrialRecord

AUTO_MAX_BATCH = 16  # trials per Pod when the size is chosen: beyond it the optimiser suggests blind


def pods_at_once(parallelism: int, capacity: tuple[int, int] | None, gpus_per_pod: int) -> tuple[int, str | None]:
    """The trial Pods a pool runs at once, and the pool's note when that is fewer than its
    parallelism. ``capacity``: (GPUs, Pods) its nodes run at once (`FleetView.capacity`),
    None when not known."""
    if capacity is not None and capacity[1] < parallelism:
        # More Pods than the pool's GPUs would only wait Pending, holding configurations
        # chosen blind; one is kept when none fits, so that the wait shows on a Pod.
        gpus, pods = capacity
        return max(pods, 1), capacity_note(parallelism, gpus, gpus_per_pod, pods)
    return parallelism, None


def share_pods(at_once: int, pools: Sequence[tuple[str, int, int]]) -> dict[str, int]:
    """The Pods each of a target's tuning sizes may run at once, ``pools`` being (key, Jobs
    running, results): ``at_once`` in all, each free slot to the size that runs the fewest,
    then has the fewest results, so that the sizes advance together and none waits for
    another to finish. A size keeps what it runs (Jobs are never stopped to make room)."""
    shares = {key: running for key, running, _ in pools}
    results = {key: n for key, _, n in pools}
    for _ in range(at_once - sum(shares.values())):
        key = min(shares, key=lambda k: (shares[k], results[k]))
        shares[key] += 1
    return shares


def free_slots(at_once: int, running: Sequence[ObservedJob], nodes_missing: bool, queued: bool) -> int:
    """The new trial Pods a pool may start now (<= 0: none): ``at_once`` less its ``running``
    Jobs; PENDING_WITHOUT_NODES while it waits for nodes; through a Kueue queue
    (``queued``), as `queue_slots` allows for the Jobs admitted and waiting."""
    slots = (PENDING_WITHOUT_NODES if nodes_missing else at_once) - len(running)
    if queued:
        waiting = sum(job.suspended for job in running)
        slots = queue_slots(slots, len(running) - waiting, waiting)
    return slots


def batch_sizes(budget: BudgetSpec, learns: bool, mine: Sequence[TrialRecord], slots: int, left: int,
                default_first: bool, observed: int, outstanding: int, pods: int) -> tuple[int, list[int]]:
    """The size the pool's Pods aim at, and the trials per new Pod, one size per free
    slot, `left` at most in all. The default configuration (the baseline) goes first:
    with a chosen size, in the first Pod, with the strategy's first (blind) picks
    (`batch_size` with nothing measured); with a fixed one, alone. No Pod takes more than
    the target's results leave room for (`slow_start`) when the size is fixed and the
    strategy ``learns`` from results: the chosen size keeps the Pods of a pool within
    MAX_OUTSTANDING configurations already, and a ramp would only add start-ups
    (docs/benchmarks.md). ``mine``: the pool's records; ``observed``, ``outstanding``: its
    results and the configurations in flight; ``pods``: the Pods the pool runs at once (its
    parallelism, capped by its GPUs)."""
    ramp = budget.trials_per_pod is not None and learns
    if budget.trials_per_pod is not None:
        k = budget.trials_per_pod
    else:
        measured = [r.run_s for r in mine if r.run_s is not None and r.is_observation]
        k = batch_size(measured, float(budget.pod_seconds), AUTO_MAX_BATCH, left, pods=pods)
    sizes = [1] if default_first and budget.trials_per_pod is not None else []
    left -= len(sizes)
    # Spread what is left of the budget over the free slots rather than filling the first.
    aim = k
    k = max(1, min(k, -(-left // max(slots - len(sizes), 1))))
    while len(sizes) < slots and left > 0:
        ramped = slow_start(k, observed, outstanding + sum(sizes)) if ramp else k
        sizes.append(min(ramped, left))
        left -= sizes[-1]
    return aim, sizes
