"""Shared fixtures for the search-space tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The recorded spaces live in the project's shared/ folder, beside the repository.
DATA = Path(os.environ.get("FLEETTUNE_SHARED_DATA") or Path(__file__).resolve().parents[4] / "shared" / "data")

GEMM_TUNE_PARAMS = {
    "MWG": [16, 32, 64, 128], "NWG": [16, 32, 64, 128], "KWG": [32], "MDIMC": [8, 16, 32], "NDIMC": [8, 16, 32],
    "MDIMA": [8, 16, 32], "NDIMB": [8, 16, 32], "KWI": [2], "VWM": [1, 2, 4, 8], "VWN": [1, 2, 4, 8], "STRM": [0],
    "STRN": [0], "SA": [0, 1], "SB": [0, 1], "PRECISION": [32],
}
# Kernel Tuner's CLBlast GEMM restrictions.
GEMM_RESTRICTIONS = [
    "KWG % KWI == 0",
    "MWG % (MDIMC * VWM) == 0",
    "NWG % (NDIMC * VWN) == 0",
    "MWG % (MDIMA * VWM) == 0",
    "NWG % (NDIMB * VWN) == 0",
    "KWG % ((MDIMC * NDIMC)/MDIMA) == 0",
    "KWG % ((MDIMC * NDIMC)/NDIMB) == 0",
]


@pytest.fixture
def data_dir() -> Path:
    if not (DATA / "spaces").is_dir():
        pytest.skip(f"recorded data folder {DATA} is absent (it ships with the shared workspace, not the repo)")
    return DATA


@pytest.fixture
def gemm_params() -> list[dict]:
    return [{"name": k, "type": "ordinal", "values": v} for k, v in GEMM_TUNE_PARAMS.items()]


@pytest.fixture
def gemm_restrictions() -> list[str]:
    return list(GEMM_RESTRICTIONS)
