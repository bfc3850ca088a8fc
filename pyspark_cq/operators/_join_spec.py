"""Join specification of :func:`pyspark_cq.interval_join` and :func:`pyspark_cq.window_join`.

Everything here runs on the driver when the query is defined: the argument checks, the output column
names and types, and the sharding argument. :class:`JoinSpec` holds what was decided; the workers
receive the picklable subset of it (:class:`pyspark_cq.operators._join_worker.JoinConfig`).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
from pyspark.sql import types as T

from .. import _validate
from ..control import ControlHandle, operator_handle, validate_changes
from ._shards import JOIN, resolve_shards

#: Accepted spellings of ``how`` and the join type each means.
HOW = {"inner": "inner", "left": "left", "left_outer": "left", "leftouter": "left",
       "right": "right", "right_outer": "right", "rightouter": "right",
       "full": "full", "outer": "full", "full_outer": "full", "fullouter": "full"}
#: Values of the deprecated ``grouping`` argument (now ``shards=None | int`` and ``shards="key"``).
GROUPINGS = ("shard", "key")


def shards_argument(shards, grouping, function: str, stacklevel: int = 3):
    """``shards`` with the deprecated ``grouping`` folded in (``grouping="key"`` is ``shards="key"``).

    ``grouping`` is kept for one release: any value but None warns (DeprecationWarning, pointing at
    the caller of ``function`` with ``stacklevel``), an unknown value raises ValueError, and
    ``grouping="shard"`` with ``shards="key"`` contradict each other.
    """
    if grouping is None:
        return shards
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping must be 'shard' or 'key', got {grouping!r} (grouping is deprecated: "
                         f"use shards=None, an int, or 'key')")
    replacement = "shards='key'" if grouping == "key" else "shards=None or an int (the default layout)"
    warnings.warn(f"{function}: grouping={grouping!r} is deprecated and will be removed in the next release; "
                  f"use {replacement} instead", DeprecationWarning, stacklevel=stacklevel)
    if grouping == "key":
        # As before: the per-key layout, whatever ``shards`` says (it is still checked).
        resolve_shards(shards, JOIN)
        return "key"
    if isinstance(shards, str) and shards == "key":
        raise ValueError("shards='key' and grouping='shard' contradict each other; drop grouping")
    return shards


@dataclass
class JoinSpec:
    """Everything the driver decided, in a picklable form the workers receive (via :class:`JoinConfig`).

    ``layout`` is ``"shard"`` (state grouped by hash shard of the key, ``shards`` of them) or ``"key"``
    (one group per raw key).
    """

    left: object = field(repr=False)
    right: object = field(repr=False)
    keys: list[str]
    key_types: list[T.DataType]
    left_time: str
    right_time: str
    how: str
    left_others: list[str]
    right_others: list[str]
    left_out: list[str]
    right_out: list[str]
    streaming: bool
    shards: int
    layout: str
    name: str
    window: tuple[int, int] | None
    control: ControlHandle | None = None
    drop_ratio: float = 0.0
    seed: int = 0
    lower: int = 0
    upper: int = 0

    @classmethod
    def build(cls, left, right, on, left_time, right_time, how, suffixes, shards, grouping, name, window, *,
              control=None, drop_ratio=0.0, seed=0, function="interval_join") -> JoinSpec:
        """Check the arguments (raising TypeError / ValueError naming the argument) and decide.

        ``function`` is the public function called (``"interval_join"`` or ``"window_join"``): it names
        the deprecation warning of ``grouping`` and the default report name ``"cq_<function>"``.
        """
        keys = _check_inputs(left, right, on, left_time, right_time)
        if not isinstance(how, str) or how.lower() not in HOW:
            raise ValueError(f"how must be one of 'inner', 'left', 'right', 'full', got {how!r}")
        # stacklevel 4: the user's call of interval_join / window_join (-> build -> shards_argument).
        shards = shards_argument(shards, grouping, function, stacklevel=4)
        default_name = "cq_" + function
        control = operator_handle(control, function)
        name, drop_ratio, seed = _check_control(control, name, drop_ratio, seed, default_name)
        if left.isStreaming != right.isStreaming:
            raise ValueError("left and right must both be streaming or both be batch DataFrames; got "
                             f"left.isStreaming={left.isStreaming}, right.isStreaming={right.isStreaming}")
        if left.isStreaming:
            _validate.require_watermark(left, left_time, "left_time")
            _validate.require_watermark(right, right_time, "right_time")
        key_types = _key_types(left, right, keys)
        left_others = [c for c in left.columns if c not in keys]
        right_others = [c for c in right.columns if c not in keys]
        left_out, right_out = output_names(keys, left_others, right_others, suffixes,
                                           extra=("valid_from", "valid_to") if window else ())
        layout, count = resolve_shards(shards, JOIN, df=left)
        if layout == "key":  # the count is unused (and not recorded); it stays what the default says
            count = resolve_shards(None, JOIN, df=left)[1]
        return cls(left, right, keys, key_types, left_time, right_time, HOW[how.lower()], left_others,
                   right_others, left_out, right_out, left.isStreaming, count, layout, name, window,
                   control, drop_ratio, seed)

    def output_schema(self) -> T.StructType:
        fields = [T.StructField(k, t, True) for k, t in zip(self.keys, self.key_types)]
        fields += [T.StructField(o, self.left.schema[c].dataType, True)
                   for c, o in zip(self.left_others, self.left_out)]
        fields += [T.StructField(o, self.right.schema[c].dataType, True)
                   for c, o in zip(self.right_others, self.right_out)]
        if self.window:
            fields += [T.StructField("valid_from", T.TimestampType(), True),
                       T.StructField("valid_to", T.TimestampType(), True)]
        return T.StructType(fields)


def _check_inputs(left, right, on, left_time, right_time) -> list[str]:
    """The key columns; raises unless both inputs are DataFrames with the keys and TIMESTAMP times."""
    _validate.dataframe(left, "left")
    _validate.dataframe(right, "right")
    keys = _validate.column_list(left, on, "on", allow_empty=False)
    _validate.column_list(right, keys, "on")
    for col, df, arg in ((left_time, left, "left_time"), (right_time, right, "right_time")):
        dtype = _validate.time_column(df, col, arg)
        if not isinstance(dtype, T.TimestampType):
            raise TypeError(f"{arg} must be a TIMESTAMP column (with time zone semantics); column "
                            f"{col!r} has type {dtype.simpleString()}")
    return keys


def _check_control(control, name, drop_ratio, seed, default_name) -> tuple[str, float, int]:
    """The metrics name, drop ratio and seed, checked (``control``: a bound ControlHandle or None)."""
    drop_ratio = validate_changes({"drop_ratio": drop_ratio})["drop_ratio"]
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if name is None:
        name = control.operator if control is not None else default_name
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    return name, drop_ratio, int(seed)


def _key_types(left, right, keys) -> list[T.DataType]:
    """The type each key is compared in: the common type, or long for two integral types."""
    key_types = []
    for k in keys:
        lt, rt = left.schema[k].dataType, right.schema[k].dataType
        if lt == rt:
            key_types.append(lt)
        elif isinstance(lt, T.IntegralType) and isinstance(rt, T.IntegralType):
            key_types.append(T.LongType())
        else:
            raise TypeError(f"on: key column {k!r} has type {lt.simpleString()} on the left and "
                            f"{rt.simpleString()} on the right; cast one side first")
        if isinstance(key_types[-1], (T.ArrayType, T.MapType, T.StructType)):
            raise TypeError(f"on: key column {k!r} has the unsupported type {lt.simpleString()}")
    return key_types


def output_names(keys, left_others, right_others, suffixes, extra=()) -> tuple[list[str], list[str]]:
    """Output names of the non-key columns of each side (``suffixes`` appended to clashing names)."""
    clash = sorted(set(left_others) & set(right_others))
    if suffixes is not None:
        if (not isinstance(suffixes, (tuple, list)) or len(suffixes) != 2
                or not all(isinstance(s, str) for s in suffixes) or suffixes[0] == suffixes[1]):
            raise ValueError(f"suffixes must be a pair of two different strings, got {suffixes!r}")
    elif clash:
        raise ValueError(f"left and right both have the column(s) {clash}; rename them or pass "
                         f"suffixes=('_left', '_right')")
    ls, rs = suffixes if suffixes is not None else ("", "")
    left_out = [c + ls if c in clash else c for c in left_others]
    right_out = [c + rs if c in clash else c for c in right_others]
    names = list(keys) + left_out + right_out + list(extra)
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"the output would have the column(s) {dup} twice; choose other suffixes or "
                         f"rename the input columns")
    return left_out, right_out
