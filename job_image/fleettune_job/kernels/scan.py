"""Built-in batched prefix sum: each row scanned independently, problem size ``[row_length, rows]``."""

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

VALUE_RANGE = 8


class ScanProblem(Problem):
    reference_kernel = "reference_scan"
    dims = ("row_length", "rows")

    def defines(self, problem_size: Sequence[int], config: Mapping[str, int]) -> dict[str, int]:
        return {"row_length": int(problem_size[0]), "num_rows": int(problem_size[1])}

    def output(self, problem_size: Sequence[int]) -> Tensor:
        length, rows = (int(x) for x in problem_size)
        return Tensor("out", (rows, length))

    def inputs(self, problem_size: Sequence[int], config: Mapping[str, int]) -> list[Tensor]:
        length, rows = (int(x) for x in problem_size)
        return [Tensor("in", (rows, length))]

    def fill(self, tensor: Tensor, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(-VALUE_RANGE, VALUE_RANGE + 1, size=tensor.shape).astype(np.float32)

    def reference(self, xp: Any, inputs: Mapping[str, Any], problem_size: Sequence[int]) -> Any:
        return xp.cumsum(inputs["in"].astype(xp.float64), axis=1)

    def tolerance(self, problem_size: Sequence[int], config: Mapping[str, int]) -> float:
        bound = int(problem_size[0]) * VALUE_RANGE
        return 0.0 if bound < FLOAT32_EXACT_LIMIT else bound * 2.0**-22

    def flops(self, problem_size: Sequence[int], config: Mapping[str, int]) -> float:
        return float(problem_size[0]) * problem_size[1]


SCAN = KernelDescriptor(
    name="scan",
    summary="batched inclusive prefix sum over the rows of a float32 matrix",
    source_file="scan.cu",
    function="scan_kernel",
    signature='extern "C" __global__ void scan_kernel(float *out, const float *in)',
    parameters=(
        Parameter("block_size_x", (32, 64, 128, 256, 512, 1024), 128, "threads cooperating on one row"),
        Parameter("rows_per_block", (1, 2, 4, 8), 1, "rows scanned by one block (block_size_y)"),
        Parameter(
            "items_per_thread", (1, 2, 4, 8, 16), 4, "consecutive elements a thread scans in registers"
        ),
        Parameter("vector_width", (1, 2, 4), 4, "floats per global load/store (float, float2, float4)"),
        Parameter(
            "use_shuffle", (0, 1), 1, "1: warp-shuffle block scan; 0: shared-memory Hillis-Steele scan"
        ),
    ),
    constraints=(
        Constraint("block_size_x * rows_per_block <= 1024", "at most 1024 threads per block"),
        Constraint(
            "block_size_x >= 1 and rows_per_block >= 1 and items_per_thread >= 1",
            "positive sizes",
            enforced=True,
        ),
        Constraint("vector_width == 1 or vector_width == 2 or vector_width == 4", "CUDA vector types",
                   enforced=True),
        Constraint("items_per_thread % vector_width == 0", "vectors tile a thread's items", enforced=True),
        Constraint("problem_size[0] % vector_width == 0", "rows start aligned for vector loads",
                   enforced=True),
        Constraint("use_shuffle == 0 or block_size_x % 32 == 0", "the shuffle scan needs whole warps",
                   enforced=True),
    ),
    problem_size=(4096, 4096),
    grid=("cdiv(problem_size[1], rows_per_block)",),
    block=("block_size_x", "rows_per_block"),
    problem=ScanProblem(),
)
