"""From trial to compile options and launch geometry, without a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleettune_job.classify import GeometryError, InvalidConfiguration, TrialSpecError
from fleettune_job.prepare import prepare
from fleettune_job.protocol import KernelRef, Outcome, Trial


def trial(kernel: KernelRef | None = None, config: dict[str, Any] | None = None,
          problem_size: list[int] | None = None) -> Trial:
    return Trial(run="run", target="a100", index=3, kernel=kernel or KernelRef(builtin="gemm"),
                 config=config or {}, problem_size=problem_size if problem_size is not None else [])


def test_builtin_defaults_fill_the_configuration_and_become_defines() -> None:
    p = prepare(trial(config={"tile_k": 32}, problem_size=[256, 512, 128]))
    assert p.config["tile_k"] == 32 and p.config["block_size_x"] == 16
    assert p.defines["tile_k"] == "32"
    assert p.defines["matrix_m"] == "256" and p.defines["matrix_n"] == "512" and p.defines["matrix_k"] == "128"
    assert p.defines["problem_size_2"] == "128"
    assert "#define tile_k 32\n" in p.code and p.code.endswith(p.source)
    # BN = 16 * 4 = 64 columns, BM = 16 * 4 = 64 rows per block.
    assert p.grid == (512 // 64, 256 // 64, 1) and p.block == (16, 16, 1)


def test_empty_problem_size_means_the_kernel_default() -> None:
    p = prepare(trial(kernel=KernelRef(builtin="convolution")))
    assert p.problem_size == (4096, 4096)
    assert p.grid == (256, 256, 1)


def test_booleans_and_integral_floats_are_accepted_as_integers() -> None:
    p = prepare(trial(config={"use_padding": False, "unroll_k": 1.0}, problem_size=[64, 64, 64]))
    assert p.config["use_padding"] == 0 and p.defines["unroll_k"] == "1"


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"tile_kk": 8}, "unknown parameter"),
        ({"tile_k": "eight"}, "must be an integer"),
        ({"tile_k": 8, "vector_width": 3}, "vector_width"),
        ({"tile_k": 2, "vector_width": 4}, "tile_k % vector_width"),
        ({"block_size_y": 4, "tile_size_y": 8}, r"problem_size\[0\] %"),  # BM 32 does not divide M 48
        ({"tile_size_x": 0}, "positive sizes"),
    ],
)
def test_invalid_configurations_are_compile_errors_with_the_broken_rule(config: dict[str, Any],
                                                                         match: str) -> None:
    with pytest.raises(InvalidConfiguration, match=match) as info:
        prepare(trial(config=config, problem_size=[48, 64, 64]))
    assert info.value.outcome == Outcome.COMPILE_ERROR


def test_hardware_limits_are_left_to_the_gpu() -> None:
    # 64 x 32 = 2048 threads and > 48 KiB of shared memory: the GPU must say no, not us.
    p = prepare(trial(config={"block_size_x": 64, "block_size_y": 32, "tile_size_x": 8, "tile_size_y": 8,
                              "tile_k": 32}, problem_size=[2048, 2048, 2048]))
    assert p.threads_per_block == 2048


@pytest.mark.parametrize(
    ("kernel", "problem_size", "match"),
    [
        (KernelRef(builtin="fft"), [], "unknown built-in kernel 'fft'"),
        (KernelRef(), [], "kernel.builtin is required"),
        (KernelRef(source_path="/x.cu", function="k", grid=["1"], block=["1"]), [], "kernel.builtin is required"),
        (KernelRef(builtin="gemm"), [64, 64], "problem_size needs 3 entries"),
        (KernelRef(builtin="scan"), [64, 0], "must be positive"),
        (KernelRef(builtin="scan", grid=["1"]), [], "user source"),
    ],
)
def test_unusable_trials_are_infrastructure_errors(kernel: KernelRef, problem_size: list[int],
                                                   match: str) -> None:
    with pytest.raises(TrialSpecError, match=match) as info:
        prepare(trial(kernel=kernel, problem_size=problem_size))
    assert info.value.outcome == Outcome.INFRA_ERROR


def test_user_source_implements_a_builtin_interface_with_its_own_geometry(tmp_path: Path) -> None:
    src = tmp_path / "my_scan.cu"
    src.write_text('extern "C" __global__ void my_scan(float *out, const float *in) {}\n')
    kernel = KernelRef(builtin="scan", source_path=str(src), function="my_scan",
                       grid=["cdiv(problem_size[1], rows)"], block=["threads", "rows"])
    p = prepare(trial(kernel=kernel, config={"threads": 256, "rows": 4, "unroll": True, "mode": "fast"},
                      problem_size=[1024, 10]))
    assert p.source == src.read_text() and p.function == "my_scan"
    assert p.grid == (3, 1, 1) and p.block == (256, 4, 1)
    assert p.defines["threads"] == "256" and p.defines["unroll"] == "1" and p.defines["mode"] == "fast"
    assert p.defines["row_length"] == "1024" and p.defines["num_rows"] == "10"
    assert "my_scan.cu" in p.label


def test_user_source_without_geometry_uses_the_builtin_one(tmp_path: Path) -> None:
    src = tmp_path / "conv.cu"
    src.write_text("// user convolution\n")
    kernel = KernelRef(builtin="convolution", source_path=str(src))
    p = prepare(trial(kernel=kernel, config={"block_size_x": 32, "block_size_y": 8}, problem_size=[100, 50]))
    assert p.function == "convolution_kernel"
    assert p.grid == (4, 7, 1) and p.block == (32, 8, 1)
    assert p.config["filter_width"] == 15  # the interface's own parameter keeps its default


def test_user_source_problems(tmp_path: Path) -> None:
    with pytest.raises(TrialSpecError, match="cannot read kernel source"):
        prepare(trial(kernel=KernelRef(builtin="scan", source_path=str(tmp_path / "missing.cu"))))
    src = tmp_path / "k.cu"
    src.write_text("x")
    with pytest.raises(GeometryError, match="unknown name 'threads'"):
        prepare(trial(kernel=KernelRef(builtin="scan", source_path=str(src), block=["threads"])))
    with pytest.raises(InvalidConfiguration, match="compile-time constant"):
        prepare(trial(kernel=KernelRef(builtin="scan", source_path=str(src)), config={"flag": "a b"}))
