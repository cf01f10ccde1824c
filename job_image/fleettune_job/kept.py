"""One problem's data and reference, kept across the configurations of a batch.

A batch's configurations all solve one problem. Drawing its data costs the CPU about
0.15 s at 4096 x 4096 and computing its float64 reference about 40 ms of GPU, both while
the Pod holds the GPU, so the last problem's are kept (one entry each; a user kernel's
initial data and its reference configuration's outputs alike). The data is kept on the
host only (:func:`data`): every configuration gets fresh device copies, so a faulty kernel
cannot change what the next one reads. The reference is kept on the device (:func:`check`);
a configuration it rejects is checked again against a fresh one (a faulty kernel may have
written over it), so keeping it never turns a correct configuration into an invalid one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# Same data for every trial of a run, so that every configuration solves the same problem.
DATA_SEED = 20240607
# The reference stays on the device only while it is this small a share of the free memory.
REFERENCE_SHARE = 0.25
# The data stays on the host only up to this size: a trial Pod's memory limit is 4 GiB, and
# a larger problem is drawn again for each configuration, as it always was.
DATA_MAX_BYTES = 256 << 20

_DATA: dict[tuple[Any, ...], dict[str, np.ndarray]] = {}
_REFERENCE: dict[tuple[Any, ...], Any] = {}


def draw(problem: Any, tensors: list[Any]) -> dict[str, np.ndarray]:
    """The problem's input data (host arrays), drawn from DATA_SEED: the same for every configuration."""
    rng = np.random.default_rng(DATA_SEED)
    return {t.name: problem.fill(t, rng) for t in tensors}


def data(key: tuple[Any, ...], make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The host data under ``key`` (``make`` draws it), kept (one entry) while at most DATA_MAX_BYTES."""
    kept = _DATA.get(key)
    if kept is None:
        _DATA.clear()
        kept = make()
        if sum(a.nbytes for a in kept.values()) <= DATA_MAX_BYTES:
            _DATA[key] = kept
    return kept


def check(cupy: Any, key: tuple[Any, ...], keep: bool, mismatch_in: Callable[[Any], str | None],
          fresh: Callable[[], Any], nbytes: Callable[[Any], int]) -> str | None:
    """``mismatch_in``'s verdict against the reference kept under ``key``; on a mismatch, or
    with none kept, against a ``fresh`` one, then kept when ``keep`` and it fits beside the
    candidate (``nbytes``)."""
    kept = _REFERENCE.get(key) if keep else None
    if kept is not None and mismatch_in(kept) is None:
        return None
    _REFERENCE.clear()
    expected = fresh()
    mismatch = mismatch_in(expected)
    if keep and fits_beside(cupy, nbytes(expected)):
        _REFERENCE[key] = expected
    return mismatch


def has_reference(key: tuple[Any, ...]) -> bool:
    """Whether a reference is kept under ``key``."""
    return key in _REFERENCE


def fits_beside(cupy: Any, nbytes: int) -> bool:
    """Whether ``nbytes`` of device arrays are a small enough share of the free memory to keep."""
    try:
        free = cupy.cuda.runtime.memGetInfo()[0] + cupy.get_default_memory_pool().free_bytes()
    except Exception:  # a runtime that cannot say: keep nothing
        return False
    return bool(nbytes <= REFERENCE_SHARE * free)
