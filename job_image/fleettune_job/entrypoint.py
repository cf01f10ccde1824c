"""``fleettune-job``: the container's entrypoint.

It reads the work (``FLEETTUNE_TRIAL``, or ``--trial`` / ``--trial-file`` for local use):
one trial, or a batch of configurations of one target.

For one trial it runs the trial in a worker process under a watchdog, writes exactly one
result document to the termination log and exits with the result's exit code. A batch
goes to :mod:`fleettune_job.batch`, which streams one answer per configuration into the
termination log.

Why a separate worker process: a hung kernel blocks its host thread inside the CUDA
driver, where no Python-level timer can interrupt it, and a kernel fault leaves the CUDA
context unusable. The supervisor (this process, PID 1 in the container) never touches
CUDA, so it can always kill the worker at the deadline, write a ``timeout`` result and
exit 14 itself; the kubelet then sees both the message and the exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import ValidationError

from fleettune_job.protocol import (
    TERMINATION_LOG,
    TRIAL_ENV,
    Batch,
    ProtocolError,
    Trial,
    TrialResult,
    decode,
    infra_failure,
)
from fleettune_job.watchdog import (
    POLL_S,
    Deadline,
    StopSignals,
    Terminated,
    death_result,
    kill,
    read_progress,
    terminated_result,
    timeout_result,
)

TERMINATION_LOG_ENV = "FLEETTUNE_TERMINATION_LOG"
WORKER_MODULE = "fleettune_job.worker"


class TrialInputError(ValueError):
    """No usable trial was given to the job."""

    def __init__(self, message: str, *, batch: bool = False) -> None:
        super().__init__(message)
        self.batch = batch  # the work was meant as a batch: its answer must be a batch result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fleettune-job",
        description="Compile, verify and time kernel configurations (one trial, or a batch of one target); "
                    "report the verdicts in the termination log.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--trial", metavar="JSON", help=f"the trial or batch as JSON (default: ${TRIAL_ENV})")
    source.add_argument("--trial-file", metavar="PATH", type=Path, help="read the trial or batch JSON from a file")
    parser.add_argument(
        "--termination-log", metavar="PATH", type=Path,
        help=f"where the result goes (default: ${TERMINATION_LOG_ENV} or {TERMINATION_LOG})",
    )
    parser.add_argument(
        "--in-process", action="store_true",
        help="run in this process without the watchdog (debugging; the timeout is not enforced)",
    )
    parser.add_argument("--list-kernels", action="store_true",
                        help="print the built-in kernels and their parameter spaces as JSON and exit")
    return parser.parse_args(argv)


def _work_text(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, str]:
    """The work's JSON text and where it came from."""
    if args.trial is not None:
        return args.trial, "--trial"
    if args.trial_file is not None:
        try:
            return args.trial_file.read_text(), str(args.trial_file)
        except OSError as exc:
            raise TrialInputError(f"cannot read {args.trial_file}: {exc.strerror or exc}") from None
    if environ.get(TRIAL_ENV):
        return environ[TRIAL_ENV], f"${TRIAL_ENV}"
    raise TrialInputError(f"no trial given (set ${TRIAL_ENV}, or pass --trial or --trial-file)")


def _invalid(what: str, where: str, exc: ValidationError) -> TrialInputError:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or what
    return TrialInputError(f"invalid {what} in {where}: {loc}: {first['msg']}", batch=what == "batch")


def _trial(text: str, where: str) -> Trial:
    try:
        return Trial.from_env(text)
    except ValidationError as exc:
        raise _invalid("trial", where, exc) from None


def _is_batch(text: str) -> bool:
    try:
        raw = json.loads(text)
    except ValueError:
        return False  # the trial parser reports it, as it always has
    return isinstance(raw, dict) and "entries" in raw


def load_trial(args: argparse.Namespace, environ: Mapping[str, str]) -> Trial:
    return _trial(*_work_text(args, environ))


def load_work(args: argparse.Namespace, environ: Mapping[str, str]) -> Trial | Batch:
    """One trial, or a batch (a document with ``entries``; see ``protocol.parse_work``)."""
    text, where = _work_text(args, environ)
    if not _is_batch(text):
        return _trial(text, where)
    try:
        return Batch.model_validate_json(text)
    except ValidationError as exc:
        raise _invalid("batch", where, exc) from None


def termination_log_path(args: argparse.Namespace, environ: Mapping[str, str]) -> Path:
    if args.termination_log is not None:
        return args.termination_log
    return Path(environ.get(TERMINATION_LOG_ENV) or TERMINATION_LOG)


def write_result(result: TrialResult, path: Path) -> None:
    """Write the one result document; also echo it on stdout for people running locally."""
    text = result.encode()
    try:
        with open(path, "w") as fh:
            fh.write(text)
    except OSError as exc:
        print(f"fleettune-job: cannot write termination log {path}: {exc}", file=sys.stderr, flush=True)
    print(text, flush=True)


def supervise(trial: Trial, python: str = sys.executable, worker_module: str | None = None,
              extra_env: Mapping[str, str] | None = None) -> TrialResult:
    """Run the trial in a worker process; kill it at ``trial.timeout_s`` after its start-up
    (see :class:`~fleettune_job.watchdog.Deadline`)."""
    started = time.monotonic()
    worker_module = worker_module or WORKER_MODULE
    with tempfile.TemporaryDirectory(prefix="fleettune-") as tmp:
        result_file = Path(tmp, "result.json")
        progress_file = Path(tmp, "progress.json")
        deadline = Deadline(started, trial.timeout_s, progress_file)
        env = dict(os.environ) | dict(extra_env or {}) | {TRIAL_ENV: trial.to_env()}
        cmd = [python, "-m", worker_module, "--result-file", str(result_file),
               "--progress-file", str(progress_file)]
        proc: subprocess.Popen[bytes] | None = None
        try:
            with StopSignals():
                proc = subprocess.Popen(cmd, env=env)
                while True:
                    now = time.monotonic()
                    left = deadline.update(now) - now
                    if left <= 0:
                        raise subprocess.TimeoutExpired(cmd, trial.timeout_s)
                    try:
                        proc.wait(timeout=min(left, POLL_S))
                        break
                    except subprocess.TimeoutExpired:
                        continue
        except subprocess.TimeoutExpired:
            kill(proc)
            return timeout_result(trial.timeout_s, *read_progress(progress_file))
        except Terminated as exc:
            kill(proc)
            return terminated_result(exc, *read_progress(progress_file))

        if result_file.exists():
            try:
                return decode(result_file.read_text())
            except (OSError, ProtocolError) as exc:
                return infra_failure(f"worker wrote an invalid result: {exc}")
        return death_result(proc.returncode, *read_progress(progress_file))


def list_kernels() -> str:
    from fleettune_job.kernels import BUILTINS

    return json.dumps({name: k.describe() for name, k in BUILTINS.items()}, indent=2)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_kernels:
        print(list_kernels())
        return 0
    log_path = termination_log_path(args, os.environ)
    try:
        work = load_work(args, os.environ)
    except TrialInputError as exc:
        if exc.batch:
            from fleettune_job.batch import BatchLog

            return BatchLog(log_path).finish(error=str(exc)).exit_code
        result = infra_failure(str(exc))
    else:
        if isinstance(work, Batch):
            from fleettune_job import batch
            from fleettune_job.ahead import AheadOptions

            if args.in_process:
                return batch.run_in_process(work, log_path).exit_code
            return batch.run_batch(work, log_path, ahead=AheadOptions.from_environment(os.environ)).exit_code
        if args.in_process:
            from fleettune_job.runner import run_trial

            result = run_trial(work)
        else:
            result = supervise(work)
    write_result(result, log_path)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
