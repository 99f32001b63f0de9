"""Byte counts as people read them, in binary units (KiB, MiB, GiB) like the CLI's `--memory-limit`."""

from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(num_bytes: float) -> str:
    """1536 -> '1.50 KiB'; whole bytes below 1 KiB; GiB is the largest unit."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(num_bytes) < 1024 or unit == "GiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.2f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.2f} GiB"
