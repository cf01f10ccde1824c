"""Which Event a run's report writes, as Kubernetes' own event recorder decides it (pure).

A cause that repeats (a pool's trials lost to the same infrastructure failure, one per
trial) must not bury `kubectl describe` under one Event each. client-go's
``EventCorrelator`` does two things, and so does this:

* **series**: an Event that repeats one already written (same run, type, reason and
  message) updates it: ``count`` rises, ``lastTimestamp`` moves (`kubectl describe`
  shows "x12 over 5m");
* **aggregation**: past ``SIMILAR_MAX`` different messages of one (type, reason) within
  ``SIMILAR_WINDOW_S`` of each other, further ones go to one Event whose message is
  "(combined from similar events): " and the latest message, counted the same way.

A correlator belongs to one run (one involved object). It remembers only what this
process wrote: after a restart the next occurrence starts a new Event, as client-go's does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

Event = tuple[str, str, str]  # (type, reason, message)
Key = tuple[str, str, str]  # (type, reason, message, or "" for the combined Event)

# client-go's defaults (k8s.io/client-go/tools/record: defaultAggregateMaxEvents,
# defaultAggregateIntervalInSeconds, maxLruCacheEntries).
SIMILAR_MAX = 10
SIMILAR_WINDOW_S = 600.0
CACHE_MAX = 4096
COMBINED = "(combined from similar events): "


@dataclass(frozen=True)
class EventWrite:
    """One Event to write: a new one (``name`` None) or the Event ``name`` updated to
    ``count`` occurrences (and ``message``, the latest, for a combined Event)."""

    type: str
    reason: str
    message: str
    count: int
    name: str | None
    key: Key


@dataclass
class _Similar:
    last: float
    messages: set[str]


class EventCorrelator:
    def __init__(self, similar_max: int = SIMILAR_MAX, window_s: float = SIMILAR_WINDOW_S,
                 cache_max: int = CACHE_MAX) -> None:
        self.similar_max, self.window_s, self.cache_max = similar_max, window_s, cache_max
        self._similar: dict[tuple[str, str], _Similar] = {}
        self._written: OrderedDict[Key, tuple[str, int]] = OrderedDict()  # key -> (Event name, count)

    def correlate(self, events: Sequence[Event], now: float) -> list[EventWrite]:
        """The writes for ``events`` (in order, one per Event touched), at monotonic time
        ``now``. Call `written` with each write's outcome."""
        pending: dict[Key, tuple[str, int]] = {}  # the latest message, and how many times
        for type_, reason, message in events:
            key, text = self._aggregate(type_, reason, message, now)
            pending[key] = (text, pending.get(key, ("", 0))[1] + 1)
        writes = []
        for key, (text, n) in pending.items():
            name, count = self._written.get(key, (None, 0))
            writes.append(EventWrite(key[0], key[1], text, count + n, name, key))
        return writes

    def written(self, write: EventWrite, name: str | None) -> None:
        """``write`` was written as the Event ``name``; None: it failed (the next occurrence
        starts again)."""
        if name is None:
            self._written.pop(write.key, None)
            return
        self._written[write.key] = (name, write.count)
        self._written.move_to_end(write.key)
        while len(self._written) > self.cache_max:
            self._written.popitem(last=False)

    def _aggregate(self, type_: str, reason: str, message: str, now: float) -> tuple[Key, str]:
        similar = self._similar.get((type_, reason))
        if similar is None or now - similar.last > self.window_s:
            similar = self._similar[(type_, reason)] = _Similar(now, set())
        similar.last = now
        if len(similar.messages) < self.similar_max:
            similar.messages.add(message)
            if len(similar.messages) < self.similar_max:
                return (type_, reason, message), message
        return (type_, reason, ""), COMBINED + message
