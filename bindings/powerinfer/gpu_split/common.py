"""What every part of the placement shares: its errors, the solver's group size, the device
allocator's alignment and the number formatting of its messages."""
from __future__ import annotations

GROUP = 256                      # neurons per solver group (the original's reshape to [-1, 256])
ALIGN = 256                      # device buffers start at 256-byte boundaries (arena sub-allocation)


class GpuSplitError(ValueError):
    """Bad input to the placement (activation files, index file, budget)."""


class ActivationError(GpuSplitError):
    """The activation statistics are missing or malformed."""


class GpuIndexError(GpuSplitError):
    """A .gpuidx file is unreadable or inconsistent."""


class BudgetError(GpuSplitError):
    """The VRAM budget cannot hold even the dense part of the model."""

    def __init__(self, message: str, min_budget_bytes: int):
        super().__init__(message)
        self.min_budget_bytes = min_budget_bytes



def padded(n: int) -> int:
    """Bytes a device buffer of n bytes takes inside an arena."""
    return -(-int(n) // ALIGN) * ALIGN


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"
