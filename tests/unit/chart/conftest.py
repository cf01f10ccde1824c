"""Chart tests: helm is built from the Go module proxy (cached like the control plane).

The build runs once before the first test, outside any per-test timeout, and only when
a collected test needs helm. It is never skipped: a machine that can run `make test`
has Go, and a chart that was not linted must not pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from chart_support import Helm

_helm: Path | None = None
_error: str | None = None


def _progress(msg: str) -> None:
    stream = sys.__stderr__ or sys.stderr
    stream.write(f"[helm] {msg}\n")
    stream.flush()


def pytest_collection_finish(session: pytest.Session) -> None:
    global _helm, _error
    if not any("helm" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    from fleettune_dev.cluster.binaries import ensure_helm

    try:
        _helm = ensure_helm(_progress)
    except Exception as exc:  # reported by the fixture, test by test
        _error = f"building helm failed: {exc}"


@pytest.fixture(scope="session")
def helm() -> Path:
    if _error is not None:
        pytest.fail(_error, pytrace=False)
    assert _helm is not None
    return _helm


@pytest.fixture(scope="session")
def chart(helm: Path) -> Helm:
    return Helm(helm)
