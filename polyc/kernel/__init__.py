"""The kernel IR: the statements of one generated C function and the arrays it touches.

`comprehension` is a statement (one tensor comprehension per primitive node, over a box
domain); `prologue` rewrites statements (folding a producer into a contraction's operand
or epilogue, recomputing a local where it is read); `ir` groups them into a `Kernel` with
C-safe array names.
"""
from .ir import Array, Kernel, build_kernels, c_comment, c_ident, recompute_locals

__all__ = ["Array", "Kernel", "build_kernels", "c_comment", "c_ident", "recompute_locals"]
