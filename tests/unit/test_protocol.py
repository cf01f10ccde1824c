import json

import pytest

from fleettune_job.protocol import (
    ANSWER_PREFIX,
    EXIT_ANSWERED,
    EXIT_STOPPED_EARLY,
    MAX_MESSAGE_BYTES,
    Answer,
    Batch,
    BatchResult,
    Fingerprint,
    KernelRef,
    Outcome,
    ProtocolError,
    Trial,
    TrialResult,
    decode,
)


def test_result_round_trip_keeps_every_field():
    res = TrialResult(
        outcome=Outcome.OK, objective=0.55, times=[0.55, 0.56], fingerprint=Fingerprint(product="A100"), compile_s=0.9
    )
    assert decode(res.encode()) == res


def test_oversized_error_is_trimmed_to_fit_but_verdict_kept():
    res = TrialResult(outcome=Outcome.COMPILE_ERROR, error="x" * 20_000, times=[1.0] * 500)
    text = res.encode()
    assert len(text.encode()) <= MAX_MESSAGE_BYTES
    back = decode(text)
    assert back.outcome == Outcome.COMPILE_ERROR and back.error.startswith("xxx")


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({"version": 99, "outcome": "ok", "objective": 1.0}), "unknown protocol version"),
        (json.dumps({"version": 1, "outcome": "exploded"}), "outcome"),
        (json.dumps({"version": 1, "outcome": "ok"}), "objective"),
        (json.dumps({"version": 1, "outcome": "ok", "objective": -1}), "objective"),
        (json.dumps({"version": 1, "outcome": "ok", "objective": 1, "extra": 1}), "extra"),
        ("{" + " " * 5000 + "}", "exceeds 4 KiB"),
    ],
)
def test_bad_messages_raise_protocol_error(message, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        decode(message)


def test_an_invalid_configuration_is_an_answer_not_an_exit_code():
    # Only whether every configuration was answered shows in the exit code: an invalid one's
    # verdict is in the message, and ends nothing.
    invalid = Answer.of(3, TrialResult(outcome=Outcome.COMPILE_ERROR, error="too many registers"))
    assert BatchResult(answers=[invalid], done=True).exit_code == EXIT_ANSWERED == 0
    assert BatchResult(answers=[invalid], error="no GPU").exit_code == EXIT_STOPPED_EARLY == 20


def test_batch_env_round_trip():
    batch = Batch(run="r", target="a100", kernel=KernelRef(builtin="convolution"), problem_size=[4096, 4096],
                  entries=[{"index": 3, "config": {"block_size_x": 32}}])
    assert Batch.from_env(batch.to_env()) == batch
    assert batch.trials() == [Trial(run="r", target="a100", index=3, kernel=KernelRef(builtin="convolution"),
                                    config={"block_size_x": 32}, problem_size=[4096, 4096])]


def test_a_batchs_pruning_cutoff_reaches_each_trial_and_must_be_positive():
    from pydantic import ValidationError

    batch = Batch(run="r", target="a100", kernel=KernelRef(builtin="convolution"), problem_size=[64],
                  entries=[{"index": 1, "config": {}}, {"index": 2, "config": {}}], prune_above_ms=2.5)
    assert [t.prune_above_ms for t in batch.trials()] == [2.5, 2.5]
    assert "prune_above_ms" not in Batch.model_validate({**batch.model_dump(), "prune_above_ms": None}).to_env()
    with pytest.raises(ValidationError, match="prune_above_ms"):
        Trial(run="r", target="a100", index=1, kernel=KernelRef(builtin="convolution"), config={},
              problem_size=[64], prune_above_ms=0)


def test_an_answer_line_round_trips_and_anything_else_is_not_an_answer():
    answer = Answer.of(7, TrialResult(outcome=Outcome.OK, objective=0.125, times=[0.125, 0.126], run_s=0.3))
    assert Answer.from_line(answer.line()) == answer
    bad = Answer.of(8, TrialResult(outcome=Outcome.COMPILE_ERROR, error="too many registers"))
    assert Answer.from_line(bad.line()) == bad
    for line in ["", "fleettune-job: batch: started", ANSWER_PREFIX + "{", ANSWER_PREFIX + '{"i": 1, "o": "ok"}',
                 ANSWER_PREFIX + '{"i": -1, "o": "compile_error"}', " " + answer.line(),
                 ANSWER_PREFIX + json.dumps({"i": 1, "o": "compile_error", "e": "x" * MAX_MESSAGE_BYTES})]:
        assert Answer.from_line(line) is None, line
