"""The runner's phases and failure handling, on a numpy-backed stand-in for cupy."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from cuda_fakes import CompileException, CUDADriverError, CUDARuntimeError, device_empty, device_empty_like

from fleettune_job import fingerprint, gpu, kept, runner, verification, warmup
from fleettune_job.classify import NoGpu, Phase
from fleettune_job.kernels import BUILTINS
from fleettune_job.protocol import KernelRef, Outcome, Trial, decode

Behaviour = Callable[[tuple[int, ...], tuple[int, ...], tuple[Any, ...]], None]


class FakeKernel:
    num_regs = 40
    max_threads_per_block = 1024
    shared_size_bytes = 0

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.calls = 0

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
        self.calls += 1
        self.behaviour(grid, block, args)


class FakeMemPtr:
    def __init__(self) -> None:
        self.value: np.ndarray | None = None

    def copy_from_device(self, src: Any, nbytes: int) -> None:
        self.value = np.frombuffer(src, dtype=np.float32, count=nbytes // 4).copy()


class FakeCupy:
    """numpy under cupy's names, plus the cuda.* surface the runner uses."""

    def __init__(self, behaviour: Behaviour, compile_error: str | None = None,
                 sync_error: Exception | None = None) -> None:
        self.kernel = FakeKernel(behaviour)
        self.options: tuple[str, ...] = ()
        self.code = ""
        self.globals: dict[str, FakeMemPtr] = {}
        fake = self

        class RawModule:
            def __init__(self, code: str, options: tuple[str, ...]) -> None:
                if code == verification.SOURCE.read_text():
                    # Its kernels would be the trial's behaviour: the array code verifies here
                    # (verify.cu runs in the emulation, test_job_user_runner.py).
                    raise CompileException("the stand-in runs no verification kernels")
                fake.code, fake.options = code, options
                if compile_error:
                    raise CompileException(compile_error)

            def get_function(self, name: str) -> FakeKernel:
                return fake.kernel

            def get_global(self, name: str) -> FakeMemPtr:
                return fake.globals.setdefault(name, FakeMemPtr())

        def synchronize() -> None:
            if sync_error is not None:
                raise sync_error

        class Event:
            def record(self, stream: Any = None) -> None:
                pass

            def synchronize(self) -> None:
                pass

        props = {"name": b"Fake GPU", "major": 8, "minor": 6, "multiProcessorCount": 10,
                 "totalGlobalMem": 8 << 30, "maxThreadsPerBlock": 1024}
        self.RawModule = RawModule
        self.cuda = SimpleNamespace(
            runtime=SimpleNamespace(getDeviceCount=lambda: 1, getDeviceProperties=lambda i: props,
                                    runtimeGetVersion=lambda: 12040, driverGetVersion=lambda: 12040,
                                    deviceSynchronize=synchronize),
            Event=Event,
            get_elapsed_time=lambda start, end: 1.5,
            get_current_stream=lambda: None,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def asnumpy(a: Any) -> np.ndarray:
        return np.asarray(a)

    empty = staticmethod(device_empty)
    empty_like = staticmethod(device_empty_like)


def scan_correct(grid: Any, block: Any, args: tuple[Any, ...]) -> None:
    args[0][...] = np.cumsum(args[1], axis=1)


def trial(name: str = "scan", config: dict[str, Any] | None = None, problem_size: list[int] | None = None,
          **kw: Any) -> Trial:
    return Trial(run="run", target="rtx", index=1, kernel=KernelRef(builtin=name), config=config or {},
                 problem_size=problem_size or [64, 3], **kw)


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "_MODULES", {})
    monkeypatch.setattr(kept, "_DATA", {})
    monkeypatch.setattr(kept, "_REFERENCE", {})
    monkeypatch.setattr(warmup, "_WARMED", set())
    monkeypatch.setattr(verification, "_MODULE", {})
    monkeypatch.setattr(fingerprint, "nvml_driver_version", lambda: "550.54.15")


def use(monkeypatch: pytest.MonkeyPatch, fake: FakeCupy) -> FakeCupy:
    monkeypatch.setattr(gpu, "load_cupy", lambda: fake)
    monkeypatch.setattr(gpu, "_MODULES", {})  # modules of an earlier fake must not be reused
    return fake


def test_ok_trial_reports_median_times_and_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = use(monkeypatch, FakeCupy(scan_correct))
    phases: list[Phase] = []
    result = runner.run_trial(trial(warmups=2, repeats=5), progress=lambda p, fp: phases.append(p))
    assert result.outcome == Outcome.OK, result.error
    assert result.objective == 1.5 and result.times == [1.5] * 5
    assert result.fingerprint.product == "Fake GPU" and result.fingerprint.driver_version == "550.54.15"
    assert result.compile_s is not None
    assert fake.kernel.calls == 1 + 2 + 5  # verification run, warm-ups, repeats
    assert "#define row_length 64\n" in fake.code and "#define num_rows 3\n" in fake.code
    assert phases == [Phase.DEVICE, Phase.SETUP, Phase.COMPILE, Phase.ALLOCATE, Phase.COMPILE,
                      Phase.LAUNCH, Phase.RUN, Phase.VERIFY, Phase.TIME]
    assert decode(result.encode()) == result


def test_a_pruned_trial_reports_the_launches_it_got(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = use(monkeypatch, FakeCupy(scan_correct))  # every launch takes 1.5 ms
    result = runner.run_trial(trial(warmups=2, repeats=7, prune_above_ms=1.0))
    assert result.outcome == Outcome.OK and result.objective == 1.5 and result.times == [1.5] * 3
    assert result.pruned and fake.kernel.calls == 1 + 2 + 3
    assert decode(result.encode()).pruned
    not_pruned = runner.run_trial(trial(warmups=2, repeats=7, prune_above_ms=2.0))
    assert not_pruned.times == [1.5] * 7 and not_pruned.pruned is None


def scan_wrong(grid: Any, block: Any, args: tuple[Any, ...]) -> None:
    args[0][...] = np.cumsum(args[1], axis=1) + 1.0


def test_a_pruned_configuration_is_not_verified(monkeypatch: pytest.MonkeyPatch) -> None:
    """Too slow to become the best, its output does not matter: no reference computation."""
    fake = use(monkeypatch, FakeCupy(scan_wrong))  # wrong output, 1.5 ms per launch
    phases: list[Phase] = []
    pruned = runner.run_trial(trial(warmups=2, repeats=7, prune_above_ms=1.0), progress=lambda p, fp: phases.append(p))
    assert pruned.outcome == Outcome.OK and pruned.pruned and pruned.objective == 1.5
    assert Phase.VERIFY not in phases and fake.kernel.calls == 1 + 2 + 3
    # Not pruned: verified after the first three timed launches, and found wrong.
    not_pruned = runner.run_trial(trial(warmups=2, repeats=7, prune_above_ms=2.0))
    assert not_pruned.outcome == Outcome.CORRECTNESS_ERROR and "wrong result" in not_pruned.error
    assert fake.kernel.calls == (1 + 2 + 3) * 2
    # With nothing to prune, verified before timing, as always.
    never = runner.run_trial(trial(warmups=2, repeats=7))
    assert never.outcome == Outcome.CORRECTNESS_ERROR and fake.kernel.calls == (1 + 2 + 3) * 2 + 1


def test_constant_memory_is_filled_before_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleettune_job.kernels import BUILTINS

    problem = BUILTINS["convolution"].problem
    seen: dict[str, Any] = {}

    def conv(grid: Any, block: Any, args: tuple[Any, ...]) -> None:
        seen["filter"] = fake.globals["d_filter"].value
        args[0][...] = problem.reference(np, {"input_image": args[1], "d_filter": args[2]}, [40, 20])

    fake = use(monkeypatch, FakeCupy(conv))
    result = runner.run_trial(trial("convolution", {"filter_height": 3, "filter_width": 3}, [40, 20]))
    assert result.outcome == Outcome.OK, result.error
    assert seen["filter"] is not None and seen["filter"].shape == (9,)


def test_compile_error(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, FakeCupy(scan_correct, compile_error="k.cu(3): error: expected a ;"))
    result = runner.run_trial(trial())
    assert result.outcome == Outcome.COMPILE_ERROR
    assert "line 3: error: expected a ;" in result.error
    assert result.fingerprint.product == "Fake GPU"


def test_launch_error_names_the_geometry(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(grid: Any, block: Any, args: Any) -> None:
        raise CUDADriverError("CUDA_ERROR_INVALID_VALUE: invalid argument")

    use(monkeypatch, FakeCupy(refuse))
    result = runner.run_trial(trial(config={"block_size_x": 1024, "rows_per_block": 2}))
    assert result.outcome == Outcome.LAUNCH_ERROR
    assert "block 1024x2x1 = 2048 threads" in result.error
    assert "at most 1024 threads per block" in result.error and "40 registers" in result.error


def test_runtime_error_at_synchronize(monkeypatch: pytest.MonkeyPatch) -> None:
    err = CUDARuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")
    use(monkeypatch, FakeCupy(scan_correct, sync_error=err))
    result = runner.run_trial(trial())
    assert result.outcome == Outcome.RUNTIME_ERROR
    assert "illegal memory access" in result.error


def test_wrong_and_unwritten_results_are_correctness_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    def off_by_one(grid: Any, block: Any, args: tuple[Any, ...]) -> None:
        scan_correct(grid, block, args)
        args[0][2, 10] += 1

    use(monkeypatch, FakeCupy(off_by_one))
    result = runner.run_trial(trial())
    assert result.outcome == Outcome.CORRECTNESS_ERROR
    assert "1 of 192 elements wrong" in result.error and "[2, 10]" in result.error

    use(monkeypatch, FakeCupy(lambda grid, block, args: None))
    result = runner.run_trial(trial())
    assert result.outcome == Outcome.CORRECTNESS_ERROR and "192 never written" in result.error


def _counting(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> list[int]:
    calls = [0]
    original = getattr(cls, name)

    def counted(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        return original(*args, **kw)

    monkeypatch.setattr(cls, name, counted)
    return calls


def test_one_problem_is_drawn_once_and_its_reference_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, FakeCupy(scan_correct))
    monkeypatch.setattr(kept, "fits_beside", lambda cupy, nbytes: True)
    monkeypatch.setattr(warmup, "warm_verification", lambda cupy, prepared: None)  # its own draws
    problem = type(BUILTINS["scan"].problem)
    fills, references = _counting(monkeypatch, problem, "fill"), _counting(monkeypatch, problem, "reference")
    for _ in range(3):
        assert runner.run_trial(trial()).outcome == Outcome.OK
    assert (fills[0], references[0]) == (1, 1)
    assert runner.run_trial(trial(problem_size=[32, 5])).outcome == Outcome.OK  # another problem
    assert (fills[0], references[0]) == (2, 2) and len(kept._DATA) == len(kept._REFERENCE) == 1


def test_what_a_faulty_kernel_overwrites_never_fails_the_next_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    def scribbler(grid: Any, block: Any, args: tuple[Any, ...]) -> None:
        scan_correct(grid, block, args)
        args[1][...] = 0  # its own input: the next configuration still gets the problem's data

    use(monkeypatch, FakeCupy(scribbler))
    monkeypatch.setattr(kept, "fits_beside", lambda cupy, nbytes: True)
    monkeypatch.setattr(warmup, "warm_verification", lambda cupy, prepared: None)
    assert runner.run_trial(trial()).outcome == Outcome.CORRECTNESS_ERROR
    use(monkeypatch, FakeCupy(scan_correct))
    assert runner.run_trial(trial()).outcome == Outcome.OK
    # A kept reference written over: the configuration is checked again on a fresh one.
    (reference,) = kept._REFERENCE.values()
    reference[...] = 0
    references = _counting(monkeypatch, type(BUILTINS["scan"].problem), "reference")
    assert runner.run_trial(trial()).outcome == Outcome.OK and references[0] == 1
    assert runner.run_trial(trial()).outcome == Outcome.OK and references[0] == 1  # the fresh one is kept
    use(monkeypatch, FakeCupy(lambda grid, block, args: None))
    result = runner.run_trial(trial())
    assert result.outcome == Outcome.CORRECTNESS_ERROR and "192 never written" in result.error


def test_data_larger_than_the_cap_is_drawn_again_for_each_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, FakeCupy(scan_correct))
    monkeypatch.setattr(warmup, "warm_verification", lambda cupy, prepared: None)
    monkeypatch.setattr(kept, "DATA_MAX_BYTES", 64 * 3 * 4 - 1)  # scan's [64, 3] float32 input, less a byte
    fills = _counting(monkeypatch, type(BUILTINS["scan"].problem), "fill")
    for _ in range(2):
        assert runner.run_trial(trial()).outcome == Outcome.OK
    assert fills[0] == 2 and not kept._DATA


def test_a_reference_too_large_for_the_free_memory_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = use(monkeypatch, FakeCupy(scan_correct))
    fake.cuda.runtime.memGetInfo = lambda: (4 * 192 * 8 - 1, 1 << 30)  # scan's float64 reference: 192 x 8 bytes
    fake.get_default_memory_pool = lambda: SimpleNamespace(free_bytes=lambda: 0)
    assert runner.run_trial(trial()).outcome == Outcome.OK and not kept._REFERENCE
    fake.cuda.runtime.memGetInfo = lambda: (4 * 192 * 8, 1 << 30)
    assert runner.run_trial(trial()).outcome == Outcome.OK and len(kept._REFERENCE) == 1


def test_verification_kernels_compile_before_the_first_launch_once_per_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, FakeCupy(scan_correct))
    problem = type(BUILTINS["scan"].problem)
    now = [0.0]
    sizes: list[list[int]] = []
    original = problem.reference

    def reference(self: Any, xp: Any, inputs: Any, problem_size: Any) -> Any:
        sizes.append(list(problem_size))
        if len(sizes) == 1:
            now[0] += 5.0  # cupy compiling its kernels: seconds, before any launch
        return original(self, xp, inputs, problem_size)

    monkeypatch.setattr(problem, "reference", reference)
    result = runner.run_trial(trial(problem_size=[128, 3]), clock=lambda: now[0])
    assert result.outcome == Outcome.OK and result.run_s is not None and result.run_s < 5.0
    assert sizes == [[64, 3], [128, 3]], "a small instance first, then the trial's own"
    assert runner.run_trial(trial(problem_size=[128, 3])).outcome == Outcome.OK
    assert sizes == [[64, 3], [128, 3], [128, 3]], "once per process"


def test_a_failed_warm_up_leaves_the_trial_alone(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    fake = use(monkeypatch, FakeCupy(scan_correct))
    monkeypatch.setattr(type(fake), "asnumpy", staticmethod(lambda a: 1 / 0))
    assert runner.run_trial(trial()).outcome == Outcome.OK
    assert "verification kernels not compiled ahead (ZeroDivisionError" in capsys.readouterr().err


def test_invalid_configuration_is_reported_with_the_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = use(monkeypatch, FakeCupy(scan_correct))
    result = runner.run_trial(trial(config={"items_per_thread": 3, "vector_width": 2}))
    assert result.outcome == Outcome.COMPILE_ERROR and "items_per_thread % vector_width" in result.error
    assert result.fingerprint.product == "Fake GPU" and fake.kernel.calls == 0


def test_no_gpu_is_an_infrastructure_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_gpu() -> Any:
        raise NoGpu("no GPU: no CUDA device is visible to this container")

    monkeypatch.setattr(gpu, "load_cupy", no_gpu)
    result = runner.run_trial(trial())
    assert result.outcome == Outcome.INFRA_ERROR
    assert result.error.startswith("no GPU")


def test_load_cupy_on_this_machine_says_why_there_is_no_gpu() -> None:
    try:
        gpu.load_cupy()
    except NoGpu as exc:
        assert str(exc).startswith("no GPU")
    else:
        pytest.skip("a CUDA device is present")


def test_compiled_modules_are_cached_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = use(monkeypatch, FakeCupy(scan_correct))
    constructed: list[tuple[str, ...]] = []
    original = fake.RawModule

    def counting(code: str, options: tuple[str, ...]) -> Any:
        if code != verification.SOURCE.read_text():  # tried once per process: verification.load
            constructed.append(options)
        return original(code, options)

    fake.RawModule = counting
    for _ in range(2):
        assert runner.run_trial(trial()).outcome == Outcome.OK
    assert runner.run_trial(trial(config={"items_per_thread": 8})).outcome == Outcome.OK
    assert len(constructed) == 2
