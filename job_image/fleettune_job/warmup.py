"""Compile the kernels that verification uses once per process, in a trial's set-up phase.

Verification runs on the job's own kernels (:mod:`fleettune_job.verification`), compiled
once per process before its first configuration. Where they do not apply, cupy's array code
verifies, whose kernels cupy compiles at first use (6 to 8 s for a built-in's on an H200
with an empty CUPY_CACHE_DIR, as every trial Pod has): those compile here on a problem of
at most WARM_SIZE per dimension, so that the time is the Pod's start-up, not the first
configuration's GPU time (``run_s``), which sizes the pool's next batches (docs/decisions.md).
Best effort: a failure only leaves them to compile at first use.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fleettune_job import kept, verification
from fleettune_job.gpu import log
from fleettune_job.kernels.base import compare
from fleettune_job.prepare import Prepared, PreparedUser

WARM_SIZE = 64
# By verification: problem type, or a user kernel's output dtypes.
_WARMED: set[tuple[str, ...]] = set()


def warm_verification(cupy: Any, prepared: Prepared | PreparedUser) -> None:
    """Compile the kernels that verifying ``prepared`` uses, once per process, in the set-up
    phase: the job's own (``verification.load``), and cupy's array code only where those do not
    apply, on small arrays (see WARM_SIZE). Best effort: a failure only leaves them to
    compile at first use. A hang here is the node's fault, never a verdict."""
    if isinstance(prepared, PreparedUser):
        key: tuple[str, ...] = ("user", *sorted({str(out.dtype) for out in prepared.outputs}))
    else:
        key = (type(prepared.problem).__module__, type(prepared.problem).__qualname__)
    if key in _WARMED:
        return
    _WARMED.add(key)
    module = verification.load(cupy, log)
    started = time.monotonic()
    try:
        if isinstance(prepared, PreparedUser):
            uncovered = [out for out in prepared.outputs
                         if module is None or not verification.covers(out.dtype, out.dtype)]
            if not uncovered:
                return
            for out in uncovered:
                got = cupy.asarray(np.zeros(WARM_SIZE, dtype=out.dtype))
                compare(cupy, got, got.copy(), prepared.atol, prepared.rtol, nan_is_unwritten=False)
        else:
            problem = prepared.problem
            if module is not None and problem.reference_kernel:
                return
            size = [min(int(n), WARM_SIZE) for n in prepared.problem_size]
            data = kept.draw(problem, problem.inputs(size, prepared.config))
            inputs = {name: cupy.array(array) for name, array in data.items()}
            expected = problem.reference(cupy, inputs, size)
            # The output as a kernel leaves it (float32), through the host: no cast kernel to compile.
            got = cupy.asarray(np.asarray(cupy.asnumpy(expected), dtype=np.float32))
            compare(cupy, got, expected, problem.tolerance(size, prepared.config))
    except Exception as exc:
        log(f"cupy's verification kernels not compiled ahead ({type(exc).__name__}: {exc}): they compile at first use")
        return
    log(f"cupy's verification kernels compiled in {time.monotonic() - started:.2f} s (once per process)")
