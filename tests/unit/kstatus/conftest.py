"""kstatus (sigs.k8s.io/cli-utils) is built from the Go module proxy, cached like helm and
the control plane (fleettune_dev.cluster.kstatus), before the first test that needs it and
outside any per-test timeout. Never skipped: a machine that runs `make test` has Go."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_kstatus: Path | None = None
_error: str | None = None


def _progress(msg: str) -> None:
    stream = sys.__stderr__ or sys.stderr
    stream.write(f"[kstatus] {msg}\n")
    stream.flush()


def pytest_collection_finish(session: pytest.Session) -> None:
    global _kstatus, _error
    if not any("kstatus" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    from fleettune_dev.cluster.kstatus import ensure_kstatus

    try:
        _kstatus = ensure_kstatus(_progress)
    except Exception as exc:  # reported by the fixture, test by test
        _error = f"building kstatus failed: {exc}"


@pytest.fixture(scope="session")
def kstatus() -> Path:
    if _error is not None:
        pytest.fail(_error, pytrace=False)
    assert _kstatus is not None
    return _kstatus
