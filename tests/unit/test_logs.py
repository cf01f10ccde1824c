"""The operator's and simulator's log lines: kopf's routine successes quiet, one record per line."""

from __future__ import annotations

import io
import logging
import warnings

import pytest

from fleettune import logs


@pytest.fixture
def captured():
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    stream = io.StringIO()
    yield stream
    root.handlers[:] = saved
    root.setLevel(level)
    logging.captureWarnings(False)


def _kopf_object_log(level: int, message: str) -> None:
    ref = {"apiVersion": "fleettune.dev/v1alpha1", "kind": "TuningRun", "name": "conv", "namespace": "ns"}
    logging.getLogger("kopf.objects").log(level, message, extra={"k8s_ref": ref})


def test_kopf_handler_successes_are_debug_and_ours_stay_info(captured):
    logs.setup(logging.INFO, captured)
    _kopf_object_log(logging.INFO, "Handler 'job_event' succeeded.")
    logging.getLogger("kopf.activities.startup").info("Activity 'configure' succeeded.")
    _kopf_object_log(logging.INFO, "Resuming is processed: 1 succeeded; 0 failed.")
    _kopf_object_log(logging.INFO, "Creation is processed: 0 succeeded; 1 failed.")
    _kopf_object_log(logging.WARNING, "Patching failed with inconsistencies")
    logging.getLogger("fleettune.controller").info("a100: trial 3 ok 0.55 ms")
    lines = captured.getvalue().splitlines()
    assert not any("succeeded." in line for line in lines)
    assert any("INFO kopf.objects: [ns/conv] Creation is processed: 0 succeeded; 1 failed." in line
               for line in lines)
    assert any("WARNING kopf.objects: [ns/conv] Patching failed" in line for line in lines)
    assert any("INFO fleettune.controller: a100: trial 3 ok" in line for line in lines)


def test_verbose_shows_them_at_debug(captured):
    logs.setup(logging.DEBUG, captured)
    _kopf_object_log(logging.INFO, "Handler 'job_event' succeeded.")
    assert "DEBUG kopf.objects: [ns/conv] Handler 'job_event' succeeded." in captured.getvalue()


def test_a_record_is_one_line_whatever_its_message(captured):
    logs.setup(logging.INFO, captured)
    body = '{"status": {"targets": [{"name": "a100", "best": {"config": {"block_size_x": 32}}}]}}'
    logging.getLogger("fleettune").info("patching %s\nwith\r\n%s", body, body)
    [line] = captured.getvalue().splitlines()
    assert line.count(body) == 2 and "\\n" in line


def test_python_warnings_are_one_line_records(captured):
    logs.setup(logging.INFO, captured)
    warnings.warn_explicit("`scipy_minimize` terminated\n  fit(mll, options={\"maxiter\": 50})", UserWarning,
                           "gp.py", 124)
    [line] = captured.getvalue().splitlines()
    assert "WARNING py.warnings: gp.py:124: UserWarning: `scipy_minimize` terminated" in line
