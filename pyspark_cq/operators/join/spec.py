"""Join specification of :func:`pyspark_cq.interval_join` and :func:`pyspark_cq.window_join`.

Everything here runs on the driver when the query is defined: the argument checks, the output column
names and types, and the sharding argument. :class:`JoinSpec` holds what was decided; the workers
receive the picklable subset of it (:class:`pyspark_cq.operators.join.worker.JoinConfig`).
"""
from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass, field

import numpy as np
from pyspark.sql import types as T

from ... import _validate
from ...control import ControlHandle, operator_handle
from ...control.schema import drop_ratio_value
from .._common import changelog as _changelog
from .._common import stateless as _stateless
from .._common.shards import JOIN, MULTI_JOIN, default_shard_count, resolve_shards
from .._common.stateless import stateless_settings

__all__ = ["HOW", "LEFT_ONLY", "DEFAULT_SUFFIXES", "GROUPINGS", "shards_argument", "JoinSpec", "output_names"]

#: Accepted spellings of ``how`` and the join type each means.
#: ``output_mode``: the streaming query's output mode, which Spark requires the stateful stage to declare.
OUTPUT_MODES = ("append", "update")
#: The join types Spark 4.3 runs between two streams in update mode (UnsupportedOperationChecker).
UPDATE_HOWS = ("inner", "left_semi")
HOW = {"inner": "inner", "left": "left", "left_outer": "left", "leftouter": "left",
       "right": "right", "right_outer": "right", "rightouter": "right",
       "full": "full", "outer": "full", "full_outer": "full", "fullouter": "full",
       "left_semi": "left_semi", "leftsemi": "left_semi", "semi": "left_semi",
       "left_anti": "left_anti", "leftanti": "left_anti", "anti": "left_anti"}
#: Join types whose output is the left input's rows only (Spark's ``left_semi`` / ``left_anti``).
LEFT_ONLY = ("left_semi", "left_anti")
#: Suffixes of columns present on both sides when ``suffixes`` is not given.
DEFAULT_SUFFIXES = ("_left", "_right")
#: ``state_persistence``'s values, the default directory of the files layout and Spark's retention setting: shared
#: with ``multi_join`` (:mod:`.._common.changelog`).
PERSISTENCE, STATE_DIR_DEFAULT = _changelog.PERSISTENCE, _changelog.STATE_DIR_DEFAULT
RETAIN_CONF, RETAIN_DEFAULT = _changelog.RETAIN_CONF, _changelog.RETAIN_DEFAULT
#: ``state_persistence="stateless"``: the join in a stateless stage, its state in files only
#: (:mod:`.._common.stateless`).
STATELESS = _stateless.STATELESS
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
    (one group per raw key). ``left_keys[i]`` equals ``right_keys[i]``; ``out_keys`` are the indices of
    the key pairs with one name on both sides, output once (coalesced, as Spark's ``join(on=...)``); a
    pair with two names is output as an ordinary column of each side (in ``left_others`` /
    ``right_others``). Semi and anti joins output the left columns only, in the left input's order.
    """

    left: object = field(repr=False)
    right: object = field(repr=False)
    left_keys: list[str]
    right_keys: list[str]
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
    drop_ratio: tuple[float, float] = (0.0, 0.0)   # (left, right)
    seed: int = 0
    lower: int = 0
    upper: int = 0
    out_keys: list[int] = field(default_factory=list)
    kept_column: str | None = None
    bucket_width: int | None = None   # streaming inner interval join with bucket=: the bucket width (µs)
    persistence: str = "full"         # state_persistence=: "full", "changelog" or "files"
    persistence_auto: bool = False    # chosen by "auto" (None): fall back to "full" where "files" is refused
    snapshot_every: int = 10          # changelog / files: batches per snapshot (at most)
    state_dir: str | None = None      # files: the directory of the state files (absolute path or URI)
    retain: int = RETAIN_DEFAULT      # files: the session's spark.sql.streaming.minBatchesToRetain
    constraints: tuple = ()           # stream constraints (STREAM §5.2, pyspark_cq.constraints), checked
    output_mode: str = "append"       # output_mode=: the mode the applyInPandasWithState declares (the query's)
    shards_default: bool = False      # shards=None: the default count (a stateless stage takes the fixed rule)
    stateless: bool = False           # state_persistence="stateless": a stateless stage, the files layout's state
    watermark_delays: tuple = ()      # stateless: each input's withWatermark delay (ms)
    watermark_policy: str = "min"     # stateless: spark.sql.streaming.multipleWatermarkPolicy

    @property
    def keys(self) -> list[str]:
        """The output key columns (the key pairs with one name on both sides)."""
        return [self.left_keys[i] for i in self.out_keys]

    @classmethod
    def build(cls, left, right, on, left_time, right_time, how, suffixes, shards, grouping, name, window, *,
              control=None, drop_ratio=0.0, seed=0, function="interval_join", left_on=None,
              right_on=None, kept_column=None) -> JoinSpec:
        """Check the arguments (raising TypeError / ValueError naming the argument) and decide.

        ``function`` is the public function called (``"interval_join"`` or ``"window_join"``): it names
        the deprecation warning of ``grouping`` and the default report name ``"cq_<function>"``.
        """
        left_keys, right_keys = _check_inputs(left, right, on, left_time, right_time, left_on, right_on)
        if not isinstance(how, str) or how.lower() not in HOW:
            raise ValueError(f"how must be one of 'inner', 'left', 'right', 'full', 'left_semi', 'left_anti', "
                             f"got {how!r}")
        how = HOW[how.lower()]
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
        key_types = _key_types(left, right, left_keys, right_keys)
        if how in LEFT_ONLY:  # the left rows as they are: every left column, no right column
            out_keys, left_others, right_others = [], list(left.columns), []
        else:
            out_keys = [i for i, (lk, rk) in enumerate(zip(left_keys, right_keys)) if lk == rk]
            keys = [left_keys[i] for i in out_keys]
            left_others = [c for c in left.columns if c not in keys]
            right_others = [c for c in right.columns if c not in keys]
        left_out, right_out = output_names([left_keys[i] for i in out_keys], left_others, right_others, suffixes,
                                           extra=("valid_from", "valid_to") if window else ())
        taken = [left_keys[i] for i in out_keys] + left_out + right_out + (["valid_from", "valid_to"] if window else [])
        if kept_column is not None and (not isinstance(kept_column, str) or not kept_column or kept_column in taken):
            raise ValueError(f"kept_column must be a new column name (not one of the output's {taken}), "
                             f"got {kept_column!r}")
        layout, count = resolve_shards(shards, JOIN, df=left)
        if layout == "key":  # the count is unused (and not recorded); it stays what the default says
            count = resolve_shards(None, JOIN, df=left)[1]
        return cls(left, right, left_keys, right_keys, key_types, left_time, right_time, how, left_others,
                   right_others, left_out, right_out, left.isStreaming, count, layout, name, window,
                   control, drop_ratio, seed, out_keys=out_keys, kept_column=kept_column,
                   shards_default=shards is None)

    def set_output_mode(self, output_mode) -> None:
        """Decide ``output_mode`` (ValueError naming it): ``"append"``, or ``"update"`` where Spark 4.3 runs its
        own stream-stream join in update mode (inner and left semi joins; its UnsupportedOperationChecker
        refuses outer joins in any mode but append, and every join in complete mode).
        """
        if not isinstance(output_mode, str) or output_mode.lower() not in OUTPUT_MODES:
            raise ValueError(f"output_mode must be 'append' or 'update' (the mode the query is written with), "
                             f"got {output_mode!r}")
        output_mode = output_mode.lower()
        if output_mode == "update" and self.how not in UPDATE_HOWS:
            raise ValueError(f"output_mode='update' with how={self.how!r}: Spark 4.3 runs stream-stream joins in "
                             f"update mode for how='inner' and 'left_semi' only (an outer join in append mode "
                             f"only); write with outputMode('append')")
        self.output_mode = output_mode

    def set_bucket(self, bucket, control) -> None:
        """Decide the bucket layout of ``interval_join(..., bucket=...)`` (after ``lower`` / ``upper``).

        Refused (ValueError naming ``bucket``) where flags or bands would have to merge across buckets:
        outer, semi and anti joins, a control table, ``shards="key"``. Batch inputs ignore it (one pass,
        no state kept).
        """
        from .bucket import resolve_width

        width = resolve_width(bucket, self.lower, self.upper)
        if width is None:
            return
        if self.how != "inner":
            raise ValueError(f"bucket: the bucket layout supports how='inner' only (an unmatched or first-match "
                             f"flag would have to merge across buckets), got how={self.how!r}; drop bucket=")
        if control is not None:
            raise ValueError("bucket: the bucket layout does not take a control table (bounds that change would "
                             "change the buckets a row reaches); drop bucket= or control=")
        if self.layout != "shard":
            raise ValueError("bucket: the bucket layout shards each bucket by key hash; it does not combine "
                             "with shards='key' (give shards=None or an int)")
        if self.streaming:
            self.bucket_width = width

    def set_persistence(self, state_persistence, snapshot_every, state_dir=None) -> None:
        """Decide ``state_persistence`` / ``snapshot_every`` / ``state_dir`` (after :meth:`set_bucket`):
        ValueError / TypeError naming the argument. ``"changelog"`` and ``"files"`` do not combine with the
        bucket layout (its probe copies are appended to the payload and would have to be logged too), ``"files"``
        not with ``shards="key"`` (a directory per key): ``"auto"`` (None, the default) is ``"full"`` there;
        batch inputs keep no state and ignore all three.
        """
        if state_persistence == STATELESS:
            self._set_stateless(snapshot_every, state_dir)
            return
        if state_persistence is not None and state_persistence not in _changelog.CHOICES:
            raise ValueError(f"state_persistence must be one of {', '.join(map(repr, _changelog.CHOICES))}, "
                             f"{STATELESS!r} or None (the default, 'auto'), got {state_persistence!r}")
        _changelog.settings(state_persistence, snapshot_every, state_dir, streaming=False, session=None,
                            name="")   # the argument checks first
        persistence = "auto" if state_persistence is None else state_persistence
        self.persistence_auto = persistence == "auto"
        if persistence == "auto" and (self.bucket_width is not None or getattr(self, "layout", "shard") != "shard"):
            persistence = "full"
        if persistence != "full" and self.bucket_width is not None:
            raise ValueError(f"state_persistence={persistence!r} does not combine with bucket= (the bucket layout "
                             "moves only the buckets near a batch's rows already); drop one of them")
        if persistence == "files" and getattr(self, "layout", "shard") != "shard":
            raise ValueError("state_persistence='files' keeps a directory per shard; it does not combine with "
                             "shards='key'")
        if not self.streaming:
            return
        session = getattr(getattr(self, "left", None), "sparkSession", None)
        self.persistence, self.snapshot_every, self.state_dir, self.retain = _changelog.settings(
            persistence, snapshot_every, state_dir, streaming=True, session=session, name=getattr(self, "name", ""))

    def _set_stateless(self, snapshot_every, state_dir) -> None:
        """``state_persistence="stateless"`` (:mod:`.._common.stateless`): the files layout's state in a stateless
        stage. An inner join in the shard layout without ``bucket=``, each input with a watermark; ``shards=None`` is 8
        there (no stateful operator reads ``spark.sql.shuffle.partitions``). The state directory as for
        ``"auto"``, else ``state_dir=`` is required.
        """
        _changelog.settings("files", snapshot_every, state_dir, streaming=False, session=None, name="")
        if self.how != "inner" or self.bucket_width is not None or getattr(self, "layout", "shard") != "shard":
            raise ValueError(f"state_persistence='stateless' runs inner joins in the shard layout without bucket= "
                             f"(a stateless stage runs a shard only when rows arrive, so outer rows could wait "
                             f"forever); got how={self.how!r}")
        if not self.streaming:
            return
        if self.shards_default:
            self.shards = default_shard_count(MULTI_JOIN)
        # each streaming input has a watermark on its time column (checked when the spec was built)
        (self.persistence, self.snapshot_every, self.state_dir, self.retain, self.watermark_delays,
         self.watermark_policy) = stateless_settings(snapshot_every, state_dir, self.left.sparkSession, self.name,
                                                     ((self.left, self.left_time), (self.right, self.right_time)))
        self.stateless = True

    def set_constraints(self, constraints, function: str = "interval_join") -> None:
        """Check ``constraints=`` (after :meth:`set_persistence`; :func:`pyspark_cq.constraints.check_constraints`).
        Refused with ``state_persistence="changelog"`` or ``"files"`` under a control table: a delta does not
        record which constraints a batch had on, so a replay could drop other rows; ``clustered`` / ``ordered``
        need the full state (their positions travel in it) and the shard layout. Batch inputs check and ignore
        them.
        """
        from ...constraints import ARRIVAL_KINDS, check_constraints

        checked = check_constraints(constraints, {"left": self.left_keys, "right": self.right_keys},
                                    function, arrival=True)
        arrival = [c for c in checked if c.kind in ARRIVAL_KINDS]
        if getattr(self, "persistence_auto", False) and checked and (self.control is not None or arrival):
            self.persistence, self.state_dir = "full", None    # "auto": the layout that takes these constraints
        if checked and self.persistence != "full" and self.control is not None:
            raise ValueError(f"constraints: state_persistence={self.persistence!r} with a control table does not take "
                             "constraints yet (a replayed delta would not know which were on); drop one of them")
        if arrival and self.persistence != "full":
            raise ValueError(f"constraints: {arrival[0].kind}() keeps arrival positions with the state, which "
                             f"state_persistence={self.persistence!r} does not record yet; use 'full' (or leave "
                             "state_persistence to its default 'auto', which takes 'full' here)")
        if arrival and self.bucket_width is not None:
            raise ValueError(f"constraints: {arrival[0].kind}() counts arrivals per shard; the bucket layout "
                             "(bucket=) splits a shard by time: drop one of them")
        floats = [c for c, t in zip(self.left_keys, self.key_types) if isinstance(t, (T.FloatType, T.DoubleType))]
        if floats and any(c.kind == "ordered" for c in checked):
            raise ValueError(f"constraints: ordered() compares join keys, and {floats!r} are floating point (NaN has "
                             "no order); use integer, decimal, string, date or timestamp keys")
        if self.streaming:
            self.constraints = checked

    def output_schema(self) -> T.StructType:
        """The join's output schema (without report columns)."""
        fields = [T.StructField(self.left_keys[i], self.key_types[i], True) for i in self.out_keys]
        fields += [T.StructField(o, self.left.schema[c].dataType, True)
                   for c, o in zip(self.left_others, self.left_out)]
        fields += [T.StructField(o, self.right.schema[c].dataType, True)
                   for c, o in zip(self.right_others, self.right_out)]
        if self.window:
            fields += [T.StructField("valid_from", T.TimestampType(), True),
                       T.StructField("valid_to", T.TimestampType(), True)]
        if self.kept_column is not None:
            fields.append(T.StructField(self.kept_column, T.DoubleType(), True))
        return T.StructType(fields)


def _check_inputs(left, right, on, left_time, right_time, left_on=None, right_on=None) -> tuple[list, list]:
    """The key columns of each side; raises unless both inputs are DataFrames with the keys and
    TIMESTAMP times. Keys are ``on`` (one name on both sides) or ``left_on`` / ``right_on`` (pairwise).
    """
    _validate.dataframe(left, "left")
    _validate.dataframe(right, "right")
    if left_on is None and right_on is None:
        if on is None:
            raise TypeError("on is required: a key column name or a list of names present on both sides "
                            "(or left_on= and right_on= for keys named differently)")
        left_keys = _validate.column_list(left, on, "on", allow_empty=False)
        right_keys = _validate.column_list(right, left_keys, "on")
    else:
        if on is not None:
            raise ValueError("give either on or left_on / right_on, not both")
        if left_on is None or right_on is None:
            missing = "right_on" if right_on is None else "left_on"
            raise TypeError(f"{missing} is required with {'left_on' if missing == 'right_on' else 'right_on'}: "
                            f"the key columns of each side, paired in order")
        left_keys = _validate.column_list(left, left_on, "left_on", allow_empty=False)
        right_keys = _validate.column_list(right, right_on, "right_on", allow_empty=False)
        if len(left_keys) != len(right_keys):
            raise ValueError(f"left_on and right_on must name as many columns each, got {left_keys} and "
                             f"{right_keys}")
    for col, df, arg in ((left_time, left, "left_time"), (right_time, right, "right_time")):
        if col is None:
            raise TypeError(f"{arg} is required: the name of a TIMESTAMP column")
        dtype = _validate.time_column(df, col, arg)
        if not isinstance(dtype, T.TimestampType):
            raise TypeError(f"{arg} must be a TIMESTAMP column (with time zone semantics); column "
                            f"{col!r} has type {dtype.simpleString()}")
    return left_keys, right_keys


def _drop_ratios(drop_ratio) -> tuple[float, float]:
    """``drop_ratio`` (one float for both inputs or a (left, right) pair) as a checked (left, right) pair."""
    if isinstance(drop_ratio, (tuple, list)):
        if len(drop_ratio) != 2:
            raise ValueError(f"drop_ratio must be a real number in [0, 1) or a (left, right) pair of them, got "
                             f"{drop_ratio!r}")
        return (drop_ratio_value(drop_ratio[0], "drop_ratio[0] (left)"),
                drop_ratio_value(drop_ratio[1], "drop_ratio[1] (right)"))
    if isinstance(drop_ratio, (bool, np.bool_)) or not isinstance(drop_ratio, numbers.Real):
        raise TypeError(f"drop_ratio must be a real number in [0, 1) or a (left, right) pair of them, got "
                        f"{drop_ratio!r}")
    value = drop_ratio_value(drop_ratio, "drop_ratio")
    return value, value


def _check_control(control, name, drop_ratio, seed, default_name) -> tuple[str, tuple[float, float], int]:
    """The metrics name, (left, right) drop ratios and seed, checked (``control``: a bound ControlHandle
    or None).
    """
    drop_ratio = _drop_ratios(drop_ratio)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if name is None:
        name = control.operator if control is not None else default_name
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    return name, drop_ratio, int(seed)


def _key_types(left, right, left_keys, right_keys) -> list[T.DataType]:
    """The type each key pair is compared in: the common type, or long for two integral types."""
    key_types = []
    for lk, rk in zip(left_keys, right_keys):
        lt, rt = left.schema[lk].dataType, right.schema[rk].dataType
        k = repr(lk) if lk == rk else f"{lk!r} / {rk!r}"
        if lt == rt:
            key_types.append(lt)
        elif isinstance(lt, T.IntegralType) and isinstance(rt, T.IntegralType):
            key_types.append(T.LongType())
        else:
            raise TypeError(f"on: key column {k} has type {lt.simpleString()} on the left and "
                            f"{rt.simpleString()} on the right; cast one side first")
        if isinstance(key_types[-1], (T.ArrayType, T.MapType, T.StructType)):
            raise TypeError(f"on: key column {k} has the unsupported type {lt.simpleString()}")
    return key_types


def output_names(keys, left_others, right_others, suffixes, extra=()) -> tuple[list[str], list[str]]:
    """Output names of the non-key columns of each side (``suffixes`` appended to clashing names;
    :data:`DEFAULT_SUFFIXES` when None).
    """
    clash = sorted(set(left_others) & set(right_others))
    if suffixes is not None:
        if (not isinstance(suffixes, (tuple, list)) or len(suffixes) != 2
                or not all(isinstance(s, str) for s in suffixes) or suffixes[0] == suffixes[1]):
            raise ValueError(f"suffixes must be a pair of two different strings, got {suffixes!r}")
    ls, rs = suffixes if suffixes is not None else DEFAULT_SUFFIXES
    left_out = [c + ls if c in clash else c for c in left_others]
    right_out = [c + rs if c in clash else c for c in right_others]
    names = list(keys) + left_out + right_out + list(extra)
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"the output would have the column(s) {dup} twice; choose other suffixes or "
                         f"rename the input columns")
    return left_out, right_out
