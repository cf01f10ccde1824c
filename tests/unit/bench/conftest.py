"""The benchmarks set torch's thread count for the whole process (`--threads`): each test
here gets it back as it found it, so that the studies of later tests fit with the same
arithmetic, and pick the same, whichever tests ran before them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _torch_threads_restored() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
