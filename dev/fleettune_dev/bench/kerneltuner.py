"""Kernel Tuner itself on a recorded space: its simulation mode replays a cache file, so
its own strategies choose what to evaluate and the recording answers. The timeline
(`kernel_tuner:<strategy>` modes) puts that order on a clock; `bench strategy --peer`
scores it per evaluation.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import random
import unittest.mock
import warnings
from collections.abc import Collection
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np


class KernelTunerCache:
    """The decompressed copy of a cache that Kernel Tuner reads (it wants a ``.json``
    path), with its parameters in the order of the file's own keys."""

    def __init__(self, source: Path, keys: list[str], directory: Path) -> None:
        raw = source.read_bytes()
        text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
        self.data = json.loads(text)
        self.path = directory / (source.name.split(".")[0] + ".json")
        self.path.write_text(text)
        self.keys = list(self.data.get("tune_params_keys") or self.data["tune_params"])
        if self.keys != keys:
            raise ValueError(f"{source.name}: parameter order differs from the parsed space")
        # Every recorded key, failures included: the files hold exactly the restricted
        # space, and a configuration that failed still costs Kernel Tuner its compile
        # (kernel_tuner.util.infer_restrictions_from_cache would drop failures and let
        # Kernel Tuner skip them for free).
        self.recorded = {tuple(e[k] for k in self.keys) for e in self.data["cache"].values()}

    def tune(self, strategy: str, seed: int, budget: int,
             space: Collection[tuple[Any, ...]] | None = None) -> list[dict[str, Any]]:
        """Kernel Tuner's results, in its evaluation order, of ``strategy`` with at most
        ``budget`` evaluations on ``space`` (value tuples in ``keys`` order; the recorded
        configurations by default). Kernel Tuner's ``seed`` argument is unused in 1.5: its
        strategies draw from the global ``random`` and ``numpy.random`` generators, so both
        are seeded, and bayes_opt's Latin hypercube from a generator of its own, which is
        given one seeded alike (otherwise no two replays of a seed would agree)."""
        from constraint import FunctionConstraint
        from kernel_tuner import tune_kernel
        from kernel_tuner.strategies import bayes_opt
        from scipy.stats.qmc import LatinHypercube

        valid = self.recorded if space is None else space

        def recorded(*values: Any) -> bool:
            return values in valid

        size = self.data["problem_size"]
        problem_size = tuple(size) if isinstance(size, list) else (size,)
        random.seed(seed)
        np.random.seed(seed)
        rng = np.random.default_rng(seed)
        with (warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()),
              unittest.mock.patch.object(bayes_opt, "LatinHypercube", partial(LatinHypercube, rng=rng))):
            warnings.simplefilter("ignore")
            results, _ = tune_kernel(
                self.data["kernel_name"], "/* replayed from the cache */", problem_size, [],
                {k: self.data["tune_params"][k] for k in self.keys},
                restrictions=[FunctionConstraint(recorded)], cache=str(self.path), simulation_mode=True,
                strategy=strategy, strategy_options={"max_fevals": budget}, quiet=True,
            )
        return list(results)
