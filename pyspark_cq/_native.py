"""Import guard for the compiled extensions (as scikit-learn's ``_check_build``).

A missing or broken compiled module becomes an ``ImportError`` that says how to rebuild, instead of a
bare "No module named pyspark_cq._granularity".
"""
from __future__ import annotations

import importlib
from types import ModuleType

from .vocabulary.operators import native_modules

#: Compiled modules built from ``native/`` by ``setup.py``: the operators' (their descriptors,
#: :mod:`pyspark_cq.vocabulary.operators`) and ``_serde``, the state serialisation they share.
NATIVE_MODULES = tuple(sorted({*native_modules(), "_serde"}))

_HELP = """\
pyspark-cq could not import its compiled module {module!r}: {error}
The package seems not to have been built or installed correctly.
- From a source checkout: run `pip install .` (or `pip install -e .` for development, which builds
  the extensions in place; `python setup.py build_ext --inplace` rebuilds them after editing native/).
- From PyPI: `pip install --force-reinstall --no-cache-dir pyspark-cq`.
- On a cluster, install the wheel on every worker: compiled modules cannot be imported from a
  --py-files zip.
A C/C++ compiler and the Python headers are needed to build from source."""


class NativeBuildError(ImportError):
    """A compiled module of pyspark-cq is missing or cannot be loaded."""


def load(name: str) -> ModuleType:
    """Import ``pyspark_cq.<name>`` or raise :class:`NativeBuildError` saying how to rebuild."""
    module = f"pyspark_cq.{name}"
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise NativeBuildError(_HELP.format(module=module, error=exc)) from exc


def check_build() -> dict[str, str]:
    """Import every compiled module; return ``{name: path}`` or raise :class:`NativeBuildError`."""
    return {name: load(name).__file__ for name in NATIVE_MODULES}
