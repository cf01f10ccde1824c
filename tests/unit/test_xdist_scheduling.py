"""`make test` runs pytest in two workers; every integration test must run in one of them,
against one control plane (tests/conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

RECORD = """
import os
def _record(name):
    with open(os.environ["WORKER_LOG"], "a") as fh:
        fh.write(f"{name} {os.environ.get('PYTEST_XDIST_WORKER', 'none')}\\n")
"""


def test_the_integration_tests_share_one_worker_and_the_unit_tests_spread(tmp_path):
    tree = tmp_path / "tests"
    for part, n in (("integration", 6), ("unit", 12)):
        (tree / part).mkdir(parents=True)
        body = RECORD + "".join(
            f"\ndef test_{part}_{i}():\n    import time; time.sleep(0.05); _record('{part}')\n" for i in range(n)
        )
        (tree / part / f"test_{part}.py").write_text(body)
    shutil.copy(TESTS / "conftest.py", tree / "conftest.py")
    log = tmp_path / "workers.log"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", "tests"],
        cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "WORKER_LOG": str(log)}, capture_output=True, text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = [line.split() for line in log.read_text().splitlines()]
    assert len(ran) == 18
    integration = {w for part, w in ran if part == "integration"}
    assert len(integration) == 1 and integration != {"none"}, ran
    assert {w for part, w in ran if part == "unit"} - integration, "the other worker ran no unit test"
