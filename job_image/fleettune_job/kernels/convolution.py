"""Built-in 2D convolution, with exactly the parameters of the recorded space ``convolution_milo``.

Matching that recording parameter for parameter lets the example TuningRun that replays
it in simulation run unchanged on real GPUs. Problem size is ``[width, height]`` of the
output image; the input carries the filter's halo.
"""

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

# Inputs are integers in [-VALUE_RANGE, VALUE_RANGE].
VALUE_RANGE = 4


class ConvolutionProblem(Problem):
    reference_kernel = "reference_convolution"
    dims = ("width", "height")

    def defines(self, problem_size: Sequence[int], config: Mapping[str, int]) -> dict[str, int]:
        return {"image_width": int(problem_size[0]), "image_height": int(problem_size[1])}

    def output(self, problem_size: Sequence[int]) -> Tensor:
        width, height = problem_size
        return Tensor("output_image", (int(height), int(width)))

    def inputs(self, problem_size: Sequence[int], config: Mapping[str, int]) -> list[Tensor]:
        width, height = (int(n) for n in problem_size)
        fh, fw = int(config["filter_height"]), int(config["filter_width"])
        return [
            Tensor("input_image", (height + fh - 1, width + fw - 1)),
            Tensor("d_filter", (fh, fw)),
        ]

    def fill(self, tensor: Tensor, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(-VALUE_RANGE, VALUE_RANGE + 1, size=tensor.shape).astype(np.float32)

    def constants(self, config: Mapping[str, int]) -> dict[str, str]:
        return {"d_filter": "d_filter"} if config.get("use_cmem", 1) else {}

    def reference(self, xp: Any, inputs: Mapping[str, Any], problem_size: Sequence[int]) -> Any:
        width, height = (int(n) for n in problem_size)
        image = inputs["input_image"].astype(xp.float64)
        filt = inputs["d_filter"]
        # The taps are needed as Python scalars: one transfer, not one per tap.
        taps = filt.get() if hasattr(filt, "get") else filt
        fh, fw = taps.shape
        # One shifted multiply-add per filter tap: fast with cupy, and small enough on CPU
        # for the problem sizes unit tests use.
        out = xp.zeros((height, width), dtype=xp.float64)
        for i in range(fh):
            for j in range(fw):
                out += image[i : i + height, j : j + width] * float(taps[i, j])
        return out

    def tolerance(self, problem_size: Sequence[int], config: Mapping[str, int]) -> float:
        bound = config["filter_height"] * config["filter_width"] * VALUE_RANGE * VALUE_RANGE
        return 0.0 if bound < FLOAT32_EXACT_LIMIT else bound * 2.0**-22

    def flops(self, problem_size: Sequence[int], config: Mapping[str, int]) -> float:
        return 2.0 * problem_size[0] * problem_size[1] * config["filter_height"] * config["filter_width"]


_SHMEM_BYTES = (
    "(block_size_x * tile_size_x + filter_width - 1 + use_padding)"
    " * (block_size_y * tile_size_y + filter_height - 1) * 4"
)

CONVOLUTION = KernelDescriptor(
    name="convolution",
    summary="2D convolution of a padded float32 image with a filter in constant memory "
    "(parameters of the recorded space convolution_milo)",
    source_file="convolution.cu",
    function="convolution_kernel",
    signature="extern \"C\" __global__ void convolution_kernel(float *output_image, "
    "const float *input_image, const float *d_filter)",
    parameters=(
        Parameter("block_size_x", tuple(range(16, 257, 16)), 16, "threads per block along x (image columns)"),
        Parameter("block_size_y", (1, 2, 4, 8, 16), 16, "threads per block along y (image rows)"),
        Parameter("tile_size_x", (1, 2, 3, 4), 1, "outputs per thread along x, one block width apart"),
        Parameter("tile_size_y", (1, 2, 3, 4), 1, "outputs per thread along y, one block height apart"),
        Parameter("read_only", (0, 1), 0, "1: load the image through the read-only data cache (__ldg)"),
        Parameter(
            "use_padding", (0, 1), 1, "1: pad each shared-memory row by one float against bank conflicts"
        ),
        Parameter(
            "use_shmem", (0, 1), 1, "1: stage the block's input window (with halo) in shared memory"
        ),
        Parameter(
            "use_cmem", (1,), 1, "1: filter in __constant__ memory (d_filter); 0: read it from global memory"
        ),
        Parameter("filter_height", (15,), 15, "filter rows (compile-time constant)"),
        Parameter("filter_width", (15,), 15, "filter columns (compile-time constant)"),
    ),
    constraints=(
        # The four conditions of the recorded space, verbatim.
        Constraint("use_padding==0 or block_size_x % 32 != 0", "padding only helps when a warp spans rows"),
        Constraint("block_size_x*block_size_y<=1024", "at most 1024 threads per block"),
        Constraint("use_padding==0 or use_shmem != 0", "padding applies to the shared-memory window"),
        Constraint(
            "use_shmem == 0 or (((block_size_x*tile_size_x+(filter_width-1)))"
            "*((block_size_y*tile_size_y+(filter_height-1)))) < 12*1024",
            "the shared-memory window stays below 48 KiB of static shared memory",
        ),
        Constraint(
            f"use_shmem == 0 or {_SHMEM_BYTES} <= 49152",
            "exact static shared-memory size including padding (the GPU rejects more at compile time)",
        ),
        Constraint("filter_height >= 1 and filter_width >= 1", "a filter has at least one tap", enforced=True),
        Constraint(
            "block_size_x >= 1 and block_size_y >= 1 and tile_size_x >= 1 and tile_size_y >= 1",
            "positive block and tile sizes",
            enforced=True,
        ),
    ),
    problem_size=(4096, 4096),
    grid=(
        "cdiv(problem_size[0], block_size_x * tile_size_x)",
        "cdiv(problem_size[1], block_size_y * tile_size_y)",
    ),
    block=("block_size_x", "block_size_y"),
    problem=ConvolutionProblem(),
)
