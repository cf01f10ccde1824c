"""Recorded search spaces in and out: Kernel Tuner caches, T4 results, T1 specs.

* `read_kernel_tuner_cache` / `write_kernel_tuner_cache` (``.json`` or ``.json.gz``; unterminated
  caches of interrupted runs are repaired),
* `read_t4` / `write_t4` (the auto-tuning community's results schema),
* `read_t1_spec` (the community's search-space description: parameters and conditions).

The Kernel Tuner and T4 formats live in the runtime package (`fleettune.space.kernel_tuner`,
`fleettune.space.t4`): `fleettune predict --cache` reads caches and `fleettune export` writes
both. T1 specs are read here only.

Readers return a `RecordedSpace` (space + records + rows); writers take one back, or a space and
records. Recorded failures are "compile", "runtime" or "invalid" (see `records`).
"""

from fleettune.space.kernel_tuner import read_kernel_tuner_cache, write_kernel_tuner_cache
from fleettune.space.records import FAILURES, Record, RecordedSpace
from fleettune.space.t4 import read_t4, write_t4
from fleettune_dev.interop.t1 import T1Spec, read_t1_spec

__all__ = [
    "FAILURES",
    "Record",
    "RecordedSpace",
    "T1Spec",
    "read_kernel_tuner_cache",
    "read_t1_spec",
    "read_t4",
    "write_kernel_tuner_cache",
    "write_t4",
]
