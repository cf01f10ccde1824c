"""A user kernel's arguments: lengths, dtypes, initial data and scalars, on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleettune_job.arguments import (
    BASE_SEED,
    ArraySpec,
    ScalarSpec,
    cast_scalar,
    initial_arrays,
    resolve_arguments,
    scalar_values,
)
from fleettune_job.classify import TrialSpecError
from fleettune_job.protocol import Argument

DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def arrays(*arguments: Argument, problem_size: tuple[int, ...] = (500,)) -> dict[str, np.ndarray]:
    out = Argument(name="out", length="1", init="zeros", output=True)
    return initial_arrays(resolve_arguments([*arguments, out], problem_size))


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_data_is_uniform_in_0_1_or_integers_0_to_99(dtype: Any) -> None:
    data = arrays(Argument(name="x", dtype=dtype, length="problem_size[0] * 2"))["x"]
    assert data.dtype == np.dtype(dtype) and data.shape == (1000,)
    if np.dtype(dtype).kind == "f":
        assert data.min() >= 0 and data.max() <= 1 and len(np.unique(data)) > 100
        if dtype != "float16":  # float16 may round 0.9997 up to 1
            assert data.max() < 1
    else:
        assert data.min() == 0 and data.max() == 99


@pytest.mark.parametrize("dtype", DTYPES)
def test_zeros_and_constants(dtype: Any) -> None:
    data = arrays(Argument(name="z", dtype=dtype, length="7", init="zeros"),
                  Argument(name="c", dtype=dtype, length="problem_size[0]", init="constant", constant=3))
    assert data["z"].dtype == np.dtype(dtype) and data["z"].tolist() == [0] * 7
    assert data["c"].dtype == np.dtype(dtype) and data["c"].shape == (500,) and set(data["c"].tolist()) == {3}


def test_seeds_make_the_same_data_every_time_and_differ_by_position() -> None:
    a = Argument(name="a", length="problem_size[0]")
    b = Argument(name="b", length="problem_size[0]")
    first, again = arrays(a, b), arrays(a, b)
    np.testing.assert_array_equal(first["a"], again["a"])
    np.testing.assert_array_equal(first["b"], again["b"])
    assert not np.array_equal(first["a"], first["b"])  # positions 0 and 1 get seeds BASE_SEED + 0 and + 1
    np.testing.assert_array_equal(first["a"], np.random.default_rng(BASE_SEED).random(500, dtype=np.float32))
    seeded = arrays(Argument(name="a", length="problem_size[0]", seed=42),
                    Argument(name="b", length="problem_size[0]", seed=42))
    np.testing.assert_array_equal(seeded["a"], seeded["b"])
    assert not np.array_equal(seeded["a"], first["a"])


def test_the_host_data_is_fresh_on_every_call() -> None:
    specs = resolve_arguments([Argument(name="o", length="3", init="constant", constant=1, output=True)], ())
    initial_arrays(specs)["o"][:] = 5
    assert initial_arrays(specs)["o"].tolist() == [1, 1, 1]


def test_data_files_take_whitespace_and_commas(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("1.5, 2\n3\t4,5e-1 ,\n-inf\n")
    (tmp_path / "i.txt").write_text(f"{2**60 + 1} -3 7")
    data = arrays(Argument(name="f", length="6", init="data", data_path=str(tmp_path / "f.txt")),
                  Argument(name="i", dtype="int64", length="3", init="data", data_path=str(tmp_path / "i.txt")))
    assert data["f"].dtype == np.float32 and data["f"].tolist() == [1.5, 2, 3, 4, 0.5, -np.inf]
    assert data["i"].tolist() == [2**60 + 1, -3, 7]  # exact: not through a float


@pytest.mark.parametrize(
    ("text", "dtype", "match"),
    [
        ("1 2", "float32", "argument d: data file .* holds 2 numbers, length is 3"),
        ("1 2 3 4", "float32", "holds 4 numbers, length is 3"),
        ("1 two 3", "float32", "argument d: .*number 2: 'two' is not a number"),
        ("1 2.5 3", "int32", "number 2: '2.5' is not an integer"),
        ("1 300 3", "int8", r"number 2: 300 is out of range for int8 \(-128..127\)"),
        ("1 -1 3", "uint16", "out of range for uint16"),
        ("1 1e300 3", "float32", "overflows float32"),
    ],
)
def test_garbled_data_files_name_the_argument(tmp_path: Path, text: str, dtype: Any, match: str) -> None:
    (tmp_path / "d.txt").write_text(text)
    with pytest.raises(TrialSpecError, match=match):
        arrays(Argument(name="d", dtype=dtype, length="3", init="data", data_path=str(tmp_path / "d.txt")))


def test_a_missing_data_file_is_the_trials_problem(tmp_path: Path) -> None:
    with pytest.raises(TrialSpecError, match=r"argument d: cannot read data file .*missing\.txt"):
        arrays(Argument(name="d", length="3", init="data", data_path=str(tmp_path / "missing.txt")))
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TrialSpecError, match=r"argument d: data file .* is not text"):
        arrays(Argument(name="d", length="3", init="data", data_path=str(tmp_path / "bin")))


def test_resolved_specs() -> None:
    specs = resolve_arguments([
        Argument(name="x", dtype="float64", length="problem_size[0] * problem_size[1]"),
        Argument(name="n", kind="scalar", dtype="uint32", value="problem_size[0] + tile"),
        Argument(name="y", length="problem_size[1] / 2", init="zeros", output=True),
    ], (10, 8))
    x, n, y = specs
    assert isinstance(x, ArraySpec) and x.length == 80 and x.nbytes == 640 and x.seed == BASE_SEED
    assert isinstance(n, ScalarSpec) and n.dtype == np.uint32
    assert isinstance(y, ArraySpec) and y.length == 4 and y.output  # an integral float is a length


@pytest.mark.parametrize(
    ("argument", "match"),
    [
        (Argument(name="x", length="problem_size[0] / 3"),
         r"length of x 'problem_size\[0\] / 3' = 3.33.* not an integer"),
        (Argument(name="x", length="tile * 2"), "unknown name 'tile'.*a length may use problem_size only"),
        (Argument(name="x", length="problem_size[0] - 10"), r"length 'problem_size\[0\] - 10' is 0"),
        (Argument(name="x", length="problem_size[1]"), r"problem_size\[1\] out of range"),
        (Argument(name="x"), "argument x: an array needs a length"),
        (Argument(name="x", length="2**40"), "the arrays need 4096.00 GiB, more than the 4 GiB"),
        (Argument(name="x", length="1", init="constant"), "init constant needs a constant"),
        (Argument(name="x", length="1", dtype="uint8", init="constant", constant=-1), "constant -1 is out of range"),
        (Argument(name="x", length="1", init="data"), "init data needs a data_path"),
        (Argument(name="x", length="1", seed=-1), "seed -1 is negative"),
        (Argument(name="s", kind="scalar"), "a scalar needs a value"),
        (Argument(name="s", kind="scalar", value="1", output=True), "a scalar cannot be an output"),
        (Argument(name="out", length="1"), "duplicate name"),
    ],
)
def test_unusable_declarations_are_trial_errors(argument: Argument, match: str) -> None:
    with pytest.raises(TrialSpecError, match=match):
        arrays(argument, problem_size=(10,))


def test_an_interface_without_outputs_cannot_be_verified() -> None:
    with pytest.raises(TrialSpecError, match="no array is an output"):
        resolve_arguments([Argument(name="x", length="1")], ())


def test_scalars_are_cast_to_their_dtype() -> None:
    specs = resolve_arguments([
        Argument(name="o", length="1", output=True),
        Argument(name="alpha", kind="scalar", value="1 / tile"),
        Argument(name="n", kind="scalar", dtype="int64", value="problem_size[0] * tile"),
        Argument(name="h", kind="scalar", dtype="float16", value="0.5"),
        Argument(name="flag", kind="scalar", dtype="uint8", value="tile > 2"),
    ], (3,))
    values = scalar_values(specs, {"tile": 4}, (3,))
    assert values == {"alpha": 0.25, "n": 12, "h": 0.5, "flag": 1}
    assert [type(v) for v in values.values()] == [np.float32, np.int64, np.float16, np.uint8]
    with pytest.raises(ValueError, match="argument alpha: cannot evaluate '1 / tile'"):
        scalar_values(specs, {"tile": 0}, (3,))
    with pytest.raises(ValueError, match="argument alpha: unknown name 'tile'"):
        scalar_values(specs, {}, (3,))


@pytest.mark.parametrize(
    ("value", "dtype", "match"),
    [(2.5, "int32", "not an integer"), (128, "int8", "out of range"), (1e6, "float16", "overflows float16"),
     (10**400, "float64", "overflows float64"), (float("nan"), "int32", "not an integer")],
)
def test_values_that_do_not_fit_their_dtype(value: Any, dtype: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cast_scalar(value, np.dtype(dtype))


def test_exact_casts() -> None:
    assert cast_scalar(True, np.dtype("int32")) == 1
    assert cast_scalar(3.0, np.dtype("uint64")) == 3 and type(cast_scalar(3.0, np.dtype("uint64"))) is np.uint64
    assert cast_scalar(2**63 - 1, np.dtype("int64")) == 2**63 - 1
    assert np.isnan(cast_scalar(float("nan"), np.dtype("float32")))
