"""Built-in kernel descriptors and their CPU reference computations."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from fleettune_job.kernels import BUILTINS
from fleettune_job.kernels.base import Tensor, compare, define_value
from fleettune_job.prepare import prepare
from fleettune_job.protocol import KernelRef, Trial

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "data"

# The parameters of the recorded space convolution_milo (specs/convolution_milo.json).
CONVOLUTION_MILO = {
    "block_size_x": [16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256],
    "block_size_y": [1, 2, 4, 8, 16],
    "tile_size_x": [1, 2, 3, 4],
    "tile_size_y": [1, 2, 3, 4],
    "read_only": [0, 1],
    "use_padding": [0, 1],
    "use_shmem": [0, 1],
    "use_cmem": [1],
    "filter_height": [15],
    "filter_width": [15],
}


def test_registry_lists_the_three_builtins() -> None:
    assert set(BUILTINS) == {"convolution", "gemm", "scan"}
    for name, desc in BUILTINS.items():
        assert desc.name == name
        assert desc.function in desc.source
        assert 'extern "C" __global__' in desc.source
        json.dumps(desc.describe())


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_default_configuration_is_valid_for_the_default_problem(name: str) -> None:
    desc = BUILTINS[name]
    cfg = desc.default_config
    broken = [c.expr for c in desc.constraints if not c.holds(cfg, desc.problem_size)]
    assert broken == []
    grid, block = desc.launch_geometry(cfg, desc.problem_size)
    assert min(grid) >= 1 and 1 <= block[0] * block[1] * block[2] <= 1024
    # Every parameter is a compile-time constant the source actually reads.
    for p in desc.parameters:
        assert p.name in desc.source, p.name


def test_convolution_has_exactly_the_parameters_of_the_recorded_space() -> None:
    desc = BUILTINS["convolution"]
    assert {p.name: list(p.values) for p in desc.parameters} == CONVOLUTION_MILO
    assert desc.problem_size == (4096, 4096)
    spec_file = SHARED / "specs" / "convolution_milo.json"
    if spec_file.exists():
        spec = json.loads(spec_file.read_text())
        params = spec["ConfigurationSpace"]["TuningParameters"]
        assert [p["Name"] for p in params] == [p.name for p in desc.parameters]
        assert {p["Name"]: p["Default"] for p in params} == desc.default_config
        conditions = [c["Expression"] for c in spec["ConfigurationSpace"]["Conditions"]]
        assert conditions == [c.expr for c in desc.constraints[: len(conditions)]]


def test_every_recorded_convolution_configuration_prepares() -> None:
    """The example TuningRun replays this recording: each of its configurations must be
    accepted by the job (hardware limits are then the GPU's to judge)."""
    recording = SHARED / "spaces" / "convolution_milo-A100.json.gz"
    if recording.exists():
        cache = json.loads(gzip.decompress(recording.read_bytes()))
        keys = cache["tune_params_keys"]
        configs = [{k: rec[k] for k in keys} for rec in cache["cache"].values()]
    else:
        configs = [dict(zip(CONVOLUTION_MILO, v, strict=True))
                   for v in itertools.islice(itertools.product(*CONVOLUTION_MILO.values()), 0, None, 37)]
    assert len(configs) > 100
    for cfg in configs:
        p = prepare(Trial(run="r", target="t", index=0, kernel=KernelRef(builtin="convolution"),
                          config=cfg, problem_size=[4096, 4096]))
        assert p.grid[0] * cfg["block_size_x"] * cfg["tile_size_x"] >= 4096
        assert p.grid[1] * cfg["block_size_y"] * cfg["tile_size_y"] >= 4096


def _naive_convolution(image: np.ndarray, filt: np.ndarray, width: int, height: int) -> np.ndarray:
    out = np.zeros((height, width))
    for y in range(height):
        for x in range(width):
            out[y, x] = sum(image[y + i, x + j] * filt[i, j]
                            for i in range(filt.shape[0]) for j in range(filt.shape[1]))
    return out


def _inputs(name: str, problem_size: list[int], cfg: dict[str, int]) -> dict[str, np.ndarray]:
    problem = BUILTINS[name].problem
    rng = np.random.default_rng(1)
    return {t.name: problem.fill(t, rng) for t in problem.inputs(problem_size, cfg)}


def test_convolution_reference_matches_the_definition() -> None:
    desc = BUILTINS["convolution"]
    cfg = desc.default_config | {"filter_height": 3, "filter_width": 5}
    ps = [7, 6]
    ins = _inputs("convolution", ps, cfg)
    assert ins["input_image"].shape == (6 + 2, 7 + 4) and ins["d_filter"].shape == (3, 5)
    ref = desc.problem.reference(np, ins, ps)
    assert ref.shape == desc.problem.output(ps).shape == (6, 7)
    np.testing.assert_array_equal(ref, _naive_convolution(ins["input_image"], ins["d_filter"], 7, 6))


def test_gemm_reference_matches_the_definition() -> None:
    desc = BUILTINS["gemm"]
    ps = [4, 3, 5]
    ins = _inputs("gemm", ps, desc.default_config)
    assert ins["A"].shape == (4, 5) and ins["B"].shape == (5, 3)
    ref = desc.problem.reference(np, ins, ps)
    naive = [[sum(float(ins["A"][i, k]) * float(ins["B"][k, j]) for k in range(5)) for j in range(3)]
             for i in range(4)]
    np.testing.assert_array_equal(ref, naive)


def test_scan_reference_matches_the_definition() -> None:
    desc = BUILTINS["scan"]
    ps = [6, 2]
    ins = _inputs("scan", ps, desc.default_config)
    ref = desc.problem.reference(np, ins, ps)
    for r in range(2):
        running = 0.0
        for c in range(6):
            running += float(ins["in"][r, c])
            assert ref[r, c] == running


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_inputs_are_small_integers_so_float32_sums_are_exact(name: str) -> None:
    desc = BUILTINS[name]
    ins = _inputs(name, list(desc.problem_size[:1]) + [8] * (len(desc.problem_size) - 1), desc.default_config)
    for arr in ins.values():
        assert arr.dtype == np.float32
        np.testing.assert_array_equal(arr, np.round(arr))
        assert np.abs(arr).max() <= 8
    # Exact comparison for the default problem: any wrong element is caught.
    assert desc.problem.tolerance(desc.problem_size, desc.default_config) == 0.0


def test_compare_reports_wrong_and_unwritten_elements() -> None:
    expected = np.arange(12, dtype=np.float64).reshape(3, 4)
    got = expected.astype(np.float32)
    assert compare(np, got, expected, 0.0) is None
    got[1, 2] += 1
    got[2, 3] = np.nan
    text = compare(np, got, expected, 0.0)
    assert text is not None
    assert text.startswith("2 of 12 elements wrong")
    assert "first at [1, 2]: got 7, expected 6" in text
    assert "1 never written" in text
    assert compare(np, got, expected, 1.0) is not None  # NaN never passes a tolerance
    assert "shape" in (compare(np, got[:2], expected, 0.0) or "")


def test_compare_with_a_relative_tolerance_and_non_finite_references() -> None:
    expected = np.array([1000.0, 1.0, np.inf, -np.inf, np.nan, 0.0])
    got = np.array([1000.5, 1.0, np.inf, -np.inf, np.nan, 1e-7], dtype=np.float32)
    assert compare(np, got, expected, 1e-6, 1e-3, nan_is_unwritten=False) is None
    text = compare(np, got, expected, 1e-6, 1e-4, nan_is_unwritten=False)  # 0.5 > 1e-6 + 1e-4 * 1000
    assert text == ("1 of 6 elements wrong (tolerance 1e-06 + 0.0001 x |expected|); first at [0]: "
                    "got 1000.5, expected 1000")
    for i, bad in ((1, np.nan), (2, -np.inf), (4, 0.0)):  # NaN or a number where the other has neither
        wrong = got.copy()
        wrong[i] = bad
        text = compare(np, wrong, expected, 1e-6, 1.0, nan_is_unwritten=False)
        assert text is not None and f"first at [{i}]" in text and "never written" not in text
    ints = np.array([3, 250], dtype=np.uint8)
    assert compare(np, ints, np.array([3, 250], dtype=np.uint8), 0.0) is None
    assert "got 250, expected 251" in (compare(np, ints, np.array([3, 251], dtype=np.uint8), 0.0) or "")


def test_tolerance_grows_only_beyond_exact_float32_range() -> None:
    gemm = BUILTINS["gemm"]
    assert gemm.problem.tolerance([64, 64, 2**21], gemm.default_config) > 0


def test_define_values_refuse_option_injection() -> None:
    assert define_value("x", True) == "1"
    assert define_value("x", 3) == "3"
    assert define_value("x", 0.5) == "0.5f"
    assert define_value("x", "float4") == "float4"
    for bad in ("1 -DFOO=2", "a;b", '"x"', float("nan"), [1]):
        with pytest.raises(ValueError):
            define_value("x", bad)
    with pytest.raises(ValueError):
        define_value("not-an-identifier", 1)


def test_output_tensor_is_the_first_argument_and_float32_shape() -> None:
    for desc in BUILTINS.values():
        out = desc.problem.output(desc.problem_size)
        assert isinstance(out, Tensor)
        assert int(np.prod(out.shape)) > 0
