"""Crash recovery, quick variant of benchmarks/experiments/fault_injection.py (issue 23, docs/reliability.md): the
interval join in a child process (6 files, one per batch) is SIGKILLed at a random moment and
restarted on its checkpoint; the file sink then holds exactly the rows of an uninterrupted run (none
lost, none duplicated). The full run (>= 20 kills per operator, every operator) is the script's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_cq.experiments.recovery import compare

ROOT = Path(__file__).resolve().parents[1]   # the script runs as a module from here, never imported by a test


@pytest.mark.spark
@pytest.mark.slow
def test_a_kill_loses_and_duplicates_nothing(tmp_path):
    _killed_once_loses_nothing(tmp_path, "interval_join", seed=5)


def test_comparison_counts_lost_and_duplicated_rows():
    """The oracle side of the script: multiset differences, not set differences."""
    want = [[1, "a"], [1, "a"], [2, "b"]]
    assert compare(want, [[1, "a"], [2, "b"], [2, "b"], [3, "c"]]) == {
        "expected_rows": 3, "rows": 4, "lost": 1, "duplicated": 1, "unexpected": 1}
    assert compare(want, list(reversed(want)))["lost"] == 0


def _run_script(tmp_path, *extra) -> tuple[dict, int]:
    """The fault-injection script in a child process (as the test above runs it): (its result, exit code)."""
    out = tmp_path / "result.json"
    (tmp_path / "path").mkdir()
    (tmp_path / "path" / "benchmarks").symlink_to(ROOT / "benchmarks", target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path / "path"),
                                                                    os.environ.get("PYTHONPATH")])))
    code = subprocess.run([sys.executable, "-m", "benchmarks.experiments.fault_injection", *extra, "--workdir",
                           str(tmp_path / "work"), "--out", str(out), "--no-json"], cwd=tmp_path / "path",
                          env=env).returncode
    (result,) = json.loads(out.read_text())
    return result, code


def _killed_once_loses_nothing(tmp_path, operator: str, seed: int) -> None:
    """The script on ``operator`` over 6 files, SIGKILLed once: the sink holds exactly the uninterrupted run's rows."""
    result, code = _run_script(tmp_path, "--operator", operator, "--kills", "1", "--files", "6", "--seed", str(seed))
    assert "error" not in result, result
    assert result["kills"] == 1 and result["expected_rows"] > 0
    assert (result["lost"], result["duplicated"], result["unexpected"]) == (0, 0, 0), result
    assert result["rows"] == result["expected_rows"] and code == 0


@pytest.mark.spark
@pytest.mark.slow
def test_changelog_join_killed_loses_and_duplicates_nothing(tmp_path):
    """The same with ``state_persistence="changelog"`` (issue 39): the restarted child's workers hold no
    resident state, so every shard restores from its snapshot and deltas."""
    _killed_once_loses_nothing(tmp_path, "interval_join_changelog", seed=5)


@pytest.mark.spark
@pytest.mark.slow
def test_files_join_killed_loses_and_duplicates_nothing(tmp_path):
    """The same with ``state_persistence="files"`` (issue 39): the restarted child rebuilds every shard from
    the snapshot and delta files its checkpoint's manifests name; files of batches a kill interrupted are
    orphans."""
    _killed_once_loses_nothing(tmp_path, "interval_join_files", seed=5)


@pytest.mark.spark
@pytest.mark.slow
def test_query_group_killed_loses_and_duplicates_nothing(tmp_path):
    """A QueryGroup (issue 40: shared aggregations, one with HAVING, one ISTREAM, and a query running alone)
    SIGKILLed and restarted on its checkpoint: every query's sink holds exactly the uninterrupted run's rows (its
    directory sinks are rewritten by batch id when a batch runs again)."""
    _killed_once_loses_nothing(tmp_path, "query_group", seed=4)
