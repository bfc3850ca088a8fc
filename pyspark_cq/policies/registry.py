"""Policy plugins registered under the entry-point group ``pyspark_cq.policies``.

A package registers a policy the way pyspark-cq registers its own (``pyproject.toml``)::

    [project.entry-points."pyspark_cq.policies"]
    pipes = "pyspark_cq_plugins.pipes_rm:PipesResourceManager"

Discovery reads installed metadata only; a plugin's module is imported when the policy is first asked
for (:func:`load`, :func:`create`, ``available(load=True)``). A plugin that fails to import, is not a
:class:`~pyspark_cq.policies.base.Policy` subclass, or declares another name than it is registered
under is reported (a :class:`PolicyPluginWarning` and the ``pyspark_cq.policies`` logger) and skipped.
Two plugins registered under one name with different targets are reported as duplicates; the first
(ordered by distribution name, then target) is used.
"""
from __future__ import annotations

import importlib.metadata as _metadata
import logging
import threading
import warnings
from dataclasses import dataclass

from .base import Policy

__all__ = ["GROUP", "PolicyPluginWarning", "PolicyLoadError", "available", "load", "create", "problems",
           "refresh"]

GROUP = "pyspark_cq.policies"
_log = logging.getLogger("pyspark_cq.policies")
_lock = threading.RLock()


class PolicyPluginWarning(UserWarning):
    """A policy plugin is broken or registered twice; it is skipped (or the first one is used)."""


class PolicyLoadError(LookupError):
    """A policy name is unknown, or its plugin could not be loaded."""


@dataclass(frozen=True)
class _Plugin:
    name: str
    target: str
    distribution: str
    entry_point: object


_state: dict = {"plugins": None, "classes": {}, "broken": {}, "problems": []}


def _warn(message: str) -> None:
    with _lock:
        if message in _state["problems"]:
            return
        _state["problems"].append(message)
    _log.warning(message)
    warnings.warn(message, PolicyPluginWarning, stacklevel=3)


def _discover() -> dict[str, _Plugin]:
    with _lock:
        if _state["plugins"] is not None:
            return _state["plugins"]
    try:
        eps = _metadata.entry_points(group=GROUP)
    except Exception as exc:  # a corrupt installation must not take the runtime down
        _warn(f"policy plugins: reading entry points of group {GROUP!r} failed: {exc!r}")
        eps = []
    found: dict[str, list[_Plugin]] = {}
    for ep in eps:
        dist = getattr(getattr(ep, "dist", None), "name", None) or "<unknown distribution>"
        found.setdefault(ep.name, []).append(_Plugin(ep.name, ep.value, dist, ep))
    plugins = {}
    for name, candidates in sorted(found.items()):
        candidates.sort(key=lambda p: (p.distribution, p.target))
        targets = list(dict.fromkeys(p.target for p in candidates))
        if len(targets) > 1:
            listing = "; ".join(f"{p.target} (from {p.distribution})" for p in candidates)
            _warn(f"policy plugin name {name!r} is registered more than once: {listing}; "
                    f"using {candidates[0].target}")
        plugins[name] = candidates[0]
    with _lock:
        _state["plugins"] = plugins
    return plugins


def refresh() -> None:
    """Forget discovered plugins, loaded classes and reported problems (after installing a plugin)."""
    with _lock:
        _state["plugins"] = None
        _state["classes"] = {}
        _state["broken"] = {}
        _state["problems"] = []


def problems() -> list[str]:
    """Messages about broken and duplicate plugins reported so far."""
    with _lock:
        return list(_state["problems"])


def load(name: str) -> type[Policy]:
    """The policy class registered as ``name`` (imported on first use).

    Raises
    ------
    PolicyLoadError
        Unknown name (the message lists the available ones) or a broken plugin (the message says why).
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a policy name (str), got {name!r}")
    plugins = _discover()
    with _lock:
        if name in _state["classes"]:
            return _state["classes"][name]
        if name in _state["broken"]:
            raise PolicyLoadError(_state["broken"][name])
    if name not in plugins:
        raise PolicyLoadError(f"no policy named {name!r}; available: {sorted(plugins)} "
                              f"(entry-point group {GROUP!r})")
    plugin = plugins[name]
    try:
        cls = plugin.entry_point.load()
    except Exception as exc:
        message = (f"policy plugin {name!r} ({plugin.target} from {plugin.distribution}) failed to load: "
                   f"{type(exc).__name__}: {exc}")
        cls = None
    else:
        message = None
        if not (isinstance(cls, type) and issubclass(cls, Policy)):
            message = (f"policy plugin {name!r} ({plugin.target}) is not a subclass of "
                       f"pyspark_cq.policies.Policy: {cls!r}")
        elif cls.name != name:
            message = (f"policy plugin {name!r} ({plugin.target}) declares name {cls.name!r}; "
                       f"the class attribute `name` must equal the entry-point name")
    if message is not None:
        with _lock:
            _state["broken"][name] = message
        _warn(message + "; skipped")
        raise PolicyLoadError(message)
    with _lock:
        _state["classes"][name] = cls
    return cls


def available(*, load: bool = False) -> list[str]:
    """Names of the registered policies, sorted.

    Parameters
    ----------
    load : bool
        Import every plugin and list only those that load (broken ones are reported and skipped).
        Without it, only installed metadata is read.
    """
    names = sorted(_discover())
    if not load:
        return names
    ok = []
    for name in names:
        try:
            globals()["load"](name)
        except PolicyLoadError:
            continue
        ok.append(name)
    return ok


def create(policy, **options) -> Policy:
    """A policy instance: ``policy`` is a registered name (instantiated with ``options``), a
    :class:`Policy` subclass, or an instance (returned as is; ``options`` must then be empty).
    """
    if isinstance(policy, Policy):
        if options:
            raise TypeError(f"options {sorted(options)} given with a policy instance; configure the instance")
        return policy
    if isinstance(policy, type) and issubclass(policy, Policy):
        return policy(**options)
    if isinstance(policy, str):
        return load(policy)(**options)
    raise TypeError(f"policy must be a registered policy name, a Policy subclass or instance, got {policy!r}")
