"""The worker process the entrypoint supervises: runs the trial, writes its result to a file.

It also keeps a small progress file (current phase and device fingerprint) up to date,
so that a supervisor that has to kill it at the deadline can still say where it hung and
on which GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from fleettune_job.classify import Phase
from fleettune_job.protocol import TRIAL_ENV, Fingerprint, Trial, infra_failure
from fleettune_job.watchdog import atomic_write, write_progress


def use_tmp_cupy_cache() -> None:
    # The image's root filesystem is read-only: cupy's kernel cache must live in /tmp.
    os.environ.setdefault("CUPY_CACHE_DIR", os.path.join(tempfile.gettempdir(), "cupy-cache"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleettune-job-worker")
    parser.add_argument("--result-file", type=Path, required=True)
    parser.add_argument("--progress-file", type=Path, required=True)
    args = parser.parse_args(argv)

    use_tmp_cupy_cache()

    def progress(phase: Phase, fingerprint: Fingerprint) -> None:
        write_progress(args.progress_file, phase, fingerprint)

    try:
        trial = Trial.from_env(os.environ[TRIAL_ENV])
    except (KeyError, ValueError) as exc:
        result = infra_failure(f"worker got no valid trial: {exc}")
    else:
        from fleettune_job.runner import run_trial

        result = run_trial(trial, progress=progress)
    atomic_write(args.result_file, result.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
