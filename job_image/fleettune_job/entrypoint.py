"""``fleettune-job``: the container's entrypoint.

It reads the trial (``FLEETTUNE_TRIAL``, or ``--trial`` / ``--trial-file`` for local use),
runs it in a worker process under a watchdog, writes exactly one result document to the
termination log and exits with the result's exit code.

Why a separate worker process: a hung kernel blocks its host thread inside the CUDA
driver, where no Python-level timer can interrupt it, and a kernel fault leaves the CUDA
context unusable. The supervisor (this process, PID 1 in the container) never touches
CUDA, so it can always kill the worker at the deadline, write a ``timeout`` result and
exit 14 itself; the kubelet then sees both the message and the exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from pydantic import ValidationError

from fleettune_job.classify import Phase, short
from fleettune_job.protocol import (
    TERMINATION_LOG,
    TRIAL_ENV,
    Fingerprint,
    Outcome,
    ProtocolError,
    Trial,
    TrialResult,
    decode,
    infra_failure,
)

TERMINATION_LOG_ENV = "FLEETTUNE_TERMINATION_LOG"
WORKER_MODULE = "fleettune_job.worker"
# Time the worker gets to exit after SIGKILL before we stop waiting for it.
REAP_TIMEOUT_S = 10.0
# Phases before the kernel exists, and the reference's run: a timeout there is not the
# configuration's fault.
_INFRA_PHASES = {Phase.DEVICE, Phase.SETUP, Phase.ALLOCATE, Phase.REFERENCE}


class TrialInputError(ValueError):
    """No usable trial was given to the job."""


class Terminated(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fleettune-job",
        description="Compile, verify and time one kernel configuration; report one result document.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--trial", metavar="JSON", help=f"the trial as JSON (default: ${TRIAL_ENV})")
    source.add_argument("--trial-file", metavar="PATH", type=Path, help="read the trial JSON from a file")
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


def load_trial(args: argparse.Namespace, environ: Mapping[str, str]) -> Trial:
    if args.trial is not None:
        text, where = args.trial, "--trial"
    elif args.trial_file is not None:
        try:
            text = args.trial_file.read_text()
        except OSError as exc:
            raise TrialInputError(f"cannot read {args.trial_file}: {exc.strerror or exc}") from None
        where = str(args.trial_file)
    elif environ.get(TRIAL_ENV):
        text, where = environ[TRIAL_ENV], f"${TRIAL_ENV}"
    else:
        raise TrialInputError(f"no trial given (set ${TRIAL_ENV}, or pass --trial or --trial-file)")
    try:
        return Trial.from_env(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "trial"
        raise TrialInputError(f"invalid trial in {where}: {loc}: {first['msg']}") from None


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


def _read_progress(path: Path) -> tuple[Phase | None, Fingerprint]:
    try:
        raw = json.loads(path.read_text())
        return Phase(raw["phase"]), Fingerprint.model_validate(raw.get("fingerprint", {}))
    except (OSError, ValueError, KeyError, TypeError, ValidationError):
        return None, Fingerprint()


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def supervise(trial: Trial, python: str = sys.executable, worker_module: str | None = None,
              extra_env: Mapping[str, str] | None = None) -> TrialResult:
    """Run the trial in a worker process; kill it at ``trial.timeout_s``."""
    deadline = time.monotonic() + trial.timeout_s
    worker_module = worker_module or WORKER_MODULE
    with tempfile.TemporaryDirectory(prefix="fleettune-") as tmp:
        result_file = Path(tmp, "result.json")
        progress_file = Path(tmp, "progress.json")
        env = dict(os.environ) | dict(extra_env or {}) | {TRIAL_ENV: trial.to_env()}
        cmd = [python, "-m", worker_module, "--result-file", str(result_file),
               "--progress-file", str(progress_file)]
        previous = {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGINT)}
        proc: subprocess.Popen[bytes] | None = None
        try:
            proc = subprocess.Popen(cmd, env=env)
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(proc)
            phase, fingerprint = _read_progress(progress_file)
            where = f" while in phase {phase}" if phase else ""
            outcome = Outcome.INFRA_ERROR if phase in _INFRA_PHASES or phase is None else Outcome.TIMEOUT
            return TrialResult(outcome=outcome, fingerprint=fingerprint,
                               error=f"no result within the {trial.timeout_s:g} s timeout{where}; worker killed")
        except Terminated as exc:
            _kill(proc)
            phase, fingerprint = _read_progress(progress_file)
            where = f" while in phase {phase}" if phase else ""
            # Eviction, node drain or the Job's own deadline: never the configuration's fault.
            return TrialResult(outcome=Outcome.INFRA_ERROR, fingerprint=fingerprint,
                               error=f"terminated by {exc}{where}")
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

        if result_file.exists():
            try:
                return decode(result_file.read_text())
            except (OSError, ProtocolError) as exc:
                return infra_failure(f"worker wrote an invalid result: {exc}")
        phase, fingerprint = _read_progress(progress_file)
        code = proc.returncode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        where = f" in phase {phase}" if phase else ""
        hint = " (out of memory?)" if code == -signal.SIGKILL else ""
        return TrialResult(outcome=Outcome.INFRA_ERROR, fingerprint=fingerprint,
                           error=short(f"worker {how}{hint}{where} without a result"))


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.kill()
    # A process stuck in an uninterruptible driver call may not die: the container's exit reaps it.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=REAP_TIMEOUT_S)


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
        trial = load_trial(args, os.environ)
    except TrialInputError as exc:
        result = infra_failure(str(exc))
    else:
        if args.in_process:
            from fleettune_job.runner import run_trial

            result = run_trial(trial)
        else:
            result = supervise(trial)
    write_result(result, log_path)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
