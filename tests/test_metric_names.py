"""Metric names live in one place: :mod:`pyspark_cq.vocabulary.metrics`.

The source of ``pyspark_cq`` and ``pyspark_cq_plugins`` must not spell a metric name (``"input_rows"``) or the
prefix of an indexed counter (``"probed_"``, as in ``f"probed_{i}_{j}"``) as a string literal anywhere but
there: writers and readers use its constants, builders and parsers, so a name cannot drift between the
worker that writes it and the policy that reads it. Also the builders' and parsers' round trips.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pyspark_cq_plugins
import pytest

import pyspark_cq
from pyspark_cq.vocabulary import metrics as M

ROOTS = (Path(pyspark_cq.__file__).parent, Path(pyspark_cq_plugins.__file__).parent)
HOME = Path(M.__file__).resolve()

_STEP_PREFIXES = tuple(k + "_" for k in M.STEP_KINDS + (M.BANDED,) + M.PER_INPUT + (M.LATE_ROWS,))
_INDEX = re.compile(r"^(\d+(_\d+)?)?$")   # what may follow a per-input / per-step prefix in a literal


def _is_metric_literal(text: str) -> bool:
    """Whether ``text`` spells a metric name, or starts an indexed counter's name (``"probed_"``,
    ``"probed_0_1"``, ``"rows_in_cheap"``; not ``"matched_predictions"``).
    """
    if text in M.NAMES:
        return True
    for prefix in M.PREFIXES:
        if text.startswith(prefix):
            rest = text[len(prefix):]
            if prefix not in _STEP_PREFIXES or _INDEX.match(rest):
                return True
    return False


def _exported(tree: ast.AST) -> set[int]:
    """The string constants of ``__all__``: Python names (``plan_stats.input_rows``), not metric names."""
    return {id(c) for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
            and any(isinstance(t, ast.Name) and t.id == "__all__"
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
            for c in ast.walk(node.value)}


def offenders(files) -> list[str]:
    """``path:line: 'literal'`` for every string constant (f-string pieces included) of ``files`` that
    :func:`_is_metric_literal`, but those of ``__all__``.
    """
    out = []
    for path in files:
        tree = ast.parse(Path(path).read_text(), str(path))
        exported = _exported(tree)
        for node in ast.walk(tree):   # visits the constant pieces of every f-string too
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in exported
                    and _is_metric_literal(node.value)):
                out.append(f"{path}:{node.lineno}: {node.value!r}")
    return out


def _sources() -> list[Path]:
    return [p for root in ROOTS for p in sorted(root.rglob("*.py")) if p.resolve() != HOME]


def test_no_metric_name_literal_outside_the_vocabulary():
    files = _sources()
    assert len(files) > 50   # the scan sees the packages
    bad = offenders(files)
    assert not bad, ("metric names spelled as literals; use pyspark_cq.vocabulary.metrics instead:\n  "
                     + "\n  ".join(bad))


def test_the_scan_finds_literals(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('__all__ = ["f", "input_rows"]\n\n\n'
                     'def f(report, i, j, p):\n'
                     '    a = report["late_rows"]\n'
                     '    b = report[f"probed_{i}_{j}"]\n'
                     '    c = [k for k in report if k.startswith("matched_")]\n'
                     '    d = report.get(f"sample_rows_in_{p}")\n'
                     '    e = "input_rows_" + str(i)\n'
                     '    return a, b, c, d, e, "matched_predictions", "rows", "sample_ratio", "state_rows[0]"\n')
    found = sorted(line.split(": ", 1)[1] for line in offenders([probe]))
    assert found == sorted(["'late_rows'", "'probed_'", "'matched_'", "'sample_rows_in_'", "'input_rows_'"])
    assert len(offenders([HOME])) >= len(M.NAMES)   # the vocabulary itself is full of them


def test_names_are_unique_and_stable():
    assert len(set(M.NAMES)) == len(M.NAMES)
    # the values are in Spark's observed metrics, checkpoints, logs and users' code: they never change
    assert M.STATEFUL == ("input_rows", "output_rows", "state_rows", "state_bytes", "evicted_rows", "late_rows",
                          "malformed_rows")
    assert M.JOIN[len(M.STATEFUL):] == ("shed_rows", "shed_rows_left", "shed_rows_right")
    assert M.AGGREGATE[len(M.STATEFUL):] == ("shed_rows",)
    assert M.GRANULARITY == ("dropped_empty", "malformed_rows")
    assert M.SELECT_CHAIN == ("input_rows", "output_rows", "shed_rows", "chunk_steps", "peak_buffered_rows",
                              "peak_worker_rss")


def test_multi_join_names():
    names = M.multi_join_names(3)
    assert names[:8] == M.STATEFUL + ("shed_rows",)
    assert names[8:12] == ("input_rows_0", "state_rows_0", "malformed_rows_0", "shed_rows_0")
    assert names[20:23] == ("probed_0_1", "matched_0_1", "probe_nanos_0_1")
    assert names[-6:] == ("chunk_steps", "peak_buffered_rows", "peak_worker_rss", "banded_0_1", "banded_0_2",
                          "banded_1_2")
    assert len(names) == 8 + 3 * 4 + 6 * 3 + 3 + 3 and len(set(names)) == len(names)


def test_select_chain_names():
    names = M.select_chain_names(["a", "b"])
    assert names == ("rows_in_a", "rows_passed_a", "nanos_a", "rows_in_b", "rows_passed_b", "nanos_b") \
        + M.SELECT_CHAIN + ("sample_rows_in_a", "sample_rows_passed_a", "sample_nanos_a", "sample_rows_in_b",
                            "sample_rows_passed_b", "sample_nanos_b")


@pytest.mark.parametrize("kind, build", [(M.PROBED, M.probed), (M.MATCHED, M.matched),
                                         (M.PROBE_NANOS, M.probe_nanos)])
def test_step_round_trip(kind, build):
    for i, j in [(0, 1), (2, 0), (5, 11)]:
        key = build(i, j)
        assert key == M.step(kind, i, j) == f"{kind}_{i}_{j}"
        assert M.parse_step(key) == M.StepCounter(kind, i, j)


def test_banded_is_unordered():
    assert M.banded(2, 0) == M.banded(0, 2) == "banded_0_2"
    assert M.parse_step("banded_0_2") == M.StepCounter(M.BANDED, 0, 2)
    assert M.band_names(3) == ("banded_0_1", "banded_0_2", "banded_1_2")


@pytest.mark.parametrize("key", ["probed_0", "probed_a_1", "xprobed_0_1", "probed_0_1_2", "matched_predictions",
                                 "input_rows", "rows_in_a", ""])
def test_parse_step_rejects(key):
    assert M.parse_step(key) is None


def test_input_round_trip():
    for name in M.PER_INPUT + (M.LATE_ROWS, M.ARRIVED_ROWS):
        for i in (0, 3, 12):
            assert M.parse_input(M.per_input(name, i)) == M.InputCounter(name, i)
    for key in ("input_rows", "input_rows_x", "shed_rows_left", "output_rows_0", "probed_0_1"):
        assert M.parse_input(key) is None


def test_predicate_round_trip():
    for build, kind in ((M.rows_in, M.ROWS_IN), (M.rows_passed, M.ROWS_PASSED), (M.nanos, M.NANOS)):
        for name in ("a", "cheap_regex", "_x1"):
            for sample in (False, True):
                key = build(name, sample=sample)
                assert key == M.predicate(kind, name, sample)
                assert M.parse_predicate(key) == M.PredicateCounter(kind, name, sample)
    assert M.rows_in("a", sample=True) == M.SAMPLE + M.rows_in("a") == "sample_rows_in_a"
    for key in ("rows_in_", "rows_in_1a", "probe_nanos_0_1", "rows_in_a-b", "sample_ratio", "input_rows"):
        assert M.parse_predicate(key) is None


def test_report_helpers():
    report = {"input_rows": 10, "input_rows_0": 4, "input_rows_1": 6, "state_rows_1": 2, "probed_0_1": 4,
              "matched_0_1": 3, "probed_1_0": 6, "banded_0_1": 1, "rows_in_b": 5, "rows_in_a": 5,
              "sample_rows_in_c": 1}
    assert list(M.step_counters(report)) == [(M.StepCounter("probed", 0, 1), 4), (M.StepCounter("matched", 0, 1), 3),
                                             (M.StepCounter("probed", 1, 0), 6), (M.StepCounter("banded", 0, 1), 1)]
    assert [c for c, _ in M.step_counters(report, M.PROBED)] == [(M.PROBED, 0, 1), (M.PROBED, 1, 0)]
    assert list(M.input_counters(report, M.INPUT_ROWS)) == [(M.InputCounter("input_rows", 0), 4),
                                                            (M.InputCounter("input_rows", 1), 6)]
    assert len(list(M.input_counters(report))) == 3
    assert M.predicates(report) == ["b", "a"] and M.predicates(report, sample=True) == ["c"]


def test_state_sizes():
    assert all(M.is_state_size(k) for k in (M.STATE_ROWS, M.STATE_BYTES, M.per_input(M.STATE_ROWS, 2)))
    assert not any(M.is_state_size(k) for k in (M.INPUT_ROWS, M.EVICTED_ROWS, M.PEAK_WORKER_RSS))
