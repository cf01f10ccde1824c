"""Helpers of the chart tests (a module with a unique name, importable from the tests)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[3] / "charts" / "fleettune"
VALUES = Path(__file__).resolve().parent / "values"


class Helm:
    def __init__(self, binary: Path) -> None:
        self.binary = binary

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.binary), *args], capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
        return proc

    def template(self, *values: str, sets: tuple[str, ...] = (), namespace: str = "fleettune",
                 extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        args = ["template", "ft", str(CHART), "--namespace", namespace, *extra]
        for v in values:
            args += ["-f", str(VALUES / v)]
        for s in sets:
            args += ["--set", s]
        return [d for d in yaml.safe_load_all(self.run(*args).stdout) if d]
