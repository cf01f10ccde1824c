"""Bad specs: each gets one SpaceError naming the field (and position for expressions)."""

from __future__ import annotations

import pytest

from fleettune.space import SearchSpace, SpaceError

OK = {"name": "bx", "type": "ordinal", "values": [16, 32]}


def err_of(parameters, constraints=()) -> SpaceError:
    with pytest.raises(SpaceError) as info:
        SearchSpace.from_spec(parameters, list(constraints))
    return info.value


@pytest.mark.parametrize(("params", "field", "fragment"), [
    ([], "parameters", "at least one parameter"),
    ("bx", "parameters", "expected a list"),
    ([OK, {"name": "bx", "type": "integer", "range": {"min": 1, "max": 2}}], "parameters[1].name", "duplicate"),
    ([{"name": "", "type": "boolean"}], "parameters[0].name", "non-empty"),
    ([{"type": "boolean"}], "parameters[0].name", "non-empty"),
    ([{"name": "1x", "type": "boolean"}], "parameters[0].name", "identifier"),
    ([{"name": "device", "type": "boolean"}], "parameters[0].name", "reserved"),
    ([{"name": "x", "type": "ordinal", "values": []}], "parameters[0].values", "empty"),
    ([{"name": "x", "type": "ordinal", "values": [1, 2, 1]}], "parameters[0].values[2]", "duplicate value 1"),
    ([{"name": "x", "type": "ordinal", "values": [1, "a"]}], "parameters[0].values[1]", "expected a number"),
    ([{"name": "x", "type": "categorical", "values": [[1]]}], "parameters[0].values[0]", "expected a string"),
    ([{"name": "x", "type": "int", "values": [1]}], "parameters[0].type", "did you mean 'integer'"),
    ([{"name": "x", "type": "float", "values": [1]}], "parameters[0].type", "unknown type 'float'"),
    ([{"name": "x", "type": "integer"}], "parameters[0]", "needs 'range'"),
    ([{"name": "x", "type": "integer", "range": {"min": 3, "max": 1}}], "parameters[0].range", "greater than max"),
    ([{"name": "x", "type": "integer", "range": {"min": 1, "max": 3, "step": 0}}], "parameters[0].range.step",
     "positive"),
    ([{"name": "x", "type": "integer", "range": {"min": 1.5, "max": 3}}], "parameters[0].range.min", "integer"),
    ([{"name": "x", "type": "real", "range": {"min": 0, "max": 1}}], "parameters[0].range", "needs a 'step'"),
    ([{"name": "x", "type": "integer", "range": {"min": 0, "max": 10**9}}], "parameters[0].range", "larger step"),
    ([{"name": "x", "type": "permutation", "size": 12}], "parameters[0].size", "from 1 to 9"),
    ([{"name": "x", "type": "ordinal", "values": [0, 1, 2], "scale": "log"}], "parameters[0].scale", "positive"),
    ([{"name": "x", "type": "ordinal", "values": [1, 2], "scale": "cubic"}], "parameters[0].scale", "unknown scale"),
    ([{"name": "x", "type": "categorical", "values": ["a"], "scale": "log"}], "parameters[0].scale",
     "not a field of a categorical"),
    ([{"name": "x", "type": "ordinal", "values": [1, 2], "default": 3}], "parameters[0].default", "not one of"),
    ([{"name": "x", "type": "ordinal", "valeus": [1, 2]}], "parameters[0].valeus", "not a field"),
    ([OK, 7], "parameters[1]", "expected an object"),
])
def test_bad_parameters(params, field, fragment):
    err = err_of(params)
    assert err.field == field, str(err)
    assert fragment in err.message, str(err)
    assert err.position is None


@pytest.mark.parametrize(("constraints", "field", "fragment"), [
    (["bx >"], "constraints[0]", "syntax error"),
    (["bx > 1", "by > 1"], "constraints[1]", "unknown parameter 'by'"),
    ([42], "constraints[0]", "string expression"),
    (["bx > 100"], "constraints[0]", "no value of bx satisfies"),
    (["bx > 16", "bx < 32"], "constraints[1]", "together with constraints[0..0] leaves no valid configuration"),
])
def test_bad_constraints(constraints, field, fragment):
    err = err_of([OK], constraints)
    assert err.field == field, str(err)
    assert fragment in err.message, str(err)


def test_pydantic_style_none_fields_are_absent():
    space = SearchSpace.from_spec([{"name": "x", "type": "integer", "range": {"min": 1, "max": 3, "step": None},
                                    "values": None, "scale": None, "size": None, "default": None}], None)
    assert space.count() == 3


def test_real_parameter_with_step_and_log_scale():
    space = SearchSpace.from_spec([{"name": "r", "type": "real", "range": {"min": 0.1, "max": 0.5, "step": 0.1}}])
    assert space.parameters[0].values == (0.1, 0.2, 0.3, 0.4, 0.5)
    assert space.to_rows([{"r": 0.30000000000000004}]).tolist() == [[2]]
    lg = SearchSpace.from_spec([{"name": "x", "type": "ordinal", "values": [1, 10, 100], "scale": "log"}])
    assert lg.encode(lg.enumerate())[:, 0].tolist() == pytest.approx([0, 0.5, 1])
    lin = SearchSpace.from_spec([{"name": "x", "type": "ordinal", "values": [1, 2, 4, 8], "scale": "linear"}])
    assert lin.encode(lin.enumerate())[:, 0].tolist() == pytest.approx([0, 1 / 7, 3 / 7, 1])


def test_space_error_string_format():
    err = SpaceError("constraints[1]", "unknown parameter 'q'", position=5, snippet="q")
    assert str(err) == "constraints[1]: unknown parameter 'q' (at column 5: 'q')"
    assert str(SpaceError("parameters[0].name", "bad")) == "parameters[0].name: bad"
