"""Built-in tiled SGEMM: C = A @ B, problem size ``[M, N, K]`` (C is M x N)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fleettune_job.kernels.base import (
    FLOAT32_EXACT_LIMIT,
    Constraint,
    KernelDescriptor,
    Parameter,
    Problem,
    Tensor,
)

VALUE_RANGE = 4


class GemmProblem(Problem):
    reference_kernel = "reference_gemm"
    dims = ("M", "N", "K")

    def defines(self, problem_size: Sequence[int], config: Mapping[str, int]) -> dict[str, int]:
        m, n, k = (int(x) for x in problem_size)
        return {"matrix_m": m, "matrix_n": n, "matrix_k": k}

    def output(self, problem_size: Sequence[int]) -> Tensor:
        m, n, _ = (int(x) for x in problem_size)
        return Tensor("C", (m, n))

    def inputs(self, problem_size: Sequence[int], config: Mapping[str, int]) -> list[Tensor]:
        m, n, k = (int(x) for x in problem_size)
        return [Tensor("A", (m, k)), Tensor("B", (k, n))]

    def fill(self, tensor: Tensor, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(-VALUE_RANGE, VALUE_RANGE + 1, size=tensor.shape).astype(np.float32)

    def reference(self, xp: Any, inputs: Mapping[str, Any], problem_size: Sequence[int]) -> Any:
        # float64 on purpose: products of small integers summed in float64 are exact, so
        # the reference is independent of the BLAS library's own summation order and of
        # any TF32 setting.
        return xp.matmul(inputs["A"].astype(xp.float64), inputs["B"].astype(xp.float64))

    def tolerance(self, problem_size: Sequence[int], config: Mapping[str, int]) -> float:
        bound = int(problem_size[2]) * VALUE_RANGE * VALUE_RANGE
        return 0.0 if bound < FLOAT32_EXACT_LIMIT else bound * 2.0**-22

    def flops(self, problem_size: Sequence[int], config: Mapping[str, int]) -> float:
        m, n, k = problem_size
        return 2.0 * m * n * k


_BM = "(block_size_y * tile_size_y)"
_BN = "(block_size_x * tile_size_x)"

GEMM = KernelDescriptor(
    name="gemm",
    summary="shared-memory tiled float32 matrix multiply C = A B with register tiling and vector loads",
    source_file="gemm.cu",
    function="gemm_kernel",
    signature='extern "C" __global__ void gemm_kernel(float *C, const float *A, const float *B)',
    parameters=(
        Parameter("block_size_x", (8, 16, 32, 64), 16, "threads per block along N (columns of C)"),
        Parameter("block_size_y", (2, 4, 8, 16, 32), 16, "threads per block along M (rows of C)"),
        Parameter("tile_size_x", (1, 2, 4, 8), 4, "outputs per thread along N, one block width apart"),
        Parameter("tile_size_y", (1, 2, 4, 8), 4, "outputs per thread along M, one block height apart"),
        Parameter("tile_k", (8, 16, 32), 16, "depth of the K slice staged in shared memory per step"),
        Parameter("vector_width", (1, 2, 4), 4, "floats per global load when staging (float, float2, float4)"),
        Parameter("use_padding", (0, 1), 1, "1: pad shared rows by one float against bank conflicts"),
        Parameter("unroll_k", (0, 1), 1, "1: fully unroll the inner product over the K slice"),
    ),
    constraints=(
        Constraint("block_size_x * block_size_y <= 1024", "at most 1024 threads per block"),
        Constraint(
            f"({_BM} * (tile_k + use_padding) + tile_k * ({_BN} + use_padding)) * 4 <= 49152",
            "the A and B slices fit in 48 KiB of static shared memory",
        ),
        Constraint(
            "block_size_x >= 1 and block_size_y >= 1 and tile_size_x >= 1 and tile_size_y >= 1 and tile_k >= 1",
            "positive sizes",
            enforced=True,
        ),
        Constraint("vector_width == 1 or vector_width == 2 or vector_width == 4", "CUDA vector types",
                   enforced=True),
        Constraint("tile_k % vector_width == 0", "vector loads tile the A slice rows", enforced=True),
        Constraint(f"{_BN} % vector_width == 0", "vector loads tile the B slice rows", enforced=True),
        Constraint(
            "problem_size[1] % vector_width == 0 and problem_size[2] % vector_width == 0",
            "rows of A and B start aligned for vector loads",
            enforced=True,
        ),
        Constraint(f"problem_size[0] % {_BM} == 0", "block tiles divide M (no edge handling)", enforced=True),
        Constraint(f"problem_size[1] % {_BN} == 0", "block tiles divide N (no edge handling)", enforced=True),
        Constraint("problem_size[2] % tile_k == 0", "K slices divide K", enforced=True),
    ),
    problem_size=(2048, 2048, 2048),
    grid=(f"problem_size[1] // {_BN}", f"problem_size[0] // {_BM}"),
    block=("block_size_x", "block_size_y"),
    problem=GemmProblem(),
)
