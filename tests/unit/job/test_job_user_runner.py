"""A user kernel through the real runner, its CUDA source run on the CPU (emu/).

The stand-in for cupy is numpy, except that a RawModule's function is the user's source
built into the CUDA emulation (emu/user_harness.cpp) and launched there with the
runner's own arguments: arrays by pointer, scalars by value with the exact byte size of
the C parameter. So the source, the -D defines, the geometry, the argument order and
dtypes, the reference run and the comparison are all the job's real ones; only the
timing is fake. Skipped where no C++20 compiler is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from cuda_fakes import CompileException, CUDADriverError, CUDARuntimeError, device_empty, device_empty_like

from fleettune_job import fingerprint, gpu, kept, runner, verification, warmup
from fleettune_job.classify import Phase
from fleettune_job.kernels.base import compare
from fleettune_job.protocol import Argument, KernelRef, Outcome, Trial, Verification

EMU = Path(__file__).resolve().parent / "emu"
CXX = shutil.which("g++") or shutil.which("clang++")

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler to build the CUDA emulation")
VERIFY_KERNELS = ("count_mismatches_", "reference_")

SOURCE = r"""
// c = a + b; acc += scale * a in place, so that a reference run on data the candidate
// already changed would disagree.
extern "C" __global__ void vadd(float *c, const float *a, const float *b, float *acc, float scale, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
#if BLOCK > 128
    c[i] = a[i] + b[i] + 0.001f;  // the fast wrong variant
#else
    c[i] = a[i] + b[i];
#endif
#if BLOCK == 9
    if (i == 0) *(volatile int *)0 = 0;  // an illegal address
#endif
    acc[i] += scale * a[i];
}

extern "C" __global__ void vadd_ref(float *c, const float *a, const float *b, float *acc, float scale, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
        acc[i] += scale * a[i];
    }
}

#if BLOCK == 7
#error this configuration does not build
#endif
"""
N = 1000  # not a multiple of any block size used here: the bounds check runs too


class EmuKernel:
    def __init__(self, emu: EmuCupy, binary: Path, function: str, options: tuple[str, ...]) -> None:
        self.emu, self.binary, self.function, self.options = emu, binary, function, options

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
        # The job's own verification kernels (verify.cu) apart from the trial's launches.
        launches = self.emu.checks if self.function.startswith(VERIFY_KERNELS) else self.emu.launches
        launches.append((self.function, self.options))
        with tempfile.TemporaryDirectory(dir=self.emu.workdir) as tmp:
            params = []
            for i, arg in enumerate(args):
                path = Path(tmp, f"{i}.bin")
                if isinstance(arg, np.ndarray):
                    arg.tofile(path)
                    params.append(f"a:{path}")
                else:
                    assert isinstance(arg, np.generic), f"argument {i} is {type(arg).__name__}, not a typed scalar"
                    np.asarray(arg).tofile(path)
                    params.append(f"s:{path}")
            run = subprocess.run([str(self.binary), *map(str, grid), *map(str, block), *params],
                                 capture_output=True, text=True, timeout=120)
            if run.returncode < 0:
                # Like CUDA, the fault surfaces at the next synchronisation.
                self.emu.pending = CUDARuntimeError("cudaErrorIllegalAddress: an illegal memory access was "
                                                    "encountered")
                return
            assert run.returncode == 0, run.stderr
            for i, arg in enumerate(args):
                if isinstance(arg, np.ndarray):
                    arg[...] = np.fromfile(Path(tmp, f"{i}.bin"), dtype=arg.dtype).reshape(arg.shape)


class OutOfMemory(Exception):
    """cupy.cuda.memory.OutOfMemoryError's stand-in."""


class EmuCupy:
    """numpy under cupy's names; kernels run in the C++ emulation of CUDA."""

    def __init__(self, workdir: Path, builds: dict[tuple[str, tuple[str, ...], str], Path]) -> None:
        self.workdir = workdir
        self.builds = builds
        self.launches: list[tuple[str, tuple[str, ...]]] = []
        self.checks: list[tuple[str, tuple[str, ...]]] = []
        self.pending: Exception | None = None
        emu = self

        class RawModule:
            def __init__(self, code: str, options: tuple[str, ...]) -> None:
                # The configuration, as -D options, from the #define lines nvrtc.program writes
                # before the source (g++ gets them twice: an identical redefinition is fine);
                # not this machine's CUDA header directory.
                prologue = code.split("\n#line 1\n", 1)[0] if code.startswith("#define ") else ""
                defines = tuple(f"-D{line[8:].replace(' ', '=', 1)}" for line in prologue.split("\n") if line)
                self.code, self.options = code, (*defines, *(o for o in options if not o.startswith("-I")))

            def get_function(self, name: str) -> EmuKernel:
                return EmuKernel(emu, emu.build(self.code, self.options, name), name, self.options)

        def synchronize() -> None:
            error, emu.pending = emu.pending, None
            if error is not None:
                raise error

        class Event:
            def record(self, stream: Any = None) -> None:
                pass

            def synchronize(self) -> None:
                synchronize()

        props = {"name": b"Emulated GPU", "major": 8, "minor": 0, "multiProcessorCount": 1,
                 "totalGlobalMem": 1 << 30, "maxThreadsPerBlock": 1024}
        self.RawModule = RawModule
        self.cuda = SimpleNamespace(
            runtime=SimpleNamespace(getDeviceCount=lambda: 1, getDeviceProperties=lambda i: props,
                                    runtimeGetVersion=lambda: 12040, driverGetVersion=lambda: 12040,
                                    deviceSynchronize=synchronize),
            Event=Event,
            get_elapsed_time=lambda start, end: 0.25,
            get_current_stream=lambda: None,
            memory=SimpleNamespace(OutOfMemoryError=OutOfMemory),
        )

    def asarray(self, data: Any) -> np.ndarray:
        return np.array(data, copy=True)  # a device copy: never the host array itself

    @staticmethod
    def asnumpy(a: Any) -> np.ndarray:
        return np.array(a, copy=True)

    empty = staticmethod(device_empty)
    empty_like = staticmethod(device_empty_like)

    def build(self, code: str, options: tuple[str, ...], function: str) -> Path:
        key = (code, options, function)
        if key in self.builds:
            return self.builds[key]
        out = Path(tempfile.mkdtemp(dir=self.workdir))
        (out / "kernel.cu").write_text(code)
        assert CXX is not None
        cmd = [CXX, "-std=c++20", "-O0", "-pthread", "-w", f"-I{EMU}", f'-DKERNEL_PATH="{out / "kernel.cu"}"',
               f"-DKERNEL_FUNCTION={function}",
               # The defines; NVRTC's own options (verify.cu's --fmad=false) mean nothing to g++.
               *(o for o in options if o.startswith("-D")), str(EMU / "user_harness.cpp"), "-o", str(out / "kernel")]
        build = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"LC_ALL": "C"})
        if build.returncode != 0:
            if "barrier" in build.stderr and "No such file" in build.stderr:
                pytest.skip("the C++ standard library lacks <barrier> (C++20)")
            if re.search(rf"'{function}' was not declared|undeclared identifier '{function}'", build.stderr):
                raise CUDADriverError("CUDA_ERROR_NOT_FOUND: named symbol not found")
            raise CompileException(build.stderr)
        self.builds[key] = out / "kernel"
        return out / "kernel"

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)


@pytest.fixture(scope="module")
def builds() -> dict[tuple[str, tuple[str, ...], str], Path]:
    return {}  # binaries shared by the tests of this module: each build takes a second or two


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory,
        builds: dict[tuple[str, tuple[str, ...], str], Path]) -> EmuCupy:
    fake = EmuCupy(tmp_path_factory.mktemp("emu"), builds)
    monkeypatch.setattr(gpu, "load_cupy", lambda: fake)
    monkeypatch.setattr(gpu, "_MODULES", {})
    monkeypatch.setattr(warmup, "_WARMED", set())
    monkeypatch.setattr(verification, "_MODULE", {})
    monkeypatch.setattr(fingerprint, "nvml_driver_version", lambda: "550.54.15")
    return fake


def user_trial(tmp_path: Path, config: dict[str, Any], *, function: str = "vadd",
               reference_config: dict[str, Any] | None = None, reference_function: str | None = None) -> Trial:
    src = tmp_path / "vadd.cu"
    src.write_text(SOURCE)
    arguments = [
        Argument(name="c", length="problem_size[0]", init="zeros", output=True),
        Argument(name="a", length="problem_size[0]"),
        Argument(name="b", length="problem_size[0]", seed=7),
        Argument(name="acc", length="problem_size[0]", init="constant", constant=1.0, output=True),
        Argument(name="scale", kind="scalar", value="2.5"),
        Argument(name="n", kind="scalar", dtype="int32", value="problem_size[0]"),
    ]
    verification = Verification(reference_config=reference_config or {"BLOCK": 128},
                                reference_function=reference_function)
    kernel = KernelRef(source_path=str(src), function=function, grid=["cdiv(problem_size[0], BLOCK)"],
                       block=["BLOCK"], arguments=arguments, verification=verification)
    return Trial(run="run", target="cpu", index=0, kernel=kernel, config=config, problem_size=[N], warmups=1,
                 repeats=2)


def test_a_correct_configuration_is_verified_against_the_reference_and_timed(emu: EmuCupy,
                                                                             tmp_path: Path) -> None:
    phases: list[Phase] = []
    result = runner.run_trial(user_trial(tmp_path, {"BLOCK": 64}), progress=lambda p, fp: phases.append(p))
    assert result.outcome == Outcome.OK, result.error
    assert result.objective == 0.25 and result.times == [0.25, 0.25]
    assert result.fingerprint.product == "Emulated GPU"
    candidate = ("vadd", ("-DBLOCK=64", f"-Dproblem_size_0={N}"))
    reference = ("vadd", ("-DBLOCK=128", f"-Dproblem_size_0={N}"))
    # Checked once, the reference once, then one warm-up and two timed repeats.
    assert emu.launches == [candidate, reference, candidate, candidate, candidate]
    assert phases == [Phase.DEVICE, Phase.SETUP, Phase.COMPILE, Phase.ALLOCATE, Phase.LAUNCH, Phase.RUN,
                      Phase.REFERENCE, Phase.VERIFY, Phase.TIME]


def test_the_outputs_are_compared_by_the_jobs_own_kernels_compiled_once_before_the_first_launch(
        emu: EmuCupy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[str] = []
    monkeypatch.setattr(warmup, "compare", lambda *a, **kw: compared.append("array code"))
    modules: list[str] = []
    original = emu.RawModule

    def recording(code: str, options: tuple[str, ...]) -> Any:
        modules.append("verify.cu" if code == verification.SOURCE.read_text() else "trial")
        return original(code, options)

    monkeypatch.setattr(emu, "RawModule", recording)
    assert runner.run_trial(user_trial(tmp_path, {"BLOCK": 64})).outcome == Outcome.OK
    assert runner.run_trial(user_trial(tmp_path, {"BLOCK": 32})).outcome == Outcome.OK
    # verify.cu once, before the first trial's kernel; cupy's array code never (its kernels
    # would compile at run time, seconds per Pod).
    assert modules[0] == "verify.cu" and modules.count("verify.cu") == 1 and compared == []
    count = ("count_mismatches_float32_float32", verification.OPTIONS)
    assert emu.checks == [count] * 4  # both outputs, both configurations


def test_an_output_type_verify_cu_does_not_cover_is_compared_by_the_array_code(
        emu: EmuCupy, monkeypatch: pytest.MonkeyPatch) -> None:
    got = np.array([1.0, 2.0, 3.5], dtype=np.float16)
    assert not verification.covers(got.dtype, got.dtype)
    assert verification.mismatch(emu, got, got.copy(), 0.0) is None
    text = verification.mismatch(emu, got, np.array([1.0, 2.0, 3.0], dtype=np.float16), 0.0)
    assert text == compare(np, got, np.array([1.0, 2.0, 3.0], dtype=np.float16), 0.0)
    assert "1 of 3 elements wrong" in (text or "") and emu.checks == []


def test_the_reference_configurations_outputs_are_kept_and_checked_again_on_a_mismatch(
        emu: EmuCupy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kept, "fits_beside", lambda cupy, nbytes: True)
    monkeypatch.setattr(kept, "_DATA", {})
    monkeypatch.setattr(kept, "_REFERENCE", {})
    reference = ("vadd", ("-DBLOCK=128", f"-Dproblem_size_0={N}"))
    assert runner.run_trial(user_trial(tmp_path, {"BLOCK": 64})).outcome == Outcome.OK
    assert emu.launches.count(reference) == 1
    assert runner.run_trial(user_trial(tmp_path, {"BLOCK": 32})).outcome == Outcome.OK
    assert emu.launches.count(reference) == 1, "the second configuration is checked against the kept outputs"
    # Kept outputs written over (a faulty kernel): checked again against a fresh reference run.
    for array in next(iter(kept._REFERENCE.values())).values():
        array[...] = -1
    assert runner.run_trial(user_trial(tmp_path, {"BLOCK": 64})).outcome == Outcome.OK
    assert emu.launches.count(reference) == 2
    result = runner.run_trial(user_trial(tmp_path, {"BLOCK": 256}))  # wrong, whatever is kept
    assert result.outcome == Outcome.CORRECTNESS_ERROR and emu.launches.count(reference) == 3


def test_a_fast_wrong_configuration_is_a_correctness_error(emu: EmuCupy, tmp_path: Path) -> None:
    result = runner.run_trial(user_trial(tmp_path, {"BLOCK": 256}))
    assert result.outcome == Outcome.CORRECTNESS_ERROR
    assert result.error.startswith(f"wrong result in c: {N} of {N} elements wrong (tolerance 1e-06 + 1e-05 x")
    assert len(emu.launches) == 2  # never timed


def test_a_configuration_that_may_be_pruned_is_verified_on_its_first_launchs_output(emu: EmuCupy,
                                                                                   tmp_path: Path) -> None:
    """The check waits for the first timed launches (a pruned configuration is never
    checked), but compares what the first launch left: ``acc`` is updated in place, so the
    output after five launches would not match the reference's one."""
    phases: list[Phase] = []
    may_prune = user_trial(tmp_path, {"BLOCK": 64}).model_copy(update={"repeats": 7, "prune_above_ms": 1.0})
    result = runner.run_trial(may_prune, progress=lambda p, fp: phases.append(p))
    assert result.outcome == Outcome.OK, result.error
    assert result.pruned is None and len(result.times) == 7
    candidate = ("vadd", ("-DBLOCK=64", f"-Dproblem_size_0={N}"))
    reference = ("vadd", ("-DBLOCK=128", f"-Dproblem_size_0={N}"))
    # The checked launch, one warm-up, three timed, the reference, the warm-up again, four
    # more timed.
    assert emu.launches == [candidate] * 5 + [reference] + [candidate] * 5
    assert phases[-4:] == [Phase.TIME, Phase.REFERENCE, Phase.VERIFY, Phase.TIME]


def test_without_room_for_a_copy_of_the_outputs_the_check_comes_before_timing(
        emu: EmuCupy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_gpu(array: Any) -> Any:
        raise OutOfMemory(f"out of memory to allocate {array.nbytes} bytes")

    monkeypatch.setattr(emu, "empty_like", full_gpu)  # no room left on the GPU for a copy
    may_prune = user_trial(tmp_path, {"BLOCK": 64}).model_copy(update={"repeats": 7, "prune_above_ms": 1.0})
    result = runner.run_trial(may_prune)
    assert result.outcome == Outcome.OK, result.error
    candidate = ("vadd", ("-DBLOCK=64", f"-Dproblem_size_0={N}"))
    reference = ("vadd", ("-DBLOCK=128", f"-Dproblem_size_0={N}"))
    # Checked on the first launch's output in place, then one warm-up and seven timed.
    assert emu.launches == [candidate, reference] + [candidate] * 8


def test_a_pruned_user_configuration_is_not_verified(emu: EmuCupy, tmp_path: Path) -> None:
    wrong = user_trial(tmp_path, {"BLOCK": 256}).model_copy(update={"repeats": 7, "prune_above_ms": 0.1})
    result = runner.run_trial(wrong)
    assert result.outcome == Outcome.OK and result.pruned, result.error
    assert len(emu.launches) == 1 + 1 + 3  # no reference run
    not_pruned = runner.run_trial(wrong.model_copy(update={"prune_above_ms": 1.0}))
    assert not_pruned.outcome == Outcome.CORRECTNESS_ERROR and "wrong result in c" in not_pruned.error


def test_the_reference_configuration_itself_is_not_compared(emu: EmuCupy, tmp_path: Path) -> None:
    result = runner.run_trial(user_trial(tmp_path, {"BLOCK": 128}))
    assert result.outcome == Outcome.OK, result.error
    assert {options for _, options in emu.launches} == {("-DBLOCK=128", f"-Dproblem_size_0={N}")}
    assert len(emu.launches) == 1 + 1 + 2


def test_a_reference_function_is_compared_even_in_the_reference_configuration(emu: EmuCupy,
                                                                              tmp_path: Path) -> None:
    ok = runner.run_trial(user_trial(tmp_path, {"BLOCK": 128}, reference_function="vadd_ref"))
    assert ok.outcome == Outcome.OK, ok.error
    assert [f for f, _ in emu.launches[:2]] == ["vadd", "vadd_ref"]
    wrong = runner.run_trial(user_trial(tmp_path, {"BLOCK": 512}, reference_function="vadd_ref",
                                        reference_config={"BLOCK": 512}))
    assert wrong.outcome == Outcome.CORRECTNESS_ERROR and "wrong result in c" in wrong.error


def test_a_missing_function_is_a_compile_error(emu: EmuCupy, tmp_path: Path) -> None:
    result = runner.run_trial(user_trial(tmp_path, {"BLOCK": 64}, function="vadd_typo"))
    assert result.outcome == Outcome.COMPILE_ERROR
    assert "named symbol not found" in result.error and emu.launches == []


def test_a_configuration_that_does_not_build_is_a_compile_error(emu: EmuCupy, tmp_path: Path) -> None:
    result = runner.run_trial(user_trial(tmp_path, {"BLOCK": 7}))
    assert result.outcome == Outcome.COMPILE_ERROR
    assert "this configuration does not build" in result.error


def test_an_illegal_address_is_a_runtime_error(emu: EmuCupy, tmp_path: Path) -> None:
    result = runner.run_trial(user_trial(tmp_path, {"BLOCK": 9}))
    assert result.outcome == Outcome.RUNTIME_ERROR
    assert "illegal memory access" in result.error and "block 9x1x1" in result.error


@pytest.mark.parametrize(("reference", "match"), [
    (7, "reference configuration failed: compile error: .*this configuration does not build"),
    (9, r"reference configuration failed: runtime error: .*illegal memory access.*\(grid 112x1x1, block 9x1x1"),
])
def test_a_failing_reference_is_an_infrastructure_error(emu: EmuCupy, tmp_path: Path, reference: int,
                                                        match: str) -> None:
    result = runner.run_trial(user_trial(tmp_path, {"BLOCK": 64}, reference_config={"BLOCK": reference}))
    assert result.outcome == Outcome.INFRA_ERROR
    assert re.search(match, result.error), result.error
