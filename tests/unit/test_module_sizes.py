"""No module of the operator, the trial job or the development tools is over MAX_LINES
lines: each part has one concern and a newcomer reads it whole. A module that grows past
the limit is split by concern (as `fleettune.controller.logfollow` and `.deleter` left
`kube`, or `fleettune_dev.bench.timeline` became a package)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("operator/fleettune", "job_image/fleettune_job", "dev/fleettune_dev")
MAX_LINES = 450


def module_lines() -> dict[str, int]:
    return {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
            for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def test_no_module_is_over_the_limit() -> None:
    over = {path: n for path, n in module_lines().items() if n > MAX_LINES}
    assert not over, (f"over {MAX_LINES} lines: {over}; split each by concern into small modules "
                      "with one documented contract each")

