"""Byte counts in binary units, the same in the CLI's tables and in the pictures."""

from __future__ import annotations

from graphpipe.units import format_bytes


def test_binary_units() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**20) == "3.00 MiB"
    assert format_bytes(5 * 2**40) == "5120.00 GiB"
