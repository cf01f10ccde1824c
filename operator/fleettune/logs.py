"""Logging of fleettune's long-running processes (the operator, the fleet simulator).

One record per line, never wrapped: a log file is read with grep and by log shippers,
and a JSON value cut in two by a line break parses as neither half. kopf logs a line for
every handler that succeeds on every event of every watched object, at INFO: on a busy
fleet that is nearly all of an operator's log, burying what the operator itself reports.
Those routine lines are demoted to DEBUG (shown with ``--verbose``); kopf's warnings and
errors, and fleettune's own INFO lines, stay.
"""

from __future__ import annotations

import logging
import re
from typing import IO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# kopf's per-handler (and per-activity) and per-cause success lines
# (kopf/_core/actions/execution.py, kopf/_core/reactor/processing.py).
_ROUTINE = re.compile(r"(Handler|Activity) '[^']*' succeeded\.|.+ is processed: \d+ succeeded; 0 failed\.")


class QuietKopf(logging.Filter):
    """Demote kopf's routine success lines to DEBUG, then pass records at or above ``level``."""

    def __init__(self, level: int = logging.INFO) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.levelno == logging.INFO and record.name.startswith("kopf")
                and _ROUTINE.fullmatch(record.getMessage())):
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return record.levelno >= self.level


class OneLineFormatter(logging.Formatter):
    """The object a kopf record is about as a ``[namespace/name]`` prefix (as kopf's own
    formatter does), and line breaks inside a message escaped, so that a record is one line
    (a traceback still follows it on its own lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        original = message = record.message
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict) and ref.get("name"):
            where = f"{ref['namespace']}/{ref['name']}" if ref.get("namespace") else ref["name"]
            message = f"[{where}] {message}"
        record.message = message.replace("\r", "\\r").replace("\n", "\\n")
        try:
            return super().formatMessage(record)
        finally:
            record.message = original


def setup(level: int = logging.INFO, stream: IO[str] | None = None) -> logging.Handler:
    """Replace the root logger's handlers with one stream handler at ``level``; Python
    warnings (torch's, BoTorch's optimiser warnings) become records too, one line each."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(OneLineFormatter(FORMAT))
    handler.addFilter(QuietKopf(level))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    return handler
