"""The names of the metrics operators report per micro-batch, in one place.

Every operator observes its counters under its own name (``cq.read_metrics(query, name)``,
:mod:`pyspark_cq.operators._common.metrics`); the names below are the keys of that dict, in Spark's observed
metrics, in checkpoints and logs, and in users' code, so a value never changes. Writers (the workers) and
readers (the runtime's statistics, policies, plugins, console, demo) spell a name only through this module:
a constant per fixed name, a builder per indexed counter (per input, per probe step, per predicate) and
a parser back (``tests/test_metric_names.py`` fails on a metric name written as a literal elsewhere).

Indexed counters:

- per input ``i`` of a ``multi_join``: ``<name>_<i>`` (:func:`per_input`, :func:`parse_input`) for the
  names in :data:`PER_INPUT` and ``late_rows_<i>``;
- per probe step of a ``multi_join`` (rows arriving on input ``i`` probing input ``j``):
  ``probed_<i>_<j>`` / ``matched_<i>_<j>`` / ``probe_nanos_<i>_<j>``, and per pair i < j of its bounds
  graph ``banded_<i>_<j>`` (:func:`probed`, :func:`matched`, :func:`probe_nanos`, :func:`banded`,
  :func:`parse_step`, :func:`step_counters`);
- per predicate ``p`` of a ``select_chain``: ``rows_in_<p>`` / ``rows_passed_<p>`` / ``nanos_<p>``, and the
  same with the prefix ``sample_`` for its sampler plan (:func:`rows_in`, :func:`rows_passed`,
  :func:`nanos`, :func:`parse_predicate`, :func:`predicates`).

Adding a metric: a constant here with its ``#:`` line, in the tuple of each operator that reports it
(:data:`JOIN`, :data:`AGGREGATE` ...), then write and read it through the constant.

Examples
--------
>>> probed(0, 2), parse_step("probed_0_2")
('probed_0_2', StepCounter(kind='probed', i=0, j=2))
>>> per_input(INPUT_ROWS, 1), parse_input("input_rows_1")
('input_rows_1', InputCounter(name='input_rows', i=1))
>>> rows_in("cheap", sample=True), parse_predicate("sample_rows_in_cheap")
('sample_rows_in_cheap', PredicateCounter(kind='rows_in', predicate='cheap', sample=True))
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

__all__ = ["INPUT_ROWS", "OUTPUT_ROWS", "STATE_ROWS", "STATE_BYTES", "EVICTED_ROWS", "LATE_ROWS", "MALFORMED_ROWS",
           "SHED_ROWS", "STATEFUL", "SHED_ROWS_LEFT", "SHED_ROWS_RIGHT", "JOIN_SHED", "JOIN", "STATE_CACHE_HITS",
           "STATE_CACHE_MISSES", "STATE_CACHE_CATCH_UPS", "STATE_CACHE", "CONSTRAINT_VIOLATIONS", "JOIN_STREAMING",
           "AGGREGATE",
           "ROWS_WINDOW", "WINDOW", "DROPPED_EMPTY", "GRANULARITY", "CHUNK_STEPS", "PEAK_BUFFERED_ROWS",
           "PEAK_WORKER_RSS", "PEAKS", "CHUNKS", "PER_INPUT", "PROBED", "MATCHED", "PROBE_NANOS", "BANDED",
           "STEP_KINDS", "MULTI_JOIN", "UNMATCHED_ROWS", "PADDED_ROWS", "MULTI_JOIN_OUTER", "ROWS_IN", "ROWS_PASSED",
           "NANOS", "PREDICATE_KINDS", "SAMPLE", "PREDICATE_NAME",
           "SELECT_CHAIN", "ARRIVED_ROWS", "NAMES", "PREFIXES", "InputCounter", "StepCounter", "PredicateCounter",
           "is_state_size", "is_peak", "per_input", "parse_input", "input_counters", "step", "probed", "matched",
           "probe_nanos", "banded", "parse_step", "step_counters", "band_names", "multi_join_names", "predicate",
           "rows_in", "rows_passed", "nanos", "parse_predicate", "predicates", "select_chain_names"]

# -- every stateful operator (sums over the shards of a micro-batch) --------------------------------------
INPUT_ROWS = "input_rows"          #: rows the operator's function received (well-formed or not)
OUTPUT_ROWS = "output_rows"        #: rows it emitted
STATE_ROWS = "state_rows"          #: rows in its state at the end of the batch
STATE_BYTES = "state_bytes"        #: bytes of its serialized state at the end of the batch
EVICTED_ROWS = "evicted_rows"      #: state rows removed (watermark passed, window pushed out)
LATE_ROWS = "late_rows"            #: rows behind the watermark, dropped (including those Spark dropped first)
MALFORMED_ROWS = "malformed_rows"  #: rows without a usable time (null), skipped
SHED_ROWS = "shed_rows"            #: rows dropped by load shedding (``drop_ratio``)

#: The counters every stateful operator reports (``_metrics.METRICS``), in their column order.
STATEFUL = (INPUT_ROWS, OUTPUT_ROWS, STATE_ROWS, STATE_BYTES, EVICTED_ROWS, LATE_ROWS, MALFORMED_ROWS)

# -- join -------------------------------------------------------------------------------------------------
SHED_ROWS_LEFT = "shed_rows_left"    #: ``shed_rows`` of the left input
SHED_ROWS_RIGHT = "shed_rows_right"  #: ``shed_rows`` of the right input
#: The join's own counters, after the shared ones.
JOIN_SHED = (SHED_ROWS, SHED_ROWS_LEFT, SHED_ROWS_RIGHT)
JOIN = STATEFUL + JOIN_SHED
# The resident state cache (``state_persistence="changelog"``, operators/_common/resident.py): per batch, the
# groups whose state the Python worker still held at the version in Spark's state (hit), held at an earlier
# version of the same files-layout line and brought up to date with the delta files it missed (catch-up), or had
# to rebuild from it (miss); a group without state is none of them.
STATE_CACHE_HITS = "state_cache_hits"      #: groups whose state was used from the worker's resident copy
STATE_CACHE_MISSES = "state_cache_misses"  #: groups whose state was rebuilt from Spark's state value
STATE_CACHE_CATCH_UPS = "state_cache_catch_ups"   #: groups whose resident copy replayed the deltas it missed
STATE_CACHE = (STATE_CACHE_HITS, STATE_CACHE_MISSES, STATE_CACHE_CATCH_UPS)
#: Rows that broke a declared stream constraint as far as the state shows it (STREAM §5.2; docs/constraints.md):
#: a row whose key a ``unique`` input (or a many-to-one parent) already holds. Such rows may miss matches.
CONSTRAINT_VIOLATIONS = "constraint_violations"
#: The streaming join's counters (:data:`JOIN`, the resident cache's, then the constraint violations).
JOIN_STREAMING = JOIN + STATE_CACHE + (CONSTRAINT_VIOLATIONS,)

# -- aggregate, rows windows, windows, granularity ----------------------------------------------------------
AGGREGATE = STATEFUL + (SHED_ROWS,)
ROWS_WINDOW = STATEFUL              #: ``rows_window`` and ``rows_aggregate``
WINDOW = (MALFORMED_ROWS,)          #: the time-window assignment (null times)
DROPPED_EMPTY = "dropped_empty"     #: Γ: intervals that became empty when rounded, dropped
GRANULARITY = (DROPPED_EMPTY, MALFORMED_ROWS)

# -- the chunk scheduler (multi_join, select_chain) ---------------------------------------------------------
CHUNK_STEPS = "chunk_steps"                #: scheduling steps the chunk scheduler ran
PEAK_BUFFERED_ROWS = "peak_buffered_rows"  #: most rows buffered between steps (maximum over the tasks)
PEAK_WORKER_RSS = "peak_worker_rss"        #: the Python worker's peak resident memory, bytes (maximum)
#: Maxima over the tasks or shards (every other counter is a sum).
PEAKS = (PEAK_BUFFERED_ROWS, PEAK_WORKER_RSS)
CHUNKS = (CHUNK_STEPS,) + PEAKS

# -- multi_join: per input and per probe step ---------------------------------------------------------------
#: The counters a ``multi_join`` reports per input ``i`` as ``<name>_<i>`` (and ``read_metrics`` ``late_rows_<i>``).
PER_INPUT = (INPUT_ROWS, STATE_ROWS, MALFORMED_ROWS, SHED_ROWS)
PROBED = "probed"            #: ``probed_<i>_<j>``: partial matches of rows arriving on i entering the step probing j
MATCHED = "matched"          #: ``matched_<i>_<j>``: partial matches that left it
PROBE_NANOS = "probe_nanos"  #: ``probe_nanos_<i>_<j>``: its time (measured only when the steps run in chunks)
BANDED = "banded"            #: ``banded_<i>_<j>``, i < j: 1 when the query bounds inputs i and j in time (maximum)
#: The counters of a probe step, in their column order.
STEP_KINDS = (PROBED, MATCHED, PROBE_NANOS)
#: The fixed counters of a ``multi_join`` (:func:`multi_join_names`: with the indexed ones).
MULTI_JOIN = STATEFUL + (SHED_ROWS,) + CHUNKS
UNMATCHED_ROWS = "unmatched_rows"  #: a ``multi_join`` with a left input: prefix tuples waiting for its match (state)
PADDED_ROWS = "padded_rows"        #: ... and the rows it output null-padded in the batch (in ``output_rows``)
#: The counters a ``multi_join`` with a left input adds, last.
MULTI_JOIN_OUTER = (UNMATCHED_ROWS, PADDED_ROWS)

# -- select_chain: per predicate ----------------------------------------------------------------------------
ROWS_IN = "rows_in"          #: ``rows_in_<p>``: rows predicate p evaluated
ROWS_PASSED = "rows_passed"  #: ``rows_passed_<p>``: rows that passed it
NANOS = "nanos"              #: ``nanos_<p>``: its time, ns
#: The counters of a predicate, in their column order.
PREDICATE_KINDS = (ROWS_IN, ROWS_PASSED, NANOS)
#: Prefix of the counters of ``select_chain``'s sampler plan (``sample_rows_in_<p>`` ...), RTStream §4.2.
SAMPLE = "sample_"
#: A predicate's name: letters, digits and ``_``, not starting with a digit (it names its metrics).
PREDICATE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: The fixed counters of a ``select_chain`` (:func:`select_chain_names`: with the per-predicate ones).
SELECT_CHAIN = (INPUT_ROWS, OUTPUT_ROWS, SHED_ROWS) + CHUNKS

# -- the arrival observation (``<name>__input``, ``_metrics.observe_input``) --------------------------------
#: Rows that reached a stateful operator (``rows_<i>`` per input); ``_metrics.read`` makes late rows of them.
ARRIVED_ROWS = "rows"

#: Every fixed metric name an operator reports (not :data:`ARRIVED_ROWS`, an internal observation's).
NAMES = tuple(dict.fromkeys(STATEFUL + JOIN_STREAMING + AGGREGATE + GRANULARITY + MULTI_JOIN + MULTI_JOIN_OUTER
                            + SELECT_CHAIN))
#: The prefixes of the indexed counters (``probed_``, ``input_rows_``, ``sample_rows_in_`` ...).
PREFIXES = tuple(k + "_" for k in PER_INPUT + (LATE_ROWS,) + STEP_KINDS + (BANDED,) + PREDICATE_KINDS) + tuple(
    SAMPLE + k + "_" for k in PREDICATE_KINDS)


class InputCounter(NamedTuple):
    """A per-input counter ``<name>_<i>``."""

    name: str
    i: int


class StepCounter(NamedTuple):
    """A per-step counter ``<kind>_<i>_<j>`` (``kind`` one of :data:`STEP_KINDS` or :data:`BANDED`)."""

    kind: str
    i: int
    j: int


class PredicateCounter(NamedTuple):
    """A per-predicate counter ``[sample_]<kind>_<predicate>`` (``kind`` one of :data:`PREDICATE_KINDS`)."""

    kind: str
    predicate: str
    sample: bool = False


_INPUT = re.compile(rf"^({'|'.join(PER_INPUT + (LATE_ROWS, ARRIVED_ROWS))})_(\d+)$")
_STEP = re.compile(rf"^({'|'.join(STEP_KINDS + (BANDED,))})_(\d+)_(\d+)$")
_PREDICATE = re.compile(rf"^({SAMPLE})?({'|'.join(PREDICATE_KINDS)})_({PREDICATE_NAME.pattern[1:-1]})$")


def is_state_size(name: str) -> bool:
    """Whether ``name`` is a state size at the end of a batch (``state_rows``, ``state_bytes``,
    ``state_rows_<i>``), which does not add up over batches as the counters do.
    """
    return name.startswith("state_")


def is_peak(name: str) -> bool:
    """Whether ``name`` is a per-batch maximum over the tasks (:data:`PEAKS`, ``banded_<i>_<j>``), whose
    value over several batches is the largest, not the sum.
    """
    step = parse_step(name)
    return name in PEAKS or (step is not None and step.kind == BANDED)


# -- per input


def per_input(name: str, i: int) -> str:
    """The counter ``name`` of input ``i``: ``<name>_<i>`` (``name`` in :data:`PER_INPUT`, ``late_rows``, or
    :data:`ARRIVED_ROWS`).
    """
    return f"{name}_{i}"


def parse_input(key: str) -> InputCounter | None:
    """``"input_rows_1"`` -> ``InputCounter("input_rows", 1)``; None for another name."""
    m = _INPUT.match(key)
    return InputCounter(m.group(1), int(m.group(2))) if m else None


def input_counters(report: Mapping, name: str | None = None) -> Iterator[tuple[InputCounter, object]]:
    """The per-input counters of ``report`` (those of ``name`` only, when given) with their values, in its order."""
    for key, value in report.items():
        c = parse_input(key)
        if c is not None and (name is None or c.name == name):
            yield c, value


# -- per probe step (multi_join)


def step(kind: str, i: int, j: int) -> str:
    """The counter ``kind`` (one of :data:`STEP_KINDS`) of the step of rows arriving on ``i`` probing ``j``."""
    return f"{kind}_{i}_{j}"


def probed(i: int, j: int) -> str:
    """``probed_<i>_<j>``: partial matches of rows arriving on input i that entered the step probing input j."""
    return f"{PROBED}_{i}_{j}"


def matched(i: int, j: int) -> str:
    """``matched_<i>_<j>``: the partial matches that left that step."""
    return f"{MATCHED}_{i}_{j}"


def probe_nanos(i: int, j: int) -> str:
    """``probe_nanos_<i>_<j>``: that step's time, ns (only when the steps run in chunks)."""
    return f"{PROBE_NANOS}_{i}_{j}"


def banded(i: int, j: int) -> str:
    """The bounds-graph flag of inputs i and j (either order): ``banded_<min>_<max>``."""
    return f"{BANDED}_{min(i, j)}_{max(i, j)}"


def parse_step(key: str) -> StepCounter | None:
    """``"probed_0_2"`` -> ``StepCounter("probed", 0, 2)`` (also ``matched``, ``probe_nanos``, ``banded``);
    None for another name.
    """
    m = _STEP.match(key)
    return StepCounter(m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def step_counters(report: Mapping, kind: str | None = None) -> Iterator[tuple[StepCounter, object]]:
    """The per-step counters of ``report`` (those of ``kind`` only, when given) with their values, in its order."""
    for key, value in report.items():
        c = parse_step(key)
        if c is not None and (kind is None or c.kind == kind):
            yield c, value


def band_names(n: int) -> tuple[str, ...]:
    """The bounds-graph flags of an ``n``-input join, ``banded_<i>_<j>`` for i < j."""
    return tuple(banded(i, j) for i in range(n) for j in range(i + 1, n))


def multi_join_names(n: int, outer: bool = False, constraints: bool = False,
                     resident: bool = False) -> tuple[str, ...]:
    """Every counter of an ``n``-input ``multi_join``, in its column order: :data:`STATEFUL` and ``shed_rows``,
    :data:`PER_INPUT` per input, :data:`STEP_KINDS` per ordered pair, :data:`CHUNKS`, :func:`band_names`, with
    a left input (``outer``) :data:`MULTI_JOIN_OUTER`, with declared ``constraints``
    :data:`CONSTRAINT_VIOLATIONS`, and with a ``resident`` state (``state_persistence="changelog"`` /
    ``"files"``) :data:`STATE_CACHE` (each absent otherwise: a query's columns stay as they were).
    """
    per = tuple(per_input(m, i) for i in range(n) for m in PER_INPUT)
    steps = tuple(step(k, i, j) for i in range(n) for j in range(n) if i != j for k in STEP_KINDS)
    return (STATEFUL + (SHED_ROWS,) + per + steps + CHUNKS + band_names(n) + (MULTI_JOIN_OUTER if outer else ())
            + ((CONSTRAINT_VIOLATIONS,) if constraints else ()) + (STATE_CACHE if resident else ()))


# -- per predicate (select_chain)


def predicate(kind: str, name: str, sample: bool = False) -> str:
    """The counter ``kind`` (one of :data:`PREDICATE_KINDS`) of predicate ``name`` (of the sampler plan when
    ``sample``).
    """
    return f"{SAMPLE if sample else ''}{kind}_{name}"


def rows_in(name: str, sample: bool = False) -> str:
    """``rows_in_<p>`` (``sample_rows_in_<p>``): rows predicate ``name`` evaluated."""
    return predicate(ROWS_IN, name, sample)


def rows_passed(name: str, sample: bool = False) -> str:
    """``rows_passed_<p>`` (``sample_rows_passed_<p>``): rows that passed it."""
    return predicate(ROWS_PASSED, name, sample)


def nanos(name: str, sample: bool = False) -> str:
    """``nanos_<p>`` (``sample_nanos_<p>``): its time, ns."""
    return predicate(NANOS, name, sample)


def parse_predicate(key: str) -> PredicateCounter | None:
    """``"rows_in_cheap"`` -> ``PredicateCounter("rows_in", "cheap")`` (``sample=True`` with the ``sample_``
    prefix); None for another name.
    """
    m = _PREDICATE.match(key)
    return PredicateCounter(m.group(2), m.group(3), m.group(1) is not None) if m else None


def predicates(report: Mapping, sample: bool = False) -> list[str]:
    """The predicates ``report`` has a ``rows_in_<p>`` (``sample_rows_in_<p>``) counter of, in its order."""
    out = []
    for key in report:
        c = parse_predicate(key)
        if c is not None and c.kind == ROWS_IN and c.sample == sample:
            out.append(c.predicate)
    return out


def select_chain_names(names: Sequence[str]) -> tuple[str, ...]:
    """Every counter of a ``select_chain`` of predicates ``names``, in its column order: :data:`PREDICATE_KINDS`
    per predicate, :data:`SELECT_CHAIN`, and the sampler plan's per predicate.
    """
    return (tuple(predicate(k, n) for n in names for k in PREDICATE_KINDS) + SELECT_CHAIN
            + tuple(predicate(k, n, True) for n in names for k in PREDICATE_KINDS))
