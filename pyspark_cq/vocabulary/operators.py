"""One descriptor per operator kind: what the other layers need to know about an operator, in one place.

An operator is a package under :mod:`pyspark_cq.operators` plus one :func:`register` call at the bottom of
this module. The control table reads the parameters it accepts per kind from here
(:data:`pyspark_cq.control.schema.OPERATOR_PARAMETERS`), the build guard the compiled modules
(:data:`pyspark_cq._native.NATIVE_MODULES`), the session's worker warm-up the worker modules
(:func:`worker_modules`) and the CQL compiler the operator implementing each query shape (:func:`for_shape`).

Pure: it imports nothing of pyspark_cq and never loads PySpark (docs/architecture.md, "Layers").
"""
from __future__ import annotations

from dataclasses import dataclass

from . import metrics as M

__all__ = ["OperatorDescriptor", "OPERATORS", "register", "descriptor", "for_shape", "worker_modules",
           "native_modules"]


@dataclass(frozen=True)
class OperatorDescriptor:
    """What the layers share about one operator kind.

    Attributes
    ----------
    kind : str
        The operator's kind: its public function's name and its ``operator_kind`` in the control table,
        e.g. ``"interval_join"``.
    package : str
        The package that implements it, e.g. ``"pyspark_cq.operators.join"`` (two kinds may share one).
    parameters : tuple of str
        The control-table parameters it reads (empty: it has no control entry).
    native : str or None
        The compiled module its workers load, e.g. ``"_join"`` (``pyspark_cq._join``).
    workers : tuple of str
        The modules a Spark Python worker imports to run it (what the session's warm-up preloads).
    metrics : tuple of str
        The fixed counters of its per-batch report (:mod:`pyspark_cq.vocabulary.metrics`); the indexed ones
        (per input, per probe step, per predicate) come from that module's builders.
    cql_shape : str or None
        The CQL compiler's query shape it implements (``"aggregate"``, ``"join"``, ``"rows"``, ...).
    more_cql_shapes : tuple of str
        Further shapes whose stateful step it is (``sliding_aggregate`` after Spark's join: ``"join_aggregate"``).
    """

    kind: str
    package: str
    parameters: tuple[str, ...] = ()
    native: str | None = None
    workers: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    cql_shape: str | None = None
    more_cql_shapes: tuple[str, ...] = ()


#: Every registered operator, by kind (in registration order).
OPERATORS: dict[str, OperatorDescriptor] = {}


def register(descriptor: OperatorDescriptor) -> OperatorDescriptor:
    """Add ``descriptor`` to :data:`OPERATORS` and return it.

    Raises
    ------
    ValueError
        When its kind, or the CQL shape it implements, is registered already.
    """
    if not isinstance(descriptor, OperatorDescriptor):
        raise TypeError(f"register takes an OperatorDescriptor, got {descriptor!r}")
    if descriptor.kind in OPERATORS:
        raise ValueError(f"operator kind {descriptor.kind!r} is registered already ({OPERATORS[descriptor.kind]})")
    for shape in ((descriptor.cql_shape,) if descriptor.cql_shape is not None else ()) + descriptor.more_cql_shapes:
        if for_shape(shape) is not None:
            raise ValueError(f"CQL shape {shape!r} is implemented by {for_shape(shape).kind!r} already")
    OPERATORS[descriptor.kind] = descriptor
    return descriptor


def descriptor(kind: str) -> OperatorDescriptor:
    """The descriptor of operator ``kind``; KeyError naming the known kinds."""
    try:
        return OPERATORS[kind]
    except KeyError:
        raise KeyError(f"no operator kind {kind!r}; known kinds: {', '.join(OPERATORS)}") from None


def for_shape(shape: str) -> OperatorDescriptor | None:
    """The operator implementing the CQL query shape ``shape``, or None (e.g. ``"stream"``: no operator)."""
    return next((d for d in OPERATORS.values() if d.cql_shape == shape or shape in d.more_cql_shapes), None)


def worker_modules() -> tuple[str, ...]:
    """Every operator's worker modules, each once, in registration order."""
    return tuple(dict.fromkeys(m for d in OPERATORS.values() for m in d.workers))


def native_modules() -> tuple[str, ...]:
    """The compiled modules the operators load, each once, in registration order."""
    return tuple(dict.fromkeys(d.native for d in OPERATORS.values() if d.native))


# ---- the operators: one register() call each ------------------------------------------------------

_OPS = "pyspark_cq.operators"

register(OperatorDescriptor(
    "interval_join", f"{_OPS}.join", ("lower", "upper", "drop_ratio", "params"),
    native="_join", workers=(f"{_OPS}.join.worker",), metrics=M.JOIN_STREAMING))
register(OperatorDescriptor(
    "window_join", f"{_OPS}.join", ("window", "drop_ratio", "params"),
    native="_join", workers=(f"{_OPS}.join.worker",), metrics=M.JOIN_STREAMING, cql_shape="join"))
register(OperatorDescriptor(
    "sliding_aggregate", f"{_OPS}.aggregate", ("window", "granularity", "drop_ratio", "params"),
    native="_aggregate", workers=(f"{_OPS}.aggregate.slicer", f"{_OPS}.aggregate.transport"),
    metrics=M.AGGREGATE, cql_shape="aggregate", more_cql_shapes=("join_aggregate",)))
register(OperatorDescriptor(
    "select_chain", f"{_OPS}.select_chain", ("plan_id", "drop_ratio", "params"),
    workers=(f"{_OPS}.select_chain.worker",), metrics=M.SELECT_CHAIN))
register(OperatorDescriptor(
    "multi_join", f"{_OPS}.multi_join", ("plan_id", "drop_ratio", "params"),
    native="_mjoin", workers=(f"{_OPS}.multi_join.worker",), metrics=M.MULTI_JOIN,
    cql_shape="multi_join"))
register(OperatorDescriptor(
    "rows_window", f"{_OPS}.rows_window", workers=(f"{_OPS}.rows_window.worker",), metrics=M.ROWS_WINDOW,
    cql_shape="rows"))
register(OperatorDescriptor(
    "rows_aggregate", f"{_OPS}.rows_window", workers=(f"{_OPS}.rows_window.worker",),
    metrics=M.ROWS_WINDOW, cql_shape="rows_aggregate"))
register(OperatorDescriptor(
    "granularity", f"{_OPS}.granularity", native="_granularity", workers=(f"{_OPS}.granularity.worker",),
    metrics=M.GRANULARITY))
register(OperatorDescriptor("window", f"{_OPS}.window", metrics=M.WINDOW))
