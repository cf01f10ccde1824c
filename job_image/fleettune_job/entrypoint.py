"""``fleettune-job``: the container's entrypoint.

It reads the batch to measure (``FLEETTUNE_TRIAL``, or ``--trial`` / ``--trial-file`` for
local use): configurations of one target, one of them or several. :mod:`fleettune_job.batch`
measures them and streams one answer per configuration into the termination log; the
container exits 0 once every configuration is answered, 20 when it stopped early.

Work it cannot read is answered as a batch that stopped before its first configuration
(exit 20): the operator measures those configurations again, never records them as invalid.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import ValidationError

from fleettune_job.protocol import TERMINATION_LOG, TRIAL_ENV, Batch

TERMINATION_LOG_ENV = "FLEETTUNE_TERMINATION_LOG"


class TrialInputError(ValueError):
    """No usable batch was given to the job."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fleettune-job",
        description="Compile, verify and time a batch of kernel configurations of one target; "
                    "report the verdicts in the termination log.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--trial", metavar="JSON", help=f"the batch as JSON (default: ${TRIAL_ENV})")
    source.add_argument("--trial-file", metavar="PATH", type=Path, help="read the batch JSON from a file")
    parser.add_argument(
        "--termination-log", metavar="PATH", type=Path,
        help=f"where the verdicts go (default: ${TERMINATION_LOG_ENV} or {TERMINATION_LOG})",
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
    raise TrialInputError(f"no batch given (set ${TRIAL_ENV}, or pass --trial or --trial-file)")


def load_batch(args: argparse.Namespace, environ: Mapping[str, str]) -> Batch:
    text, where = _work_text(args, environ)
    try:
        return Batch.from_env(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "batch"
        raise TrialInputError(f"invalid batch in {where}: {loc}: {first['msg']}") from None


def termination_log_path(args: argparse.Namespace, environ: Mapping[str, str]) -> Path:
    if args.termination_log is not None:
        return args.termination_log
    return Path(environ.get(TERMINATION_LOG_ENV) or TERMINATION_LOG)


def list_kernels() -> str:
    from fleettune_job.kernels import BUILTINS

    return json.dumps({name: k.describe() for name, k in BUILTINS.items()}, indent=2)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_kernels:
        print(list_kernels())
        return 0
    log_path = termination_log_path(args, os.environ)
    from fleettune_job import batch

    try:
        work = load_batch(args, os.environ)
    except TrialInputError as exc:
        return batch.BatchLog(log_path).finish(error=str(exc)).exit_code
    if args.in_process:
        return batch.run_in_process(work, log_path).exit_code
    from fleettune_job.ahead import AheadOptions

    return batch.run_batch(work, log_path, ahead=AheadOptions.from_environment(os.environ)).exit_code


if __name__ == "__main__":
    sys.exit(main())
