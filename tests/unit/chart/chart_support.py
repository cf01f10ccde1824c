"""Helpers of the chart tests (a module with a unique name, importable from the tests)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[3] / "charts" / "fleettune"
VALUES = Path(__file__).resolve().parent / "values"
# Helm's limit on a release name; every name the chart makes must still fit in 63.
LONGEST_RELEASE = "a-release-name-of-fifty-three-characters-for-the-test"


class Helm:
    def __init__(self, binary: Path) -> None:
        self.binary = binary

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.binary), *args], capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
        return proc

    def template(self, *values: str, sets: tuple[str, ...] = (), namespace: str = "fleettune",
                 extra: tuple[str, ...] = (), release: str = "ft") -> list[dict[str, Any]]:
        args = ["template", release, str(CHART), "--namespace", namespace, *extra]
        for v in values:
            args += ["-f", str(VALUES / v)]
        for s in sets:
            args += ["--set", s]
        return [d for d in yaml.safe_load_all(self.run(*args).stdout) if d]


# PromQL words that look like metric names but are not.
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
    "inf", "nan", "le",
}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (or a Grafana label_values() query)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings: label values, regexes
    s = re.sub(r"\{[^}]*\}", "", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", "", s)  # range selectors and $__rate_interval
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)  # grouping labels
    s = re.sub(r"label_values\(([^,()]+),[^)]*\)", r"\1", s)  # label_values(metric, label): keep the metric
    s = re.sub(r"\$\w+", "", s)  # Grafana variables
    s = re.sub(r"(?<![\w.])\d+(\.\d+)?(ms|[smhdwy])?\b", " ", s)  # numbers and durations (offset 30m)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word, rest = m.group(0), s[m.end():]
        if rest.lstrip().startswith("(") or word.lower() in KEYWORDS:
            continue  # a function or aggregation, or a keyword
        names.add(word)
    return names
