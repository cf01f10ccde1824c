"""Problem sizes: the tuple, its text form, and the pool keys that carry it."""

from __future__ import annotations

import pytest

from fleettune.sizes import (
    parse_size,
    parse_size_key,
    pool_key,
    problem_size,
    size_key,
    size_of_key,
    target_of_key,
)


def test_normalise() -> None:
    assert problem_size([4096, 4096]) == problem_size((4096, 4096)) == (4096, 4096)
    assert problem_size(["2048", 2048.0]) == (2048, 2048)
    assert problem_size(1024) == problem_size("1024") == (1024,)  # a Kernel Tuner cache's bare number
    assert problem_size([]) == ()


def test_key_round_trip() -> None:
    for size in [(4096, 4096), (1,), (512, 256, 8)]:
        assert parse_size_key(size_key(size)) == size
    assert size_key([2048, 1024]) == "2048x1024"


@pytest.mark.parametrize("text", ["", "x", "4096,4096", "4096x", "x8", "0x8", "-1x8", "4096 x 4096x", "a100"])
def test_parse_size_key_rejects_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match=r"problem size .*4096x4096"):
        parse_size_key(text)


def test_parse_size_from_the_command_line() -> None:
    assert parse_size("2048,2048") == parse_size("2048x2048") == parse_size("2048, 2048") == (2048, 2048)
    for bad in ["a,b", "", "0,8", "8,-1"]:
        with pytest.raises(ValueError, match="like 2048,2048"):
            parse_size(bad)


def test_pool_keys() -> None:
    key = pool_key("a100", (2048, 2048), several=True)
    assert key == "a100.2048x2048"
    assert target_of_key(key) == "a100" and size_of_key(key) == (2048, 2048)
    assert pool_key("a100", (2048, 2048), several=False) == "a100" == target_of_key("a100")
    assert size_of_key("a100") is None
    with pytest.raises(ValueError):
        size_of_key("a100.big")
