"""The job's own verification kernels (verify.cu) in the C++ emulation of CUDA: they count
exactly what the array code's comparison counts, and compute exactly the built-ins'
references, so which path checked a configuration never changes its verdict."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_job_user_runner import CXX, EmuCupy

from fleettune_job import nvrtc, verification
from fleettune_job.kept import DATA_SEED
from fleettune_job.kernels import BUILTINS
from fleettune_job.kernels.base import compare

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler to build the CUDA emulation")

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> EmuCupy:
    return EmuCupy(tmp_path_factory.mktemp("emu"), {})


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verification, "_MODULE", {})


def _long_pair() -> tuple[np.ndarray, np.ndarray]:
    """3,000 elements, over many blocks of the count: two wrong, the later one found first by its block."""
    expected = np.arange(3000, dtype=np.float64)
    got = expected.astype(np.float32)
    got[[1500, 2999]] = -1
    return got, expected


CASES: list[tuple[str, Any, Any, float, float, bool]] = [
    ("equal", np.array([1, 2, 3], np.float32), np.array([1, 2, 3], np.float64), 0.0, 0.0, True),
    ("unwritten NaN", np.array([1, NAN, 3, NAN], np.float32), np.array([1, 2, 4, 4], np.float64), 0.0, 0.0, True),
    ("NaN not counted", np.array([1, NAN], np.float32), np.array([1, 2], np.float64), 0.0, 0.0, False),
    ("at the tolerance", np.array([1.5, 2.0], np.float32), np.array([1.0, 2.0], np.float64), 0.5, 0.0, True),
    ("past the tolerance", np.array([1.5, 2.0], np.float32), np.array([0.9, 2.0], np.float64), 0.5, 0.0, True),
    ("relative", np.array([1000.5, 1.0], np.float32), np.array([1000, 1.1], np.float64), 1e-6, 1e-4, True),
    ("infinities", np.array([INF, -INF, 5.0, INF], np.float32), np.array([INF, INF, INF, 1e30], np.float64),
     1.0, 1.0, True),
    ("NaN expected", np.array([NAN, 1.0], np.float64), np.array([NAN, NAN], np.float64), 1.0, 0.0, False),
    ("int32", np.array([7, -3, 9], np.int32), np.array([7, -2, 9], np.int32), 0.0, 0.0, False),
    ("uint8", np.array([3, 250], np.uint8), np.array([3, 251], np.uint8), 0.0, 0.0, False),
    ("int64 within atol", np.array([10, 20], np.int64), np.array([11, 20], np.int64), 1.0, 0.0, False),
    ("2D", np.array([[1, 2], [3, 4]], np.float32), np.array([[1, 2], [3, 5]], np.float64), 0.0, 0.0, True),
    ("many blocks", *_long_pair(), 0.0, 0.0, True),
]


@pytest.mark.parametrize(("got", "expected", "atol", "rtol", "unwritten"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_count_agrees_with_the_array_codes_comparison(emu: EmuCupy, got: np.ndarray, expected: np.ndarray,
                                                          atol: float, rtol: float, unwritten: bool) -> None:
    assert verification.covers(got.dtype, expected.dtype)
    before = len(emu.checks)
    with np.errstate(invalid="ignore", over="ignore"):
        want = compare(np, got, expected, atol, rtol, nan_is_unwritten=unwritten)
    assert verification.mismatch(emu, got, expected, atol, rtol, nan_is_unwritten=unwritten) == want
    assert emu.checks[before:] == [(f"count_mismatches_{got.dtype.name}_{expected.dtype.name}", verification.OPTIONS)]


REFERENCES = [
    ("convolution", {"filter_height": 5, "filter_width": 3}, [40, 26], None),
    ("convolution", {}, [19, 17], None),  # the recorded 15 x 15 filter
    ("gemm", {}, [33, 20, 17], None),
    ("scan", {}, [301, 4], None),
    # A grid of one block row striding over all of them (as beyond 65535 block rows).
    ("convolution", {"filter_height": 3, "filter_width": 5}, [21, 40], 1),
    ("gemm", {}, [35, 9, 20], 1),
    ("scan", {}, [7, 40], 1),
]


@pytest.mark.parametrize(("name", "config", "problem_size", "max_grid_y"), REFERENCES,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(REFERENCES)])
def test_the_reference_kernels_compute_the_array_codes_reference(emu: EmuCupy, name: str, config: dict[str, int],
                                                                 problem_size: list[int], max_grid_y: int | None,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    if max_grid_y is not None:
        monkeypatch.setattr(verification, "MAX_GRID_Y", max_grid_y)
    descriptor = BUILTINS[name]
    problem = descriptor.problem
    full = descriptor.resolve(config)
    rng = np.random.default_rng(DATA_SEED)
    inputs = {t.name: problem.fill(t, rng) for t in problem.inputs(problem_size, full)}
    before = len(emu.checks)
    got = verification.reference(emu, problem, inputs, problem_size)
    assert emu.checks[before:] == [(f"reference_{name}", verification.OPTIONS)]
    want = problem.reference(np, inputs, problem_size)
    assert got.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_the_nan_fill_and_the_copy_are_not_kernels(emu: EmuCupy) -> None:
    before = len(emu.checks) + len(emu.launches)
    filled = verification.nan_filled(emu, (3, 5))
    assert filled.dtype == np.float32 and np.isnan(filled).all()
    source = np.arange(6, dtype=np.int16).reshape(2, 3)
    copy = verification.device_copy(emu, source)
    np.testing.assert_array_equal(copy, source)
    assert len(emu.checks) + len(emu.launches) == before


def test_without_its_module_the_array_code_verifies(emu: EmuCupy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verification, "_MODULE", {"module": None})
    before = len(emu.checks)
    got, expected = _long_pair()
    assert verification.mismatch(emu, got, expected, 0.0) == compare(np, got, expected, 0.0)
    problem = BUILTINS["scan"].problem
    inputs = {"in": np.ones((2, 5), np.float32)}
    np.testing.assert_array_equal(verification.reference(emu, problem, inputs, [5, 2]),
                                  np.cumsum(inputs["in"].astype(np.float64), axis=1))
    assert len(emu.checks) == before


@pytest.mark.skipif(not nvrtc.available(), reason="no libnvrtc on this machine")
@pytest.mark.parametrize("compute_capability", ["7.5", "8.0", "8.6", "8.7", "9.0"])
def test_verify_cu_compiles_for_the_fleets_gpus_and_defines_every_kernel_it_is_asked_for(
        compute_capability: str) -> None:
    source = verification.SOURCE.read_text()
    real = nvrtc.compile_source(source, [*verification.OPTIONS, nvrtc.arch_option(compute_capability)])
    assert real.ok, real.log
    ptx = nvrtc.compile_source(source, [nvrtc.arch_option(compute_capability, virtual=True)])
    wanted = {f"count_mismatches_{g}_{e}" for g, e in verification.PAIRS}
    wanted |= {d.problem.reference_kernel for d in BUILTINS.values() if d.problem.reference_kernel}
    assert all(ptx.has_entry(name) for name in wanted), sorted(n for n in wanted if not ptx.has_entry(n))
