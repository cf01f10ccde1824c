"""A run's Events are correlated as Kubernetes' recorder correlates them: a repeated cause is
one Event whose count rises, and many different messages of one reason end up in one
combined Event, so `kubectl describe` is not buried under one Event per trial."""

from __future__ import annotations

from fleettune.controller.events import COMBINED, SIMILAR_MAX, SIMILAR_WINDOW_S, EventCorrelator, EventWrite

LOST = ("Warning", "InfraFailure", "a100: trial lost to the infrastructure: simulator: no model (retried)")


def _write(c: EventCorrelator, events: list[tuple[str, str, str]], now: float = 0.0) -> list[EventWrite]:
    """Correlate, and pretend every write succeeded (a new Event is named after its key)."""
    writes = c.correlate(events, now)
    for w in writes:
        c.written(w, w.name or f"ev-{len(c._written)}")
    return writes


def test_a_repeated_cause_is_one_event_whose_count_rises() -> None:
    c = EventCorrelator()
    (first,) = _write(c, [LOST])
    assert (first.name, first.count, first.message) == (None, 1, LOST[2])
    # Four more trials lost the same way in one step, then one more in a later step.
    (again,) = _write(c, [LOST] * 4, now=5.0)
    (later,) = _write(c, [LOST], now=9.0)
    assert again.name == later.name == "ev-0" and (again.count, later.count) == (5, 6)
    # Another cause, or another reason, is another Event.
    other = _write(c, [("Warning", "InfraFailure", "a100: node lost"), ("Warning", "TargetFailed", "a100: x"), LOST])
    assert [(w.reason, w.name, w.count) for w in other] == [
        ("InfraFailure", None, 1), ("TargetFailed", None, 1), ("InfraFailure", "ev-0", 7)]


def test_many_different_messages_of_one_reason_are_combined_into_one_event() -> None:
    c = EventCorrelator()
    distinct = [("Normal", "Preempted", f"a100: trial Job j-{i} was preempted") for i in range(3 * SIMILAR_MAX)]
    writes = _write(c, distinct)
    single, combined = writes[:-1], writes[-1]
    assert len(single) == SIMILAR_MAX - 1 and all(w.count == 1 for w in single)
    assert combined.message == COMBINED + distinct[-1][2] and combined.count == 2 * SIMILAR_MAX + 1
    # Later ones (even a message seen before) keep counting on the combined Event, with the latest message.
    (more,) = _write(c, distinct[:2], now=60.0)
    assert more.name == "ev-9" and more.count == 2 * SIMILAR_MAX + 3 and more.message == COMBINED + distinct[1][2]
    # Quiet for longer than the window: messages stand on their own again.
    (fresh,) = _write(c, [distinct[0]], now=60.0 + SIMILAR_WINDOW_S + 1)
    assert fresh.message == distinct[0][2] and fresh.name == "ev-0" and fresh.count == 2


def test_an_event_that_could_not_be_written_starts_again() -> None:
    c = EventCorrelator()
    (w,) = c.correlate([LOST, LOST], 0.0)
    c.written(w, None)
    (again,) = c.correlate([LOST], 1.0)
    assert (again.name, again.count) == (None, 1)


def test_the_remembered_events_are_bounded() -> None:
    c = EventCorrelator(similar_max=1000, cache_max=3)
    _write(c, [("Normal", "R", str(i)) for i in range(5)])
    assert len(c._written) == 3
    (w,) = c.correlate([("Normal", "R", "0")], 1.0)
    assert w.name is None  # forgotten: a new Event, as client-go's LRU would
