"""The operator descriptors (pyspark_cq.vocabulary.operators) against the code they describe: one descriptor
per operator package, every module they name imports, and the lists derived from them (control parameters,
compiled modules, the CQL compiler's shapes) say what they said before the registry."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import pyspark_cq
from pyspark_cq import _native
from pyspark_cq.control import schema
from pyspark_cq.vocabulary import operators as V

OPERATORS_DIR = Path(pyspark_cq.__file__).parent / "operators"


def test_every_operator_package_has_a_descriptor():
    packages = {f"pyspark_cq.operators.{p.name}" for p in OPERATORS_DIR.iterdir()
                if (p / "__init__.py").exists() and not p.name.startswith("_")}
    assert packages == {d.package for d in V.OPERATORS.values()}


@pytest.mark.parametrize("kind", list(V.OPERATORS))
def test_descriptor_modules_import(kind):
    d = V.descriptor(kind)
    package = importlib.import_module(d.package)
    assert callable(getattr(package, d.kind)), f"{d.package} exports no {d.kind}"
    assert getattr(pyspark_cq, d.kind) is getattr(package, d.kind)
    for module in d.workers:
        importlib.import_module(module)
    if d.native is not None:
        _native.load(d.native)


def test_operator_parameters_come_from_the_descriptors():
    assert schema.OPERATOR_PARAMETERS == {d.kind: d.parameters for d in V.OPERATORS.values() if d.parameters}
    assert schema.OPERATOR_PARAMETERS == {   # what the control table accepted before the registry
        "interval_join": ("lower", "upper", "drop_ratio", "params"),
        "window_join": ("window", "drop_ratio", "params"),
        "sliding_aggregate": ("window", "granularity", "drop_ratio", "params"),
        "select_chain": ("plan_id", "drop_ratio", "params"),
        "multi_join": ("plan_id", "drop_ratio", "params"),
    }


@pytest.mark.parametrize("kind", list(V.OPERATORS))
def test_parameters_are_control_parameters(kind):
    assert set(V.descriptor(kind).parameters) <= set(schema.PARAMETERS)


def test_native_modules_come_from_the_descriptors():
    assert _native.NATIVE_MODULES == ("_aggregate", "_granularity", "_join", "_mjoin", "_serde")
    assert set(_native.NATIVE_MODULES) == set(V.native_modules()) | {"_serde"}


def test_worker_modules_are_listed_once():
    modules = V.worker_modules()
    assert len(modules) == len(set(modules))
    assert {"pyspark_cq.operators.join.worker", "pyspark_cq.operators.aggregate.slicer",
            "pyspark_cq.operators.aggregate.transport", "pyspark_cq.operators.multi_join.worker"} <= set(modules)


def test_register_refuses_a_known_kind_or_shape():
    with pytest.raises(ValueError, match="interval_join"):
        V.register(V.OperatorDescriptor("interval_join", "pyspark_cq.operators.join"))
    with pytest.raises(ValueError, match="aggregate"):
        V.register(V.OperatorDescriptor("another_aggregate", "x", cql_shape="aggregate"))
    assert "another_aggregate" not in V.OPERATORS


def test_unknown_kind_names_the_known_ones():
    with pytest.raises(KeyError, match="sliding_aggregate"):
        V.descriptor("no_such_operator")


def _analyzer_shapes() -> set[str]:
    """Every value the CQL analyzer assigns to ``shape`` (string constants, conditional ones included)."""
    shapes = set()
    for path in (Path(pyspark_cq.__file__).parent / "lang").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "shape" for t in node.targets):
                shapes |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)
                           and isinstance(c.value, str)}
    return shapes


def test_every_cql_shape_has_an_operator():
    shapes = _analyzer_shapes()
    assert {"aggregate", "rows_aggregate", "rows", "join", "multi_join", "stream"} <= shapes
    missing = [s for s in shapes - {"stream"} if V.for_shape(s) is None]   # "stream": Spark's filter / project
    assert not missing, f"CQL shapes without an operator descriptor: {missing}"


def test_explain_names_the_rows_aggregate():
    from pyspark_cq.lang.compiler import explain

    text = explain("ISTREAM(SELECT domain, COUNT(*) FROM Requests [PARTITION BY domain ROWS 10] GROUP BY domain)",
                   {"Requests": ["domain", "t"]})
    assert "rows_aggregate" in text


def test_former_module_names_resolve_with_a_warning():
    """pyspark_cq.operators.join (and the other operator modules) became packages: their public functions are
    exported as before; another name the module had resolves with a DeprecationWarning naming its new home."""
    import pyspark_cq.operators.join as J
    from pyspark_cq.operators.join import worker

    assert J.interval_join is pyspark_cq.interval_join
    with pytest.warns(DeprecationWarning, match=r"pyspark_cq\.operators\.join\.worker"):
        assert J.state_watermarks is worker.state_watermarks   # documented at this path (docs/cost-model.md)
    with pytest.raises(AttributeError):
        assert J.no_such_name is None


def test_descriptors_name_the_counters_their_operators_report():
    """The metrics a descriptor lists are the ones its worker reports (the join's and the aggregation's
    ``METRICS``; multi_join's per-n names start with them and add only indexed counters)."""
    from pyspark_cq.operators.aggregate import config as agg_config
    from pyspark_cq.operators.join import worker as join_worker
    from pyspark_cq.operators.multi_join import worker as mjoin_worker
    from pyspark_cq.vocabulary import metrics as M

    assert V.OPERATORS["interval_join"].metrics == join_worker.METRICS
    assert V.OPERATORS["window_join"].metrics == join_worker.METRICS
    assert V.OPERATORS["sliding_aggregate"].metrics == agg_config.METRICS
    names = mjoin_worker.metric_names(3)
    fixed = [n for n in names if M.parse_input(n) is None and M.parse_step(n) is None]
    assert tuple(fixed) == V.OPERATORS["multi_join"].metrics
    for d in V.OPERATORS.values():
        assert set(d.metrics) <= set(M.NAMES), d.kind
