"""A user kernel with its own interface, from trial to builds, without a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleettune_job.arguments import ArraySpec
from fleettune_job.classify import GeometryError, InvalidConfiguration, JobError, TrialSpecError
from fleettune_job.prepare import PreparedUser, prepare
from fleettune_job.protocol import Argument, KernelRef, Outcome, Trial, Verification

SOURCE = 'extern "C" __global__ void saxpy(float *y, const float *x, float a, int n) {}\n'
ARGUMENTS = [
    Argument(name="y", length="problem_size[0] * problem_size[1]", init="zeros", output=True),
    Argument(name="x", length="problem_size[0] * problem_size[1]"),
    Argument(name="a", kind="scalar", value="ALPHA"),
    Argument(name="n", kind="scalar", dtype="int32", value="problem_size[0] * problem_size[1]"),
]
REFERENCE = {"BLOCK": 128, "ALPHA": 2, "UNROLL": False, "MODE": "plain"}


def kernel(tmp_path: Path, **changes: Any) -> KernelRef:
    src = tmp_path / "saxpy.cu"
    src.write_text(SOURCE)
    fields: dict[str, Any] = {
        "source_path": str(src), "function": "saxpy", "grid": ["cdiv(problem_size[0], BLOCK)", "problem_size[1]"],
        "block": ["BLOCK"], "arguments": ARGUMENTS, "verification": Verification(reference_config=REFERENCE),
    }
    return KernelRef(**(fields | changes))


def prepared(tmp_path: Path, config: dict[str, Any] | None = None, problem_size: tuple[int, ...] = (1000, 3),
             **changes: Any) -> PreparedUser:
    trial = Trial(run="r", target="a100", index=0, kernel=kernel(tmp_path, **changes),
                  config=REFERENCE if config is None else config, problem_size=list(problem_size))
    p = prepare(trial)
    assert isinstance(p, PreparedUser)
    return p


def test_defines_geometry_and_scalars_of_the_candidate_and_the_reference(tmp_path: Path) -> None:
    p = prepared(tmp_path, {"BLOCK": 256, "ALPHA": 0.5, "UNROLL": True, "MODE": "fast"})
    c = p.candidate
    assert c.source == SOURCE and c.function == "saxpy" and p.label == "saxpy.cu:saxpy"
    assert c.defines == {"BLOCK": "256", "ALPHA": "0.5f", "UNROLL": "1", "MODE": "fast",
                         "problem_size_0": "1000", "problem_size_1": "3"}
    assert c.code.startswith("#define ALPHA 0.5f\n#define BLOCK 256\n#define MODE fast\n#define UNROLL 1\n"
                             "#define problem_size_0 1000\n#define problem_size_1 3\n#line 1\n")
    assert c.grid == (4, 3, 1) and c.block == (256, 1, 1) and c.threads_per_block == 256
    assert c.scalars == {"a": 0.5, "n": 3000}
    assert type(c.scalars["a"]) is np.float32 and type(c.scalars["n"]) is np.int32

    r = p.reference
    assert r is not None and r.function == "saxpy"
    assert r.defines["BLOCK"] == "128" and r.defines["UNROLL"] == "0" and r.defines["MODE"] == "plain"
    assert r.grid == (8, 3, 1) and r.block == (128, 1, 1) and r.scalars == {"a": 2.0, "n": 3000}

    assert [a.name for a in p.outputs] == ["y"]
    x = p.arguments[1]
    assert isinstance(x, ArraySpec) and x.length == 3000 and x.dtype == np.float32
    assert (p.atol, p.rtol) == (1e-6, 1e-5)


def test_the_reference_configuration_is_its_own_reference(tmp_path: Path) -> None:
    assert prepared(tmp_path, dict(REFERENCE)).reference is None
    # The same values written differently build the same kernel.
    assert prepared(tmp_path, REFERENCE | {"UNROLL": 0, "ALPHA": 2.0}).reference is None
    with_function = prepared(tmp_path, dict(REFERENCE),
                             verification=Verification(reference_config=REFERENCE, reference_function="saxpy_ref",
                                                       atol=0.5, rtol=0))
    assert with_function.reference is not None and with_function.reference.function == "saxpy_ref"
    assert with_function.reference.defines == with_function.candidate.defines
    assert (with_function.atol, with_function.rtol) == (0.5, 0)


def _raises(tmp_path: Path, error: type[JobError], match: str, config: dict[str, Any] | None = None,
            **changes: Any) -> JobError:
    with pytest.raises(error, match=match) as info:
        prepared(tmp_path, REFERENCE | (config or {}), **changes)
    return info.value


def test_a_missing_source_file_is_the_pods_problem(tmp_path: Path) -> None:
    err = _raises(tmp_path, TrialSpecError, "cannot read kernel source .*nothere.cu",
                  source_path=str(tmp_path / "nothere.cu"))
    assert err.outcome == Outcome.INFRA_ERROR


@pytest.mark.parametrize(
    ("config", "changes", "match"),
    [
        ({"BLOCK": 0}, {}, "launch geometry: cannot evaluate 'cdiv.*cdiv by zero"),
        ({}, {"block": ["THREADS"]}, "launch geometry: unknown name 'THREADS'"),
        ({"BLOCK": 100}, {"block": ["BLOCK / 3"]}, r"block\[0\] 'BLOCK / 3' = 33.3.* not an integer"),
    ],
)
def test_geometry_that_does_not_evaluate_is_a_launch_error(tmp_path: Path, config: dict[str, Any],
                                                           changes: dict[str, Any], match: str) -> None:
    # The reference builds with the same expressions: give it a geometry that works.
    reference = REFERENCE | {"BLOCK": 96, "THREADS": 64}
    changes = {"verification": Verification(reference_config=reference)} | changes
    err = _raises(tmp_path, GeometryError, match, config, **changes)
    assert err.outcome == Outcome.LAUNCH_ERROR


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"MODE": "a -DX=1"}, "MODE has a value that cannot be a compile-time constant"),
        ({"bad-name": 1}, "not a C identifier"),
        ({"ALPHA": "fast"}, "argument a: unknown name 'ALPHA'"),  # a define, but not a number
        ({"ALPHA": 1e39}, "argument a: 1e\\+39 overflows float32"),
    ],
)
def test_configurations_that_cannot_build_are_compile_errors(tmp_path: Path, config: dict[str, Any],
                                                              match: str) -> None:
    err = _raises(tmp_path, InvalidConfiguration, match, config)
    assert err.outcome == Outcome.COMPILE_ERROR


@pytest.mark.parametrize(
    ("reference", "match"),
    [
        ({"BLOCK": 0}, "reference configuration failed: launch geometry: cannot evaluate"),
        ({"BLOCK": 64, "MODE": "x y"}, "reference configuration failed: parameter MODE has a value"),
        ({"BLOCK": 64}, "reference configuration failed: argument a: unknown name 'ALPHA'"),
    ],
)
def test_a_reference_that_cannot_be_prepared_is_the_runs_problem(tmp_path: Path, reference: dict[str, Any],
                                                                 match: str) -> None:
    err = _raises(tmp_path, TrialSpecError, match, verification=Verification(reference_config=reference))
    assert err.outcome == Outcome.INFRA_ERROR


def test_lengths_and_data_files_are_checked_when_preparing(tmp_path: Path) -> None:
    bad_length = [ARGUMENTS[0], Argument(name="x", length="problem_size[0] / 7"), *ARGUMENTS[2:]]
    _raises(tmp_path, TrialSpecError, r"argument x: length of x 'problem_size\[0\] / 7' = 142.8.* not an integer",
            arguments=bad_length)
    (tmp_path / "x.txt").write_text("1 2 3")
    from_data = [ARGUMENTS[0], Argument(name="x", length="problem_size[0] * problem_size[1]", init="data",
                                        data_path=str(tmp_path / "x.txt")), *ARGUMENTS[2:]]
    _raises(tmp_path, TrialSpecError, "argument x: data file .* holds 3 numbers, length is 3000", arguments=from_data)
    p = prepared(tmp_path, problem_size=(3, 1), arguments=from_data)
    x = p.arguments[1]
    assert isinstance(x, ArraySpec) and x.data is not None and x.data.tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    ("changes", "problem_size", "match"),
    [
        ({"builtin": "scan"}, (1000, 3), "kernel.builtin must be unset"),
        ({"grid": None, "verification": None}, (1000, 3), "a user kernel needs kernel.grid, kernel.verification"),
        ({"function": None}, (1000, 3), "a user kernel needs kernel.function"),
        ({}, (1000, 0), "problem_size entries must be positive"),
        ({"arguments": ARGUMENTS[1:]}, (1000, 3), "no array is an output"),
    ],
)
def test_incomplete_user_kernels_are_trial_errors(tmp_path: Path, changes: dict[str, Any],
                                                  problem_size: tuple[int, ...], match: str) -> None:
    with pytest.raises(TrialSpecError, match=match):
        prepared(tmp_path, problem_size=problem_size, **changes)


def test_verification_without_arguments_is_refused() -> None:
    trial = Trial(run="r", target="t", index=0, config={}, problem_size=[],
                  kernel=KernelRef(builtin="scan", verification=Verification(reference_config={})))
    with pytest.raises(TrialSpecError, match=r"kernel\.verification applies to user kernels"):
        prepare(trial)


def test_a_source_edited_since_the_operator_checked_it_is_not_the_configurations_fault(tmp_path: Path) -> None:
    import hashlib

    checked = hashlib.sha256(SOURCE.encode()).hexdigest()
    assert prepared(tmp_path, source_sha256=checked).candidate.function == "saxpy"
    err = _raises(tmp_path, TrialSpecError, "changed since the run checked it", source_sha256="0" * 64)
    assert err.outcome == Outcome.INFRA_ERROR
