"""The docstring examples of every module of the installed package (and of the shipped plugins) run.

One test case per module: ``doctest.DocTestFinder`` collects the module's examples and a
``DocTestRunner`` (ELLIPSIS, NORMALIZE_WHITESPACE) runs them; a failure fails the case with the runner's
report. Modules without examples are skipped (one shared reason, so ``-ra`` lists them on one line);
modules that need an uninstalled third-party package are skipped with its name; ``pyspark_cq.demo`` is
left out (it drives a whole streaming demo). Examples under ``pyspark_cq.operators`` get the shared
SparkSession as the global ``spark`` and are marked ``spark``; all other modules run without Spark (the
session is only started for an operators module that has examples).
"""
from __future__ import annotations

import doctest
import importlib
import importlib.util
import io
import pkgutil

import pytest

PACKAGES = ("pyspark_cq", "pyspark_cq_plugins")
#: Left out entirely: importing or running these is a program, not an example.
EXCLUDED = ("pyspark_cq.demo",)
#: Modules whose examples use the ``spark`` global (the session fixture of conftest.py).
SPARK_PACKAGES = ("pyspark_cq.operators",)
OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
NO_EXAMPLES = "no docstring examples"


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def module_names() -> list[str]:
    """Every module of the installed packages (a package whose import fails is still listed: its test
    then reports the error, or skips for a missing third-party dependency)."""
    names: set[str] = set()
    for package_name in PACKAGES:
        try:
            package = importlib.import_module(package_name)
        except ImportError:
            names.add(package_name)
            continue
        names.add(package_name)
        for info in pkgutil.walk_packages(package.__path__, package_name + ".", onerror=names.add):
            names.add(info.name)
    return sorted(n for n in names if not _within(n, EXCLUDED))


def _case(name: str):
    marks = [pytest.mark.spark] if _within(name, SPARK_PACKAGES) else []
    return pytest.param(name, marks=marks, id=name)


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and not _within(missing, PACKAGES):
            pytest.skip(f"needs {missing}, which is not installed")
        raise


def run_examples(module, extraglobs=None) -> tuple[int, int, str]:
    """Run the examples of ``module``: ``(examples tried, failures, the runner's report)``."""
    tests = [t for t in doctest.DocTestFinder(exclude_empty=True).find(module, module.__name__) if t.examples]
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    report = io.StringIO()
    for test in sorted(tests):
        test.globs.update(extraglobs or {})
        runner.run(test, out=report.write)
    return runner.tries, runner.failures, report.getvalue()


def has_examples(module) -> bool:
    return any(t.examples for t in doctest.DocTestFinder(exclude_empty=True).find(module, module.__name__))


@pytest.mark.parametrize("name", [_case(n) for n in module_names()])
def test_docstring_examples(name, request):
    module = _import(name)
    if not has_examples(module):
        pytest.skip(NO_EXAMPLES)
    extraglobs = {"spark": request.getfixturevalue("spark")} if _within(name, SPARK_PACKAGES) else {}
    tries, failures, report = run_examples(module, extraglobs)
    if failures:
        pytest.fail(f"{failures} of {tries} examples failed in {name}:\n{report}", pytrace=False)


def test_runner_reports_a_wrong_example(tmp_path):
    path = tmp_path / "cq_doctest_probe.py"
    path.write_text(
        'def double(x):\n'
        '    """Twice x.\n\n'
        '    >>> double(2)\n'
        '    4\n'
        '    >>> double([1,\n'
        '    ...         2])   # NORMALIZE_WHITESPACE and ELLIPSIS apply\n'
        '    [1, 2,\n'
        '     1, ...]\n'
        '    >>> double(spark)\n'
        '    5\n'
        '    """\n'
        '    return 2 * x\n')
    spec = importlib.util.spec_from_file_location("cq_doctest_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tries, failures, report = run_examples(module, {"spark": 2})
    assert (tries, failures) == (3, 1)
    assert "double(spark)" in report and "Expected:\n    5\nGot:\n    4" in report
