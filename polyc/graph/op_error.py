"""The error of a node that is wrong, raised by the op registry's rules (`ops.py`)."""
from __future__ import annotations


class OpError(Exception):
    """A node is wrong; `field` names the attribute or 'inputs'."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field
