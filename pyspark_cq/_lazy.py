"""Lazy exports (PEP 562): a package lists what it offers; each module behind a name is imported on first use.

Importing ``pyspark_cq`` (on the driver and in every Python worker) then costs only what is used.
"""
from __future__ import annotations

import importlib
import sys
import warnings


def lazy_exports(package: str, table: dict, aliases: dict | None = None):
    """A module ``__getattr__`` importing ``table[name]`` (relative to ``package``) on first access.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    table : dict of str to str
        Exported name → module path relative to ``package`` (e.g. ``".core"``).
    aliases : dict of str to str, optional
        Exported name → the attribute's name in its module, where they differ.

    Returns
    -------
    callable
        ``__getattr__(name)``; it caches each value in the package so later lookups skip it.
    """
    aliases = aliases or {}

    def __getattr__(name: str):
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), aliases.get(name, name))
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def moved_names(package: str, *modules: str):
    """A package ``__getattr__`` for a module that became the package: a name the old module had (now in one
    of ``modules``) still resolves, with a :class:`DeprecationWarning` naming its new home.

    Parameters
    ----------
    package : str
        The package's ``__name__`` (the old module's path, e.g. ``"pyspark_cq.operators.join"``).
    *modules : str
        Where the old module's names live now, relative to ``package``, searched in order (e.g. ``".driver"``).

    Returns
    -------
    callable
        ``__getattr__(name)``.
    """
    def __getattr__(name: str):
        if not name.startswith("__"):   # dunder probes (copy, pickle, doctest) mean "not here"
            for module in modules:
                target = importlib.import_module(module, package)
                if hasattr(target, name):
                    value = getattr(target, name)
                    home = getattr(value, "__module__", None) or target.__name__   # a constant: where it was found
                    warnings.warn(f"{package}.{name} is deprecated: import it from {home} (the module {package} "
                                  f"became a package; issue 38)", DeprecationWarning, stacklevel=2)
                    return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
