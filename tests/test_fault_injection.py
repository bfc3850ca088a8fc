"""Crash recovery, quick variant of benchmarks/experiments/fault_injection.py (issue 23, docs/reliability.md): the
interval join under its three kinds of state persistence and a QueryGroup, each on its own inputs (6 files, one per
batch), checkpoint and sink, run at once in one child process (the script's ``--together``), which is SIGKILLed at a
random moment and restarted on the checkpoints; each sink then holds exactly the rows of an uninterrupted run (none
lost, none duplicated) from empty checkpoints, made in the restarted child beside the restarted queries. One child
for all queries costs 2 Spark JVM starts (killed; restarted with the references) instead of 10, one per operator and
run: the JVM starts were most of the file's time (issue 41). The full run (>= 20 kills per operator, every operator,
each in its own child, the reference in a child of its own) is the script's (docs/reliability.md); one kill here
checks the same recovery path each time the suite runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_cq.experiments.recovery import compare

ROOT = Path(__file__).resolve().parents[1]   # the script runs as a module from here, never imported by a test


#: The operators killed together: the interval join under its three kinds of state persistence (their uninterrupted
#: run, the same inputs and rows, is made once) and a query group.
OPERATORS = ("interval_join", "interval_join_changelog", "interval_join_files", "query_group")


@pytest.fixture(scope="module")
def killed_together(tmp_path_factory):
    """The script's results for ``OPERATORS`` run together (seed 5, one kill over 6 files) by operator, and its exit
    code."""
    results, code = _run_script(tmp_path_factory.mktemp("together"), "--operator", ",".join(OPERATORS),
                                "--together", "--kills", "1", "--files", "6", "--seed", "5")
    return {r["operator"]: r for r in results}, code


@pytest.mark.spark
@pytest.mark.slow
def test_a_kill_loses_and_duplicates_nothing(killed_together):
    _loses_nothing(*killed_together, "interval_join")


def test_comparison_counts_lost_and_duplicated_rows():
    """The oracle side of the script: multiset differences, not set differences."""
    want = [[1, "a"], [1, "a"], [2, "b"]]
    assert compare(want, [[1, "a"], [2, "b"], [2, "b"], [3, "c"]]) == {
        "expected_rows": 3, "rows": 4, "lost": 1, "duplicated": 1, "unexpected": 1}
    assert compare(want, list(reversed(want)))["lost"] == 0


def _run_script(tmp_path, *extra) -> tuple[list[dict], int]:
    """The fault-injection script in a child process (as the tests here run it): (its results, exit code)."""
    out = tmp_path / "result.json"
    (tmp_path / "path").mkdir()
    (tmp_path / "path" / "benchmarks").symlink_to(ROOT / "benchmarks", target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path / "path"),
                                                                    os.environ.get("PYTHONPATH")])))
    code = subprocess.run([sys.executable, "-m", "benchmarks.experiments.fault_injection", *extra, "--workdir",
                           str(tmp_path / "work"), "--out", str(out), "--no-json"], cwd=tmp_path / "path",
                          env=env).returncode
    return json.loads(out.read_text()), code


def _loses_nothing(results: dict, code: int, operator: str) -> None:
    """``operator``'s run of the script, SIGKILLed once: the sink holds exactly the uninterrupted run's rows (the exit
    code says so for every operator of the run)."""
    result = results[operator]
    assert "error" not in result, result
    assert result["kills"] == 1 and result["expected_rows"] > 0
    assert (result["lost"], result["duplicated"], result["unexpected"]) == (0, 0, 0), result
    assert result["rows"] == result["expected_rows"] and code == 0


@pytest.mark.spark
@pytest.mark.slow
def test_changelog_join_killed_loses_and_duplicates_nothing(killed_together):
    """The same with ``state_persistence="changelog"`` (issue 39): the restarted child's workers hold no
    resident state, so every shard restores from its snapshot and deltas. Its reference is the uninterrupted
    run of the resident join (the same rows)."""
    _loses_nothing(*killed_together, "interval_join_changelog")


@pytest.mark.spark
@pytest.mark.slow
def test_files_join_killed_loses_and_duplicates_nothing(killed_together):
    """The same with ``state_persistence="files"`` (issue 39): the restarted child rebuilds every shard from
    the snapshot and delta files its checkpoint's manifests name; files of batches a kill interrupted are
    orphans."""
    _loses_nothing(*killed_together, "interval_join_files")


@pytest.mark.spark
@pytest.mark.slow
def test_query_group_killed_loses_and_duplicates_nothing(killed_together):
    """A QueryGroup (issue 40: shared aggregations, one with HAVING, one ISTREAM, and a query running alone)
    SIGKILLed and restarted on its checkpoint: every query's sink holds exactly the uninterrupted run's rows (its
    directory sinks are rewritten by batch id when a batch runs again)."""
    _loses_nothing(*killed_together, "query_group")
