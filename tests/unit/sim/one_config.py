"""The simulator's answer about one configuration, for the tests of how it models one: a Pod
measuring a batch of one, and that batch's one answer."""

from __future__ import annotations

from fleettune_dev.sim.answer import Answer
from fleettune_dev.sim.batch import BatchAnswer
from fleettune_job.protocol import Batch, Outcome, Trial, TrialResult


def batch_env(trial: Trial) -> str:
    """The ``FLEETTUNE_TRIAL`` of a Pod measuring only ``trial``'s configuration."""
    common = trial.model_dump(exclude={"index", "config"})
    return Batch.model_validate(common | {"entries": [{"index": trial.index, "config": trial.config}]}).to_env()


def only(answer: BatchAnswer) -> Answer:
    """A batch of one's answer; one that stopped before it (an infrastructure failure) as the
    infra_error it is, with the batch's error."""
    if answer.answers:
        (timed,) = answer.answers
        return timed.answer
    assert not answer.result.done and answer.error
    return Answer(TrialResult(outcome=Outcome.INFRA_ERROR, error=answer.error, fingerprint=answer.fingerprint),
                  compile_s=answer.duration_s)
