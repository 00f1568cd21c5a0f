"""Sizes as ``krex run --mem`` and ``[memory]`` take them: binary units, clear refusals."""

from __future__ import annotations

import pytest

from krex_client.sizes import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4G", 4 << 30),
        ("4g", 4 << 30),
        ("4GiB", 4 << 30),
        ("4GB", 4 << 30),
        ("512M", 512 << 20),
        ("1.5G", 3 << 29),
        (" 64K ", 64 << 10),
        ("1T", 1 << 40),
        ("1048576", 1 << 20),
        (1234, 1234),
        ("0", 0),
    ],
)
def test_parse_size_accepts(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "bad", ["", "G", "4X", "-1G", "1.5", "4 G B", "4e9", True, 1.5, -3, "2048P"]
)
def test_parse_size_refuses_with_the_value_named(bad: object) -> None:
    with pytest.raises(ValueError) as err:
        parse_size(bad)  # type: ignore[arg-type]
    assert repr(bad) in str(err.value) or str(bad) in str(err.value)


def test_format_size() -> None:
    assert format_size(300) == "300 B"
    assert format_size(512 << 20) == "512 MiB"
    assert format_size(3 << 29) == "1.5 GiB"
    assert format_size(141 * 10**9) == "131.3 GiB"
