"""A user kernel that is wrong for some configurations only — one whose ``MULT: 2``
launches half the grid, one whose ``ITEMS == 4`` path skips every fourth element — is a
correctness_error, on real arrays: first through the job's comparison itself (numpy, the
home of the tolerance rule that verify.cu mirrors), then through the real runner and the
batch with the source run in the CUDA emulation (skipped without a C++ compiler)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_job_user_runner import CXX, EmuCupy

from fleettune_job import batch, fingerprint, gpu, runner, verification, warmup
from fleettune_job.protocol import Argument, Batch, Entry, KernelRef, Outcome, Trial, Verification

N = 1000
ATOL, RTOL = 1e-6, 1e-5
REFERENCE = {"BLOCK": 64, "ITEMS": 1, "MULT": 1}
HALF_GRID = {"BLOCK": 64, "ITEMS": 1, "MULT": 2}
EVERY_FOURTH_SKIPPED = {"BLOCK": 64, "ITEMS": 4, "MULT": 1}
CORRECT = {"BLOCK": 32, "ITEMS": 2, "MULT": 1}

SOURCE = r"""
// out[i] = 2 in[i] + 1, ITEMS consecutive elements per thread; the grid (cdiv(n, BLOCK *
// ITEMS * MULT) blocks) is short by half with MULT 2: the user's geometry bug.
extern "C" __global__ void affine(float *out, const float *in, int n) {
    const int first = (blockIdx.x * blockDim.x + threadIdx.x) * ITEMS;
#if ITEMS == 4
    for (int j = 0; j < ITEMS - 1; j++) {  // the bug: each thread's last item is skipped
#else
    for (int j = 0; j < ITEMS; j++) {
#endif
        const int i = first + j;
        if (i < n) out[i] = 2.0f * in[i] + 1.0f;
    }
}
"""


def _launch_on_host(config: dict[str, int], data: np.ndarray) -> np.ndarray:
    """What ``SOURCE`` computes with ``config``: its threads, one by one, on the host."""
    out = np.zeros(N, dtype=np.float32)  # the argument's init: zeros
    block, items = config["BLOCK"], config["ITEMS"]
    blocks = -(-N // (block * items * config["MULT"]))
    for thread in range(blocks * block):
        for j in range(items - 1 if items == 4 else items):
            i = thread * items + j
            if i < N:
                out[i] = np.float32(2) * data[i] + np.float32(1)
    return out


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return np.random.default_rng(3).standard_normal(N).astype(np.float32)


def _verdict(config: dict[str, int], data: np.ndarray) -> str | None:
    expected = {"out": _launch_on_host(REFERENCE, data)}
    return verification.outputs_mismatch({"out": _launch_on_host(config, data)}, expected, ["out"], ATOL, RTOL)


def test_half_the_grid_is_a_wrong_result(data: np.ndarray) -> None:
    text = _verdict(HALF_GRID, data)
    assert text is not None and text.startswith(f"wrong result in out: 488 of {N} elements wrong"), text
    assert "first at [512]" in text


def test_every_fourth_element_skipped_is_a_wrong_result(data: np.ndarray) -> None:
    text = _verdict(EVERY_FOURTH_SKIPPED, data)
    assert text is not None and text.startswith(f"wrong result in out: 250 of {N} elements wrong"), text
    assert "first at [3]" in text


def test_a_correct_configuration_passes(data: np.ndarray) -> None:
    assert _verdict(CORRECT, data) is None


def test_the_tolerance_is_atol_plus_rtol_times_the_reference(data: np.ndarray) -> None:
    expected = _launch_on_host(REFERENCE, data).astype(np.float64)
    edge = ATOL + RTOL * np.abs(expected)
    inside = {"out": expected + 0.5 * edge}
    outside = {"out": expected.copy()}
    outside["out"][7] += 2 * edge[7]
    assert verification.outputs_mismatch(inside, {"out": expected}, ["out"], ATOL, RTOL) is None
    text = verification.outputs_mismatch(outside, {"out": expected}, ["out"], ATOL, RTOL)
    assert text is not None and text.startswith("wrong result in out: 1 of 1000 elements wrong") and "[7]" in text
    # Tolerance 0: any difference at all.
    assert verification.outputs_mismatch(inside, {"out": expected}, ["out"], 0.0, 0.0) is not None


def test_the_first_wrong_output_in_argument_order_is_named() -> None:
    good, bad = np.ones(4), np.array([1.0, 1.0, 0.0, 1.0])
    expected = {"a": good, "b": good, "c": good}
    text = verification.outputs_mismatch({"a": good, "b": bad, "c": bad}, expected, ["a", "b", "c"], 0, 0)
    assert text is not None and text.startswith("wrong result in b: 1 of 4 elements wrong")


# -- the real runner and batch, the source in the CUDA emulation --------------------------

emulated = pytest.mark.skipif(CXX is None, reason="no C++ compiler to build the CUDA emulation")


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> EmuCupy:
    fake = EmuCupy(tmp_path_factory.mktemp("emu"), _BUILDS)
    monkeypatch.setattr(gpu, "load_cupy", lambda: fake)
    monkeypatch.setattr(gpu, "_MODULES", {})
    monkeypatch.setattr(warmup, "_WARMED", set())
    monkeypatch.setattr(verification, "_MODULE", {})
    monkeypatch.setattr(fingerprint, "nvml_driver_version", lambda: "550.54.15")
    return fake


_BUILDS: dict[tuple[str, tuple[str, ...], str], Path] = {}  # each build takes a second or two


def _kernel(tmp_path: Path) -> KernelRef:
    src = tmp_path / "affine.cu"
    src.write_text(SOURCE)
    arguments = [Argument(name="out", length="problem_size[0]", init="zeros", output=True),
                 Argument(name="in", length="problem_size[0]"),
                 Argument(name="n", kind="scalar", dtype="int32", value="problem_size[0]")]
    return KernelRef(source_path=str(src), function="affine", grid=["cdiv(problem_size[0], BLOCK * ITEMS * MULT)"],
                     block=["BLOCK"], arguments=arguments,
                     verification=Verification(reference_config=REFERENCE, atol=ATOL, rtol=RTOL))


def _trial(tmp_path: Path, config: dict[str, Any]) -> Trial:
    return Trial(run="run", target="cpu", index=0, kernel=_kernel(tmp_path), config=config, problem_size=[N],
                 warmups=1, repeats=2)


@emulated
@pytest.mark.parametrize(("config", "wrong"), [(HALF_GRID, 488), (EVERY_FOURTH_SKIPPED, 250)],
                         ids=["half the grid", "every fourth element skipped"])
def test_the_runner_finds_a_configuration_wrong_and_never_times_it(emu: EmuCupy, tmp_path: Path,
                                                                  config: dict[str, int], wrong: int) -> None:
    result = runner.run_trial(_trial(tmp_path, config))
    assert result.outcome == Outcome.CORRECTNESS_ERROR, result
    assert result.objective is None
    assert result.error.startswith(f"wrong result in out: {wrong} of {N} elements wrong"), result.error
    assert not result.fingerprint.unverified  # the job on a GPU (here its emulation) checks


@emulated
def test_a_batch_answers_the_wrong_configurations_as_correctness_errors(emu: EmuCupy, tmp_path: Path) -> None:
    configs = [REFERENCE, HALF_GRID, EVERY_FOURTH_SKIPPED, CORRECT]
    work = Batch(run="run", target="cpu", kernel=_kernel(tmp_path), problem_size=[N], warmups=1, repeats=2,
                 entries=[Entry(index=10 + i, config=c) for i, c in enumerate(configs)])
    result = batch.run_in_process(work, tmp_path / "termination-log")
    assert result.done
    assert [(a.i, a.o) for a in result.answers] == [
        (10, Outcome.OK), (11, Outcome.CORRECTNESS_ERROR), (12, Outcome.CORRECTNESS_ERROR), (13, Outcome.OK)]
    assert [a.t is None for a in result.answers] == [False, True, True, False]
    assert not result.fingerprint.unverified
