"""The CUDA worker of a batch: one process, one CUDA context, configurations one at a time.

It takes the batch from ``FLEETTUNE_TRIAL``, finds the GPU and reports it (fingerprint and
limits) on the answer pipe, then runs each configuration the supervisor sends on stdin and
answers it on the pipe, one JSON document per line:

* supervisor -> worker: ``{"index": 3, "cubins": {"<build key>": ["/tmp/…/<key>.cubin", 0.42]}}``
* worker -> supervisor: ``{"hello": {"fingerprint": {...}, "limits": {...}}}`` or
  ``{"error": "no GPU: ..."}`` once; then ``{"index": 3, "result": "<TrialResult JSON>"}``.

It keeps a small progress file (phase, fingerprint) up to date, so that the supervisor,
which has to kill it at a configuration's deadline, can still say where it hung and on
which GPU. It ends at the end of stdin.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from fleettune_job import gpu, runner
from fleettune_job.classify import Phase, classify
from fleettune_job.fingerprint import device_limits
from fleettune_job.protocol import TRIAL_ENV, Batch, Fingerprint, Trial, TrialResult, infra_failure
from fleettune_job.watchdog import write_progress


def use_tmp_cupy_cache() -> None:
    # The image's root filesystem is read-only: cupy's kernel cache must live in /tmp.
    os.environ.setdefault("CUPY_CACHE_DIR", os.path.join(tempfile.gettempdir(), "cupy-cache"))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fleettune-job-batch-worker")
    parser.add_argument("--progress-file", type=Path, required=True)
    parser.add_argument("--answer-fd", type=int, required=True, help="the pipe the answers go to")
    return parser.parse_args(argv)


def send(out: TextIO, doc: dict[str, Any]) -> None:
    out.write(json.dumps(doc, separators=(",", ":")) + "\n")
    out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    use_tmp_cupy_cache()
    progress = partial(write_progress, args.progress_file)
    with os.fdopen(args.answer_fd, "w") as out:
        try:
            batch = Batch.from_env(os.environ[TRIAL_ENV])
        except (KeyError, ValueError) as exc:
            send(out, {"error": f"batch worker got no valid batch: {exc}"})
            return 0
        progress(Phase.DEVICE, Fingerprint())
        try:
            cupy = gpu.load_cupy()
            fingerprint = gpu.describe_device(cupy)
            limits = device_limits(cupy)
        except Exception as exc:
            send(out, {"error": classify(exc, Phase.DEVICE)[1]})
            return 0
        send(out, {"hello": {"fingerprint": fingerprint.model_dump(exclude_none=True), "limits": limits}})
        trials = {entry.index: batch.trial(entry) for entry in batch.entries}
        for line in sys.stdin:
            index, result = run_command(line, trials, progress, fingerprint)
            send(out, {"index": index, "result": result.encode()})
    return 0


def run_command(line: str, trials: dict[int, Trial], progress: runner.Progress,
                fingerprint: Fingerprint) -> tuple[int, TrialResult]:
    try:
        command = json.loads(line)
        index = int(command["index"])
        trial = trials[index]
        cubins = {key: (str(path), float(seconds)) for key, (path, seconds) in command.get("cubins", {}).items()}
    except (ValueError, KeyError, TypeError) as exc:
        return -1, infra_failure(f"batch worker got an invalid command: {exc!r}")
    gpu.use_cubins(cubins)
    return index, runner.run_trial(trial, progress=progress, fingerprint=fingerprint)


if __name__ == "__main__":
    sys.exit(main())
