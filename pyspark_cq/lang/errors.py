"""The compiler's error: a CQL construct that parses but cannot be compiled to Spark (pure module)."""
from __future__ import annotations

__all__ = ["CQLCompileError"]


class CQLCompileError(ValueError):
    """A query the compiler cannot turn into Spark operators, naming the construct, where and why.

    Attributes
    ----------
    construct : str
        The construct (e.g. ``"RSTREAM of a ROWS window"``).
    line, column : int or None
        Where it starts in the query text.
    """

    def __init__(self, construct: str, why: str, node=None):
        self.construct, self.why = construct, why
        self.line = getattr(node, "line", None)
        self.column = getattr(node, "column", None)
        where = f"line {self.line}:{self.column}: " if self.line is not None else ""
        super().__init__(f"{where}cannot compile {construct}: {why}")
