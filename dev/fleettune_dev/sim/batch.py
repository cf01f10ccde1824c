"""A trial Pod's answers and when each is written (pure: no API calls).

Every trial Pod measures a batch (of one configuration or several), in entry order in one
container. Its compiles run ahead on the node's CPU cores (``slots`` at once, taken in
entry order: the job's own compile-ahead pool, :func:`compile_slots`) while the GPU checks
and times the configurations already compiled, so the GPU's critical path is the
verification and timing of each configuration; one that fails to compile never reaches
the GPU. For entry
*i*, with every time measured from the end of the Pod's start-up::

    ready_i     = when its compile ends (the first free slot + compile_i)
    gpu_start_i = max(ready_i, gpu_free)
    gpu_free    = gpu_start_i + gpu_i        (nothing when gpu_i is 0)
    answered_i  = gpu_free, or ready_i for a configuration that never reaches the GPU

The job rewrites its termination message after every answer, so a Pod killed at time *t*
leaves the answers with ``answered_i <= t`` (:meth:`BatchAnswer.terminated`). An
infrastructure failure (no model for the kernel, no kernel source) stops the batch where
it is found: the Pod ends there with the answers it had, ``done=False`` and the failure's
text, and the operator retries the rest.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleettune_dev.cluster.fleet import NodePool
from fleettune_dev.sim.answer import Answer
from fleettune_job.protocol import Answer as Verdict
from fleettune_job.protocol import Batch, BatchResult, Fingerprint, Outcome

TERMINATED = "terminated"  # the error of a batch whose Pod was killed (deleted, evicted)


def compile_slots(pool: NodePool, environ: Mapping[str, str] | None = None) -> int:
    """Compiles a batch Pod of ``pool`` runs at once: what the job's compile-ahead pool
    takes on the pool's nodes (their CPU capacity: the trial container has no CPU limit)
    with the container's environment ``environ`` (``FLEETTUNE_COMPILE_WORKERS``; 0: off)."""
    from fleettune_job.ahead import compile_workers  # the job image's rule (imports numpy)

    text = pool.resources.cpu.strip()
    try:
        cores = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        cores = float(NodePool.model_fields["resources"].default.cpu)
    return compile_workers(environ or {}, cpus=max(1, int(cores)))


def timeline(costs: Sequence[tuple[float, float]], slots: int) -> list[float]:
    """When each entry is answered, from ``(compile_s, gpu_s)`` per entry in order (see the
    module docstring); ``gpu_s == 0``: the entry never reaches the GPU. ``slots == 0``:
    compile-ahead is off, each configuration compiles in the GPU worker, one after another."""
    if slots < 0:
        raise ValueError("slots must be >= 0")
    if slots == 0:
        return list(itertools.accumulate(c + g for c, g in costs))
    free = [0.0] * slots  # when each compile slot is next free
    gpu_free = 0.0
    out = []
    for compile_s, gpu_s in costs:
        ready = heapq.heappop(free) + compile_s
        heapq.heappush(free, ready)
        if gpu_s > 0:
            gpu_free = max(ready, gpu_free) + gpu_s
            out.append(gpu_free)
        else:
            out.append(ready)
    return out


@dataclass(frozen=True)
class Timed:
    index: int  # the entry's trial index
    answer: Answer
    at_s: float  # when it is answered, from the end of the Pod's start-up


@dataclass(frozen=True)
class BatchAnswer:
    """What a batch Pod writes: its answers and when (``at_s``, from the end of start-up),
    ``duration_s`` when its container exits, ``error`` why it stopped early (infra)."""

    fingerprint: Fingerprint
    answers: tuple[Timed, ...]
    duration_s: float
    error: str = ""

    @property
    def result(self) -> BatchResult:
        """The termination message when the container exits by itself."""
        return self._message(self.answers, done=not self.error, error=self.error)

    def terminated(self, elapsed_s: float) -> BatchResult:
        """The message of a container killed ``elapsed_s`` after its start-up: what it had
        written by then (a kill during start-up leaves an empty batch)."""
        return self._message(tuple(t for t in self.answers if t.at_s <= elapsed_s), done=False, error=TERMINATED)

    def _message(self, answers: tuple[Timed, ...], *, done: bool, error: str) -> BatchResult:
        return BatchResult(answers=[Verdict.of(t.index, t.answer.result) for t in answers],
                           fingerprint=self.fingerprint, done=done, error=error)

    @classmethod
    def failed(cls, answer: Answer) -> BatchAnswer:
        """A batch that stops before its first configuration (an infrastructure failure)."""
        return cls(answer.result.fingerprint, (), answer.duration_s, answer.result.error)


def answer_batch(batch: Batch, answers: Sequence[Answer], slots: int) -> BatchAnswer:
    """The batch's answers, one per entry of ``batch`` in order (each configuration's own,
    `fleettune_dev.sim.answer`), on the Pod's timeline."""
    if len(answers) != len(batch.entries):
        raise ValueError(f"{len(answers)} answers for a batch of {len(batch.entries)}")
    infra = next((n for n, a in enumerate(answers) if a.result.outcome == Outcome.INFRA_ERROR), None)
    ran = answers if infra is None else answers[: infra + 1]
    times = timeline([(a.compile_s, a.gpu_s) for a in ran], slots)
    timed = [Timed(e.index, a, at) for e, a, at in zip(batch.entries, ran, times, strict=False)]
    if infra is None:
        return BatchAnswer(_fingerprint(answers), tuple(timed), max(times))
    stop = timed[-1]
    kept = tuple(t for t in timed[:-1] if t.at_s <= stop.at_s)
    return BatchAnswer(_fingerprint([t.answer for t in kept] or [stop.answer]), kept, stop.at_s,
                       stop.answer.result.error)


def _fingerprint(answers: Sequence[Answer]) -> Fingerprint:
    # One fingerprint speaks for the batch: synthetic (unverified) when any measurement in it
    # is (a verdict inferred from a recording's restrictions does not make the GPU's times synthetic).
    measured = [a for a in answers if a.result.outcome == Outcome.OK] or list(answers)
    first = measured[0].result.fingerprint
    return first.model_copy(update={"synthetic": any(a.result.fingerprint.synthetic for a in measured),
                                    "unverified": any(a.result.fingerprint.unverified for a in measured)})
