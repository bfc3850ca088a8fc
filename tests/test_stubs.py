"""The compiled modules' type stubs match what the modules export (a native symbol without a stub fails).

In the spirit of datafusion-python's check that every symbol of its native module has a Python wrapper:
for each compiled module the public names (no leading underscore; imported modules such as
``_granularity.np`` are not exports) equal the names its ``.pyi`` declares, and so do the public
methods and properties of its classes. Stub-only helpers (``_Emitted``, ``_Slices``) are private and not
compared. Where the runtime states a signature -- the first docstring line pybind11 writes, or
``inspect.signature`` of a Cython function -- the stub's parameters have the same names, in the same
order, with defaults in the same places (and equal defaults where both are literals). The stubs and
``py.typed`` must sit next to the installed modules, and ``pyproject.toml`` must ship them in the wheel.
"""
from __future__ import annotations

import ast
import importlib
import importlib.resources
import inspect
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from pyspark_cq import _native

ROOT = Path(__file__).resolve().parent.parent
MODULES = _native.NATIVE_MODULES


# ---------------------------------------------------------------------------------------------
# the stub side


@dataclass
class Param:
    name: str
    kind: str            # "positional" | "keyword" | "var_positional" | "var_keyword"
    default: str | None  # source text of the default, None when there is none


@dataclass
class StubFunction:
    name: str
    params: list[Param]
    decorators: set[str]


@dataclass
class StubClass:
    name: str
    members: dict[str, list[StubFunction]]  # overloads and property setters give several entries


@dataclass
class Stub:
    functions: dict[str, list[StubFunction]]
    classes: dict[str, StubClass]
    constants: dict[str, str]  # name -> annotation text

    def names(self) -> set[str]:
        return {n for n in (*self.functions, *self.classes, *self.constants) if not n.startswith("_")}


def _decorator_name(node: ast.expr) -> str:
    return ast.unparse(node.func if isinstance(node, ast.Call) else node)


def _stub_function(node: ast.FunctionDef) -> StubFunction:
    a = node.args
    params = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    params += [Param(p.arg, "positional", d) for p, d in zip(positional, defaults)]
    if a.vararg:
        params.append(Param(a.vararg.arg, "var_positional", None))
    params += [Param(p.arg, "keyword", None if d is None else ast.unparse(d))
               for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append(Param(a.kwarg.arg, "var_keyword", None))
    return StubFunction(node.name, params, {_decorator_name(d) for d in node.decorator_list})


def parse_stub(path: Path) -> Stub:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    stub = Stub({}, {}, {})
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            stub.functions.setdefault(node.name, []).append(_stub_function(node))
        elif isinstance(node, ast.ClassDef):
            members: dict[str, list[StubFunction]] = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members.setdefault(item.name, []).append(_stub_function(item))
            stub.classes[node.name] = StubClass(node.name, members)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stub.constants[node.target.id] = ast.unparse(node.annotation)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    stub.constants[target.id] = ""
    return stub


# ---------------------------------------------------------------------------------------------
# the runtime side


def public(names) -> set[str]:
    return {n for n in names if not n.startswith("_")}


def exported_names(module: types.ModuleType) -> set[str]:
    """``dir(module)`` without dunders, private names and the modules it imported."""
    return {n for n in public(dir(module)) if not isinstance(getattr(module, n), types.ModuleType)}


def _top_level(text: str):
    """``(index, char)`` of the characters of ``text`` outside brackets and quotes."""
    depth, quote = 0, None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0:
            yield i, ch


def split_top_level(text: str) -> list[str]:
    """Split a parameter list at the commas outside brackets and quotes."""
    parts, start = [], 0
    for i, ch in _top_level(text):
        if ch == ",":
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _param_from_text(text: str) -> Param:
    """``name: type = default`` (pybind11's rendering of one parameter) as a Param."""
    if text.startswith("**"):
        return Param(text[2:].split(":")[0].strip(), "var_keyword", None)
    if text.startswith("*"):
        return Param(text[1:].split(":")[0].strip(), "var_positional", None)
    name = re.match(r"\s*(\w+)", text).group(1)
    # the first '=' outside brackets and quotes starts the default
    default = next((text[i + 1:].strip() for i, ch in _top_level(text) if ch == "="), None)
    return Param(name, "positional", default)


def pybind11_signatures(obj, name: str) -> list[list[Param]] | None:
    """The parameter lists pybind11 wrote into ``obj.__doc__`` (one per overload), or None."""
    doc = getattr(obj, "__doc__", None) or ""
    lines = doc.splitlines()
    if not lines:
        return None
    if "Overloaded function." in doc:
        sigs = [m.group(1) for line in lines if (m := re.match(rf"^\d+\. {re.escape(name)}\((.*)\) ->", line))]
    else:
        m = re.match(rf"^{re.escape(name)}\((.*)\) ->", lines[0])
        sigs = [m.group(1)] if m else []
    if not sigs:
        return None
    return [[_param_from_text(p) for p in split_top_level(sig)] for sig in sigs]


def inspect_signature(obj) -> list[Param] | None:
    """The parameters ``inspect.signature`` reports (Cython functions compiled with binding=True)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    kinds = {inspect.Parameter.POSITIONAL_ONLY: "positional", inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
             inspect.Parameter.KEYWORD_ONLY: "keyword", inspect.Parameter.VAR_POSITIONAL: "var_positional",
             inspect.Parameter.VAR_KEYWORD: "var_keyword"}
    return [Param(p.name, kinds[p.kind], None if p.default is inspect.Parameter.empty else repr(p.default))
            for p in sig.parameters.values()]


def runtime_signatures(obj, name: str) -> list[list[Param]] | None:
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)) or \
            type(obj).__name__ in ("instancemethod", "builtin_function_or_method"):
        return pybind11_signatures(obj, name)  # pybind11: the signature is in the docstring only
    sig = inspect_signature(obj)
    return None if sig is None else [sig]


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return NotImplemented


def compare_params(where: str, stub: list[Param], runtime: list[Param]) -> list[str]:
    problems = []
    names_stub, names_rt = [p.name for p in stub], [p.name for p in runtime]
    if names_stub != names_rt:
        return [f"{where}: the stub has parameters {names_stub}, the module {names_rt}"]
    for s, r in zip(stub, runtime):
        if (s.default is None) != (r.default is None):
            problems.append(f"{where}: parameter {s.name!r} has a default in "
                            f"{'the stub' if s.default is not None else 'the module'} only")
        elif s.default is not None and s.default != "...":
            a, b = _literal(s.default), _literal(r.default)
            if a is not NotImplemented and b is not NotImplemented and a != b:
                problems.append(f"{where}: parameter {s.name!r} defaults to {s.default} in the stub, "
                                f"{r.default} in the module")
        if s.kind != r.kind and r.kind != "positional":  # pybind11 parameters take positions and keywords
            problems.append(f"{where}: parameter {s.name!r} is {s.kind} in the stub, {r.kind} in the module")
    return problems


def check_callable(where: str, obj, name: str, stubs: list[StubFunction]) -> list[str]:
    """Compare each overload's parameters; ``stubs`` are the stub's definitions of ``name``."""
    sigs = runtime_signatures(obj, name)
    if sigs is None:
        return []
    defs = [f for f in stubs if "overload" in f.decorators] or stubs[:1]
    if len(defs) != len(sigs):
        return [f"{where}: the module has {len(sigs)} overload(s), the stub {len(defs)}"]
    problems = []
    for i, (d, sig) in enumerate(zip(defs, sigs)):
        problems += compare_params(where if len(sigs) == 1 else f"{where} (overload {i + 1})", d.params, sig)
    return problems


# ---------------------------------------------------------------------------------------------
# tests


def _module(name: str) -> types.ModuleType:
    return importlib.import_module(f"pyspark_cq.{name}")


def _stub_path(name: str) -> Path:
    return Path(_module(name).__file__).with_name(f"{name}.pyi")


@pytest.fixture(scope="module", params=MODULES)
def native(request):
    name = request.param
    path = _stub_path(name)
    assert path.is_file(), f"pyspark_cq.{name} has no stub {path.name} next to {_module(name).__file__}"
    return name, _module(name), parse_stub(path)


def test_py_typed_and_stubs_are_installed():
    root = importlib.resources.files("pyspark_cq")
    assert root.joinpath("py.typed").is_file(), "pyspark_cq/py.typed (PEP 561 marker) is not installed"
    for name in MODULES:
        module = _module(name)
        assert Path(module.__file__).suffix in (".so", ".pyd"), f"pyspark_cq.{name} is not a compiled module"
        assert root.joinpath(f"{name}.pyi").is_file(), f"pyspark_cq/{name}.pyi is not installed"
        assert _stub_path(name).is_file()


def test_pyproject_ships_the_stubs_in_the_wheel():
    pyproject = ROOT / "pyproject.toml"
    if not pyproject.is_file() or sys.version_info < (3, 11):
        pytest.skip("source tree (or tomllib) not available")
    import tomllib

    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    shipped = data.get("tool", {}).get("setuptools", {}).get("package-data", {}).get("pyspark_cq", [])
    assert "py.typed" in shipped and "*.pyi" in shipped, \
        f"[tool.setuptools.package-data] pyspark_cq must list 'py.typed' and '*.pyi', got {shipped}"


def test_stub_declares_exactly_the_exported_names(native):
    name, module, stub = native
    exported, declared = exported_names(module), stub.names()
    assert not exported - declared, f"pyspark_cq.{name} exports names its stub lacks: {sorted(exported - declared)}"
    assert not declared - exported, f"{name}.pyi declares names the module lacks: {sorted(declared - exported)}"


def test_stub_kinds_match(native):
    """Classes are classes, functions functions, constants annotated with their runtime type."""
    name, module, stub = native
    problems = []
    for attr in sorted(exported_names(module)):
        value = getattr(module, attr)
        if isinstance(value, type):
            if attr not in stub.classes:
                problems.append(f"{attr} is a class, the stub does not declare it as one")
        elif callable(value):
            if attr not in stub.functions:
                problems.append(f"{attr} is a function, the stub does not declare it with def")
        elif attr not in stub.constants:
            problems.append(f"{attr} is a {type(value).__name__} constant, the stub does not annotate it")
        elif type(value).__name__ not in re.findall(r"\w+", stub.constants[attr]):
            problems.append(f"{attr} is a {type(value).__name__}, the stub annotates it {stub.constants[attr]!r}")
    assert not problems, f"pyspark_cq.{name}: " + "; ".join(problems)


def test_stub_classes_declare_exactly_the_public_members(native):
    name, module, stub = native
    problems = []
    for cls_name, cls in sorted(stub.classes.items()):
        runtime = getattr(module, cls_name, None)
        if not isinstance(runtime, type):
            continue  # reported by the name test
        members = public(dir(runtime)) - public(dir(object))
        declared = public(cls.members)
        if members - declared:
            problems.append(f"{cls_name} has members its stub lacks: {sorted(members - declared)}")
        if declared - members:
            problems.append(f"{cls_name} in the stub declares members the class lacks: {sorted(declared - members)}")
        for member in sorted(members & declared):
            raw = inspect.getattr_static(runtime, member)
            decorators = set().union(*(f.decorators for f in cls.members[member]))
            if isinstance(raw, property):
                if "property" not in decorators:
                    problems.append(f"{cls_name}.{member} is a property, the stub lacks @property")
                settable = f"{member}.setter" in decorators
                if settable != (raw.fset is not None):
                    problems.append(f"{cls_name}.{member} is {'' if raw.fset else 'not '}settable, "
                                    f"the stub says the opposite")
            elif isinstance(raw, staticmethod):
                if "staticmethod" not in decorators:
                    problems.append(f"{cls_name}.{member} is a static method, the stub lacks @staticmethod")
            elif isinstance(raw, classmethod):
                if "classmethod" not in decorators:
                    problems.append(f"{cls_name}.{member} is a class method, the stub lacks @classmethod")
            elif decorators & {"property", "staticmethod", "classmethod"}:
                problems.append(f"{cls_name}.{member} is a plain method, the stub decorates it {sorted(decorators)}")
    assert not problems, f"pyspark_cq.{name}: " + "; ".join(problems)


def test_stub_signatures_match_the_module(native):
    """Parameter names, order and defaults, from pybind11's docstrings or ``inspect.signature``."""
    name, module, stub = native
    problems, checked = [], 0
    for fn_name, defs in sorted(stub.functions.items()):
        obj = getattr(module, fn_name, None)
        if obj is None or fn_name.startswith("_"):
            continue
        problems += check_callable(f"{fn_name}()", obj, fn_name, defs)
        checked += runtime_signatures(obj, fn_name) is not None
    for cls_name, cls in sorted(stub.classes.items()):
        runtime = getattr(module, cls_name, None)
        if not isinstance(runtime, type):
            continue
        for member, defs in sorted(cls.members.items()):
            if member.startswith("_") and member != "__init__":
                continue
            raw = inspect.getattr_static(runtime, member, None)
            if raw is None or isinstance(raw, property):
                continue
            obj = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else getattr(runtime, member)
            problems += check_callable(f"{cls_name}.{member}()", obj, member, defs)
            checked += runtime_signatures(obj, member) is not None
    assert not problems, f"pyspark_cq.{name}: " + "; ".join(problems)
    assert checked, f"pyspark_cq.{name}: no runtime signature could be read, nothing was compared"


# ---------------------------------------------------------------------------------------------
# the checker itself


def test_docstring_signature_parser():
    sig = ("insert_probe(self: pyspark_cq._join.JoinState, side: typing.SupportsInt | typing.SupportsIndex, "
           "offsets: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], store: bool = True, "
           "lower: object = None, tag: str = 'a, b') -> tuple")

    class Fake:
        __doc__ = sig + "\n\nProbe the other side."

    (params,) = pybind11_signatures(Fake, "insert_probe")
    assert [(p.name, p.default) for p in params] == [
        ("self", None), ("side", None), ("offsets", None), ("store", "True"), ("lower", "None"), ("tag", "'a, b'")]
    stub = _stub_function(ast.parse("def insert_probe(self, side, offsets, store=True, lower=None, tag='a, b'): ...")
                          .body[0])
    assert compare_params("f", stub.params, params) == []
    wrong = _stub_function(ast.parse("def insert_probe(self, side, offset, store=False, lower=None, tag='a, b'): ...")
                           .body[0])
    assert compare_params("f", wrong.params, params)
    renamed_default = _stub_function(ast.parse(
        "def insert_probe(self, side, offsets, store=False, lower=None, tag='a, b'): ...").body[0])
    assert compare_params("f", renamed_default.params, params) == [
        "f: parameter 'store' defaults to False in the stub, True in the module"]


def test_missing_stub_name_is_reported(tmp_path):
    path = tmp_path / "_serde.pyi"
    path.write_text("FORMAT: str\ndef pack(columns): ...\n")
    stub = parse_stub(path)
    missing = exported_names(_module("_serde")) - stub.names()
    assert missing == {"unpack"}
