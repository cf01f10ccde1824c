"""The distribution's metadata: the license as PEP 639 has it (an SPDX expression and the file
shipped), and the extras a plain install leaves out."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

from packaging.licenses import canonicalize_license_expression
from packaging.requirements import Requirement
from setuptools.config.pyprojecttoml import read_configuration

ROOT = Path(__file__).resolve().parents[2]
# The text of https://www.apache.org/licenses/LICENSE-2.0.txt, byte for byte.
APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"


def _project() -> dict:
    # setuptools' own reading, validated against the pyproject schema it ships.
    return read_configuration(ROOT / "pyproject.toml")["project"]


def test_the_license_is_an_spdx_expression_with_its_file():
    project = _project()
    assert isinstance(project["license"], str), "the deprecated `license = {text|file = ...}` table"
    assert canonicalize_license_expression(project["license"]) == project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert not [c for c in project.get("classifiers", []) if c.startswith("License ::")]  # PEP 639: not both
    raw = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert raw["license"] == "Apache-2.0" and raw["license-files"] == ["LICENSE"]


def test_the_license_file_is_the_apache_license_2_0():
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.md5(text).hexdigest() == APACHE_2_MD5
    assert b"Apache License\n                           Version 2.0, January 2004" in text


def _extra(name: str) -> dict[str, Requirement]:
    return {(r := Requirement(spec)).name.replace("-", "_").lower(): r
            for spec in _project()["optional-dependencies"][name]}


def test_the_report_figure_is_an_extra_and_the_tests_have_it():
    assert "matplotlib" not in {Requirement(s).name for s in _project()["dependencies"]}
    assert set(_extra("report")) == {"matplotlib"}
    dev = _extra("dev")
    assert "matplotlib" in dev
    # `fleettune export` is checked by Kernel Tuner itself (tests/unit/commands/test_export.py).
    assert "kernel_tuner" in dev
