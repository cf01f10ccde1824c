"""Bounded text and names derived from user input (pure).

Everything a user controls — run names (up to 253 characters), node selectors, parameter
values, error texts that echo them — ends up in labels, object names, the status, Events
and logs. Each of those has a limit (a label value 63 characters, an object 1.5 MiB in
etcd, an Event message 1 KiB) that a write exceeding it does not survive: the write is
refused, and a run whose status cannot be written never shows what is wrong. So text goes
through :func:`bounded` (readable, cut with a note of how much was cut) and names and
label values through :func:`label_value` / :func:`child_name` (cut *and* made unique with
a hash, since two cut names may otherwise collide). A name the user got wrong is answered
with the closest one they may have meant (:func:`did_you_mean`).
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Iterable

MESSAGE_MAX = 1000  # a status message or condition: readable in `kubectl describe`
LABEL_MAX = 63
NAME_MAX = 253  # a DNS subdomain: ConfigMap names
INT64_MAX = 2**63 - 1  # the API server's integers (a CRD's `type: integer`) are int64

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def bounded(text: object, limit: int = MESSAGE_MAX) -> str:
    """``text`` as a string of at most ``limit`` characters; when cut, it ends saying how many
    characters were left out (so a reader knows it is not the whole story)."""
    s = str(text)
    if len(s) <= limit:
        return s
    # The note's length with the count's widest possible value, so the result fits.
    keep = max(limit - len(f"… ({len(s)} more characters)"), 0)
    return (s[:keep] + f"… ({len(s) - keep} more characters)")[:limit]


def short_hash(text: str, length: int = 10) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def label_value(text: str) -> str:
    """A valid label value that stands for ``text``: ``text`` itself when it is one (so short
    names read, and select, as before), else its first characters and a hash of all of it."""
    if len(text) <= LABEL_MAX and _LABEL_VALUE.match(text):
        return text
    head = re.sub(r"[^-A-Za-z0-9_.]", "_", text[: LABEL_MAX - 11]).rstrip("-_.")
    head = head.lstrip("-_.")
    return f"{head}-{short_hash(text)}" if head else short_hash(text)


def child_name(parent: str, unique: str, suffix: str, limit: int = NAME_MAX) -> str:
    """The name of an object a run owns: ``<parent>-<hash of unique>-<suffix>``, cut to
    ``limit``. ``unique`` is what tells owners apart (the run's uid): two runs whose names
    share their first characters, or a re-created run whose old objects are still being
    garbage-collected, never share an object."""
    tail = f"-{short_hash(unique, 8)}-{suffix}"
    head = parent[: max(limit - len(tail), 1)].rstrip("-.")
    return f"{head}{tail}"


def did_you_mean(word: str, known: Iterable[str], shown: str = "{!r}") -> str:
    """`` (did you mean 'x'?)`` for the known name closest to a misspelt ``word`` (``shown``
    formats it), or ``""`` when none is close: one form for every error that names a
    parameter, type, device attribute or strategy option that does not exist."""
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {shown.format(close[0])}?)" if close else ""
