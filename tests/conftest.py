"""Shared test setup: the source roots are importable without an install."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for src in ("operator", "job_image", "dev"):
    path = str(ROOT / src)
    if path not in sys.path:
        sys.path.insert(0, path)
