"""Problem sizes: one type in code, one text form (pure).

A problem size is the dimensions of the problem a kernel solves, ``(4096, 4096)``. The
spec, the status, the stored records and the job protocol hold it as a JSON list; in code
it is a tuple, `ProblemSize`, because results are grouped by size (a dict key). Its text
form, `size_key`, is ``4096x4096``: it names a size in pool keys (``a100.4096x4096``, the
trials' target label), in the published ConfigMap's flat keys and in messages, so it is
made of characters every one of those accepts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import SupportsInt

ProblemSize = tuple[int, ...]

SEPARATOR = "x"
POOL_KEY_SEPARATOR = "."  # target names are DNS labels: they have no dots


def problem_size(value: Iterable[SupportsInt | str] | SupportsInt | str) -> ProblemSize:
    """A size as a tuple of ints, from a list or tuple (JSON, the spec, a record) or a bare
    number (a one-dimensional size, as Kernel Tuner caches may write it)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        return (int(value),)
    return tuple(int(v) for v in value)


def size_key(size: Sequence[int]) -> str:
    """``4096x4096``."""
    return SEPARATOR.join(str(int(s)) for s in size)


def _positive(parts: Sequence[str], text: str, expected: str) -> ProblemSize:
    try:
        size = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"problem size {text!r}: expected integers like {expected}") from None
    if not size or any(s <= 0 for s in size):
        raise ValueError(f"problem size {text!r}: expected positive integers like {expected}")
    return size


def parse_size_key(text: str) -> ProblemSize:
    """The size a `size_key` names; ValueError for anything else (``"4096,4096"``, ``"x8"``)."""
    return _positive(text.split(SEPARATOR) if text else [], text, "4096x4096")


def parse_size(text: str) -> ProblemSize:
    """A size as a person types it on a command line: ``2048,2048`` or ``2048x2048``."""
    parts = [p for p in text.replace(SEPARATOR, ",").split(",") if p.strip()]
    return _positive(parts, text, "2048,2048")


def pool_key(target: str, size: Sequence[int], several: bool) -> str:
    """What a run's trials of one target and problem size are labelled with: the target's
    name, or ``name.4096x4096`` when the run tunes several sizes."""
    return f"{target}{POOL_KEY_SEPARATOR}{size_key(size)}" if several else target


def target_of_key(key: str) -> str:
    """The target a `pool_key` belongs to."""
    return key.split(POOL_KEY_SEPARATOR, 1)[0]


def size_of_key(key: str) -> ProblemSize | None:
    """The size a `pool_key` names; None for a run that tunes one size (the key is the
    target's name alone)."""
    _, dot, text = key.partition(POOL_KEY_SEPARATOR)
    return parse_size_key(text) if dot else None
