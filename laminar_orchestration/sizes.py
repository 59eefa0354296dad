"""Byte counts as a person reads them, the same in every message, log line and Dagster metadata."""

from __future__ import annotations

__all__ = ["human_size"]

_UNITS = ("KiB", "MiB", "GiB", "TiB")


def human_size(n: int) -> str:
    """`n` bytes as a size a person reads: ``512 B``, ``1.2 KiB``, ``3.4 MiB``, ``1.0 GiB``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in _UNITS:
        value /= 1024
        if value < 1024 or unit == _UNITS[-1]:
            break
    return f"{value:.1f} {unit}"
