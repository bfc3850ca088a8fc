"""The dependency rules of the package, one test per rule (docs/architecture.md, "Layers").

Imports flow one way so that each part can be tested and replaced alone, and so that a Spark Python worker
running an operator loads only what the operator needs. Each rule is checked twice:

- dynamically: the rule's modules are imported in a fresh interpreter and ``sys.modules`` must hold
  nothing forbidden (what a worker or a tool really loads);
- statically: no ``import`` statement anywhere in the rule's source files, including the ones inside
  functions that run only later, names a forbidden module.

The installed package is checked (pytest runs with ``--import-mode=importlib``), as Spark's workers use it.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pyspark_cq_plugins
import pytest

import pyspark_cq

ROOTS = {"pyspark_cq": Path(pyspark_cq.__file__).parent, "pyspark_cq_plugins": Path(pyspark_cq_plugins.__file__).parent}


def modules(prefix: str) -> list[str]:
    """The modules of the package or module ``prefix`` (found from the files, nothing imported)."""
    top = prefix.split(".")[0]
    root = ROOTS[top]
    out = []
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join([top] + parts)
        if name == prefix or name.startswith(prefix + "."):
            out.append(name)
    return out


def source(module: str) -> Path:
    top, *rest = module.split(".")
    base = ROOTS[top].joinpath(*rest)
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def loaded_after_import(names: list[str]) -> set[str]:
    """``sys.modules`` of a fresh interpreter after importing ``names``."""
    code = ("import importlib, json, sys, warnings\n"
            "warnings.simplefilter('ignore')\n"
            f"for m in {names!r}:\n"
            "    importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if source(module).name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_names(module: str) -> set[str]:
    """Every module an ``import`` statement of ``module``'s source names (at any depth, relative ones resolved;
    ``from X import y`` counts as ``X`` and ``X.y``)."""
    tree = ast.parse(source(module).read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def _hits(names, forbidden) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))


@dataclass(frozen=True)
class Rule:
    name: str
    packages: tuple[str, ...]      # every module of these is checked
    forbidden: tuple[str, ...]     # module prefixes they must not load

    def members(self) -> list[str]:
        return [m for p in self.packages for m in modules(p)]


RULES = [
    Rule("cost models and the plan model are pure", ("pyspark_cq.cost", "pyspark_cq.plan"),
         ("pyspark", "py4j", "pyspark_cq.runtime", "pyspark_cq.operators", "pyspark_cq.policies",
          "pyspark_cq.control")),
    Rule("the shared vocabulary imports no other layer", ("pyspark_cq.vocabulary",),
         ("pyspark", "py4j", "pyspark_cq.control", "pyspark_cq.runtime", "pyspark_cq.operators",
          "pyspark_cq.policies", "pyspark_cq.lang", "pyspark_cq.console", "pyspark_cq_plugins")),
    Rule("the control vocabulary imports no layer above it", ("pyspark_cq.control",),
         ("pyspark", "py4j", "pyspark_cq.runtime", "pyspark_cq.operators", "pyspark_cq.policies",
          "pyspark_cq_plugins")),
    Rule("operators read the control table but never decide", ("pyspark_cq.operators",),
         ("pyspark_cq.policies", "pyspark_cq.runtime", "pyspark_cq_plugins")),
    Rule("policies and plugins see snapshots, not the runtime", ("pyspark_cq.policies", "pyspark_cq_plugins"),
         ("pyspark", "pyspark_cq.runtime", "pyspark_cq.operators")),
    Rule("the core never imports a plugin", ("pyspark_cq",), ("pyspark_cq_plugins",)),
    Rule("the session knows no operator, runtime, policy, language or console", ("pyspark_cq.session",),
         ("pyspark_cq.operators", "pyspark_cq.runtime", "pyspark_cq.policies", "pyspark_cq.lang",
          "pyspark_cq.console")),
    Rule("the CQL analysis, parser and printer never load Spark",
         ("pyspark_cq.lang.analysis", "pyspark_cq.lang.parser", "pyspark_cq.lang.printer", "pyspark_cq.lang.ast",
          "pyspark_cq.lang.errors"),
         ("pyspark", "py4j")),
    Rule("the console is given its runtime, never imports it", ("pyspark_cq.console",), ("pyspark_cq.runtime",)),
]


def _offenders(rule: Rule, loaded: set[str]) -> dict[str, list[str]]:
    """Which of the rule's modules, imported alone, loads what (only called once a violation is known)."""
    out = {}
    for m in rule.members():
        bad = _hits(loaded_after_import([m]), rule.forbidden)
        if bad:
            out[m] = bad
    return out or {"(together)": _hits(loaded, rule.forbidden)}


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_rule_holds_at_import(rule):
    loaded = loaded_after_import(rule.members())
    if _hits(loaded, rule.forbidden):
        pytest.fail(f"{rule.name}: importing these modules loads forbidden ones: {_offenders(rule, loaded)}")


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_rule_holds_in_every_import_statement(rule):
    bad = {m: hits for m in rule.members() if (hits := _hits(imported_names(m), rule.forbidden))}
    assert not bad, f"{rule.name}: import statements name forbidden modules: {bad}"


def test_the_checks_see_a_forbidden_import(tmp_path):
    """The checkers themselves: a module that imports the runtime inside a function, and one that imports
    it at the top, are both caught."""
    pkg = tmp_path / "layer_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "lazy.py").write_text("def f():\n    from pyspark_cq.runtime import core\n    return core\n")
    (pkg / "eager.py").write_text("import pyspark_cq.runtime.core\n")
    ROOTS["layer_probe"] = pkg
    try:
        assert _hits(imported_names("layer_probe.lazy"), ("pyspark_cq.runtime",)) == [
            "pyspark_cq.runtime", "pyspark_cq.runtime.core"]
        code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import layer_probe.eager"
        out = subprocess.run([sys.executable, "-c", code + "; import json; print(json.dumps(sorted(sys.modules)))"],
                             check=True, capture_output=True, text=True, timeout=300)
        assert "pyspark_cq.runtime.core" in json.loads(out.stdout.strip().splitlines()[-1])
        assert modules("layer_probe") == ["layer_probe", "layer_probe.eager", "layer_probe.lazy"]
    finally:
        del ROOTS["layer_probe"]


def test_the_experiments_are_not_part_of_the_runtime():
    """``pyspark_cq.experiments`` (the papers' workloads and oracles) is for the benchmarks and the tests."""
    bad = {m: hits for m in modules("pyspark_cq") if not m.startswith("pyspark_cq.experiments")
           and (hits := _hits(imported_names(m), ("pyspark_cq.experiments",)))}
    assert not bad, f"the package imports its experiments: {bad}"


def _top_imports(path: Path) -> set[str]:
    """The first name of every absolute import of the file (relative imports stay inside its package)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_tests_and_benchmarks_do_not_import_each_other():
    """The benchmarks run as modules of the package ``benchmarks`` and no test imports one; the benchmarks
    use no test helper (what both need lives in the package, e.g. ``pyspark_cq.experiments``)."""
    repo = Path(__file__).resolve().parents[1]
    tests = {p: hits for p in sorted((repo / "tests").rglob("*.py")) if (hits := _top_imports(p) & {"benchmarks"})}
    assert not tests, f"tests import the benchmarks: {tests}"
    benches = {p: hits for p in sorted((repo / "benchmarks").rglob("*.py"))
               if (hits := _top_imports(p) & {"tests", "helpers", "conftest"})}
    assert not benches, f"benchmarks import the tests: {benches}"
