"""Chart tests: helm and promtool are built from the Go module proxy (cached like the control plane).

Each build runs once before the first test, outside any per-test timeout, and only when
a collected test needs the tool. It is never skipped: a machine that can run `make test`
has Go, and a chart that was not linted must not pass.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from chart_support import Helm

_tools: dict[str, Path] = {}
_errors: dict[str, str] = {}


def _progress(msg: str) -> None:
    stream = sys.__stderr__ or sys.stderr
    stream.write(f"[chart tools] {msg}\n")
    stream.flush()


def pytest_collection_finish(session: pytest.Session) -> None:
    from fleettune_dev.cluster.binaries import ensure_helm
    from fleettune_dev.cluster.promtool import ensure_promtool

    builders: dict[str, Callable[..., Path]] = {"helm": ensure_helm, "promtool": ensure_promtool}
    for name, build in builders.items():
        if not any(name in getattr(item, "fixturenames", ()) for item in session.items):
            continue
        try:
            _tools[name] = build(_progress)
        except Exception as exc:  # reported by the fixture, test by test
            _errors[name] = f"building {name} failed: {exc}"


def _tool(name: str) -> Path:
    if name in _errors:
        pytest.fail(_errors[name], pytrace=False)
    assert name in _tools, f"{name} was not built at collection"
    return _tools[name]


@pytest.fixture(scope="session")
def helm() -> Path:
    return _tool("helm")


@pytest.fixture(scope="session")
def promtool() -> Path:
    return _tool("promtool")


@pytest.fixture(scope="session")
def chart(helm: Path) -> Helm:
    return Helm(helm)
