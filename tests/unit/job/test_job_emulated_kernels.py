"""The built-in CUDA sources, run on the CPU through a tiny CUDA emulation (emu/).

There is no GPU on CI machines, yet a wrong index in a kernel must not wait for one to
be found: each CUDA thread becomes a std::thread, __syncthreads() a barrier, so tiling,
halo loading, shared-memory padding, vector loads and the block scans run as written
and are checked against the same reference the job uses. Configurations include edge
cases (problem sizes that tiles do not divide, partial warps, several rows per block).
Skipped where no C++20 compiler is installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleettune_job.kept import DATA_SEED
from fleettune_job.kernels.base import compare
from fleettune_job.prepare import Prepared, prepare
from fleettune_job.protocol import KernelRef, Trial

EMU = Path(__file__).resolve().parent / "emu"
CXX = shutil.which("g++") or shutil.which("clang++")

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler to build the CUDA emulation")


def emulate(prepared: Prepared, tmp: Path, source: str | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Build and run one launch of ``prepared``; return (output, expected, tolerance)."""
    problem, ps, cfg = prepared.problem, prepared.problem_size, prepared.config
    inputs = problem.inputs(ps, cfg)
    kernel_file = tmp / "kernel.cu"
    kernel_file.write_text(source if source is not None else prepared.source)
    call = f"{prepared.function}(" + ", ".join(f"buf[{i}]" for i in range(len(inputs) + 1)) + ")"
    cmd = [CXX, "-std=c++20", "-O0", "-pthread", "-w", f"-I{EMU}", f'-DKERNEL_PATH="{kernel_file}"',
           f"-DKERNEL_CALL={call}"]
    names = [t.name for t in inputs]
    constants = problem.constants(cfg)
    if constants:
        stmts = ";".join(f"std::memcpy({sym}, buf[{1 + names.index(t)}], sizeof({sym}))"
                         for sym, t in constants.items())
        cmd.append(f"-DKERNEL_CONSTANTS={stmts}")
    cmd += [f"-D{k}={v}" for k, v in prepared.defines.items()]
    cmd += [str(EMU / "harness.cpp"), "-o", str(tmp / "kernel")]
    build = subprocess.run(cmd, capture_output=True, text=True)
    if build.returncode != 0:
        if "barrier" in build.stderr and "No such file" in build.stderr:
            pytest.skip("the C++ standard library lacks <barrier> (C++20)")
        raise AssertionError(build.stderr[-3000:])

    rng = np.random.default_rng(DATA_SEED)
    host = {t.name: problem.fill(t, rng) for t in inputs}
    out = problem.output(ps)
    files = [tmp / "out.bin"]
    np.full(out.shape, np.nan, dtype=np.float32).tofile(files[0])
    for name, arr in host.items():
        files.append(tmp / f"{name}.bin")
        arr.tofile(files[-1])
    run = subprocess.run([str(tmp / "kernel"), *map(str, prepared.grid), *map(str, prepared.block),
                          *map(str, files)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    got = np.fromfile(files[0], dtype=np.float32).reshape(out.shape)
    return got, problem.reference(np, host, ps), problem.tolerance(ps, cfg)


def prepared_for(name: str, config: dict[str, Any], problem_size: list[int]) -> Prepared:
    return prepare(Trial(run="r", target="cpu", index=0, kernel=KernelRef(builtin=name), config=config,
                         problem_size=problem_size))


CASES = [
    # Shared memory with padding, 2x3 tiles, a small filter; 40x26 is not a multiple of the tile.
    ("convolution", {"block_size_x": 16, "block_size_y": 4, "tile_size_x": 2, "tile_size_y": 3,
                     "use_padding": 1, "use_shmem": 1, "filter_height": 5, "filter_width": 3}, [40, 26]),
    # Straight from global memory through __ldg, clamped edge reads, the recorded 15x15 filter.
    ("convolution", {"block_size_x": 48, "block_size_y": 2, "tile_size_x": 1, "tile_size_y": 2,
                     "use_padding": 0, "use_shmem": 0, "read_only": 1}, [70, 9]),
    ("gemm", {"block_size_x": 8, "block_size_y": 4, "tile_size_x": 2, "tile_size_y": 4, "tile_k": 8,
              "vector_width": 4, "use_padding": 1, "unroll_k": 1}, [32, 48, 24]),
    ("gemm", {"block_size_x": 16, "block_size_y": 2, "tile_size_x": 1, "tile_size_y": 1, "tile_k": 16,
              "vector_width": 1, "use_padding": 0, "unroll_k": 0}, [4, 48, 32]),
    ("scan", {"block_size_x": 64, "rows_per_block": 2, "items_per_thread": 4, "vector_width": 2,
              "use_shuffle": 1}, [1000, 5]),
    # Hillis-Steele over 48 threads (a partial warp), one chunk longer than the row.
    ("scan", {"block_size_x": 48, "rows_per_block": 3, "items_per_thread": 3, "vector_width": 1,
              "use_shuffle": 0}, [301, 4]),
]


@pytest.mark.parametrize(("name", "config", "problem_size"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_builtin_kernel_matches_its_reference(name: str, config: dict[str, Any], problem_size: list[int],
                                              tmp_path: Path) -> None:
    got, expected, tol = emulate(prepared_for(name, config, problem_size), tmp_path)
    assert compare(np, got, expected, tol) is None


def test_the_emulation_catches_a_broken_kernel(tmp_path: Path) -> None:
    """The check above is only worth something if a plausible bug fails it."""
    prepared = prepared_for("scan", {"block_size_x": 64, "items_per_thread": 2, "vector_width": 2}, [300, 2])
    broken = prepared.source.replace("carry += chunk_total[ty];", "carry = chunk_total[ty];")
    assert broken != prepared.source
    got, expected, tol = emulate(prepared, tmp_path, source=broken)
    assert compare(np, got, expected, tol) is not None
