"""Base classes of the online estimators (the pattern of river's ``stats`` module).

Every estimator has ``update(x)`` (one observation, returns ``self``), ``update_many(xs)`` (a batch,
through a Numba kernel), the ``value`` property (``nan`` while there is no estimate), ``n`` (number of
observations), ``clone()`` (a fresh estimator with the same parameters) and pickles. Estimators whose
math allows it are :class:`Mergeable`: ``a + b`` is the estimator of the union of both inputs and
``a += b`` merges in place.
"""
from __future__ import annotations

import abc
import copy


class Estimator(abc.ABC):
    """An online estimator of one statistic."""

    #: Names of the constructor parameters (for ``clone`` and ``repr``).
    _params: tuple[str, ...] = ()

    @abc.abstractmethod
    def update(self, x) -> Estimator:
        """Add one observation; return ``self``."""

    @abc.abstractmethod
    def update_many(self, xs) -> Estimator:
        """Add a batch of observations (a 1-d array), in order; return ``self``."""

    @property
    @abc.abstractmethod
    def value(self) -> float:
        """The current estimate (``nan`` while there is none)."""

    @property
    @abc.abstractmethod
    def n(self) -> int:
        """The number of observations seen."""

    def params(self) -> dict:
        """The constructor parameters."""
        return {name: getattr(self, name) for name in self._params}

    def clone(self) -> Estimator:
        """A new estimator with the same parameters and no observations."""
        return type(self)(**self.params())

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args}): {self.value:.6g}"


class Mergeable(Estimator):
    """An estimator whose state for the union of two inputs is computable from the two states."""

    @abc.abstractmethod
    def _merge_into(self, other) -> None:
        """Fold ``other`` (checked compatible) into ``self``."""

    def _check_compatible(self, other) -> None:
        if type(other) is not type(self):
            raise TypeError(f"other must be a {type(self).__name__}, got {type(other).__name__}")
        if other.params() != self.params():
            raise ValueError(f"other must have the same parameters {self.params()}, got {other.params()}")

    def merge(self, other) -> Mergeable:
        """A new estimator for the observations of ``self`` and ``other`` together."""
        self._check_compatible(other)
        out = copy.deepcopy(self)
        out._merge_into(other)
        return out

    def __add__(self, other):
        if not isinstance(other, Estimator):
            return NotImplemented
        return self.merge(other)

    def __iadd__(self, other):
        if not isinstance(other, Estimator):
            return NotImplemented
        self._check_compatible(other)
        self._merge_into(other)
        return self
