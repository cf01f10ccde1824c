from __future__ import annotations

import pytest

from fleettune_job.expressions import ExpressionError, dimension, evaluate, geometry

CFG = {"block_size_x": 32, "block_size_y": 4, "tile_size_x": 2, "use_padding": 1, "use_shmem": 0}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("block_size_x * block_size_y", 128),
        ("problem_size[0] // (block_size_x * tile_size_x)", 64),
        ("cdiv(problem_size[1], block_size_y)", 1000),
        ("cdiv(4001, 4)", 1001),
        ("max(1, min(block_size_x, 16))", 16),
        ("ceil(problem_size[0] / 3)", 1366),
        ("-block_size_y + 2 ** 3", 4),
        ("block_size_x % 32 != 0", False),
        ("use_padding==0 or block_size_x % 32 != 0", False),
        ("use_padding==0 or use_shmem != 0", False),
        ("1 < block_size_y <= 4", True),
        ("16 if use_shmem else 8", 8),
        ("not use_shmem", True),
    ],
)
def test_evaluates_arithmetic_over_parameters_and_problem_size(text: str, expected: object) -> None:
    assert evaluate(text, CFG, [4096, 4000]) == expected


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "block_size_x.__class__",
        "open('/etc/passwd')",
        "(lambda: 1)()",
        "[1, 2]",
        "'a' * 3",
        "CFG['x']",
        "problem_size",  # a name, but not a number: fails at evaluation
        "x := 3",
        "2 ** 10 ** 10",
        "max(x=1)",
        "",
        "1 +",
    ],
)
def test_rejects_anything_but_whitelisted_arithmetic(text: str) -> None:
    with pytest.raises(ExpressionError):
        dimension(text, CFG, [4096], "grid")


def test_unknown_names_and_out_of_range_problem_size_are_reported_by_name() -> None:
    with pytest.raises(ExpressionError, match="unknown name 'tile_k'"):
        evaluate("tile_k * 2", CFG, [1])
    with pytest.raises(ExpressionError, match=r"problem_size\[2\] out of range"):
        evaluate("problem_size[2]", CFG, [1, 2])
    with pytest.raises(ExpressionError, match="cannot evaluate"):
        evaluate("problem_size[0] // (block_size_x - 32)", CFG, [1])


def test_geometry_pads_to_three_dimensions_and_requires_integers() -> None:
    assert geometry(["cdiv(problem_size[0], block_size_x)"], CFG, [100], "grid") == (4, 1, 1)
    assert geometry(["block_size_x", "block_size_y", "2"], CFG, [], "block") == (32, 4, 2)
    assert geometry(["problem_size[0] / 4"], CFG, [100], "grid") == (25, 1, 1)  # integral float is fine
    with pytest.raises(ExpressionError, match="not an integer"):
        geometry(["problem_size[0] / 3"], CFG, [100], "grid")
    with pytest.raises(ExpressionError, match="1 to 3"):
        geometry(["1", "1", "1", "1"], CFG, [], "block")
    # CUDA, not the evaluator, rejects an empty grid: that is the configuration's real verdict.
    assert geometry(["block_size_y - 4"], CFG, [], "grid") == (0, 1, 1)


