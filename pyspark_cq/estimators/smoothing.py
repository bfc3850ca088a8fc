"""Temporal weighting: single exponential smoothing and OM's decay-weighted sample mean."""
from __future__ import annotations

import math

import numpy as np

from .. import _args as chk
from . import _formulas
from ._base import Estimator

__all__ = ["ExponentialSmoothing", "DecayedMean"]


class ExponentialSmoothing(Estimator):
    """Single exponential smoothing, ``C = C·(1-α) + C_new·α``, 0 < α < 1.

    RTStream smooths each operator's cost constants with it after every query instance (Wei, Prasad,
    Son & Stankovic, §4.1.3); PIPES suggests it for the online average of the distance d
    (Cammert et al., §3.2.2). Not mergeable: the result depends on the order of the observations.

    Parameters
    ----------
    alpha : float
        Weight of a new observation, in (0, 1).
    initial : float, optional
        Initial level; by default the first observation is taken as the level.

    Examples
    --------
    With α = 0.5 the first observation becomes the level, then ``C = C·0.5 + C_new·0.5``: 10, 15, 22.5.
    Starting from the level 0 instead: 5, 12.5, 21.25.

    >>> from pyspark_cq.estimators import ExponentialSmoothing
    >>> ExponentialSmoothing(alpha=0.5).update(10).update(20).update(30).value
    22.5
    >>> ExponentialSmoothing(alpha=0.5, initial=0.0).update(10).update(20).update(30).value
    21.25
    """

    _params = ("alpha", "initial")

    def __init__(self, alpha: float = 0.3, initial: float | None = None):
        self.alpha = chk.fraction(alpha, "alpha")
        self.initial = None if initial is None else chk.real(initial, "initial")
        self._level = math.nan if initial is None else self.initial
        self._n = 0

    def update(self, x):
        """Add the observation ``x``; returns self."""
        x = chk.real(x, "x")
        if self._n == 0 and self.initial is None:
            self._level = x
        else:
            self._level = _formulas.ses_step(self._level, x, self.alpha)
        self._n += 1
        return self

    def update_many(self, xs):
        """Add the observations ``xs`` in order; returns self."""
        xs = chk.real_array(xs, "xs")
        if xs.size:
            from . import _kernels

            initialized = self._n > 0 or self.initial is not None
            self._level = float(_kernels.ses_run(self._level, initialized, self.alpha, xs))
            self._n += int(xs.size)
        return self

    @property
    def value(self) -> float:
        """The smoothed level (the initial value, or nan, before any observation)."""
        return self._level

    @property
    def n(self) -> int:
        """The number of observations so far."""
        return self._n


class DecayedMean(Estimator):
    """OM's decay-weighted sample mean over the last ``window`` observations.

    ``est(R) = Σ_r F(R-r)·G(r) / Σ_r G(r)`` with ``G(r) = exp(-a·r)``, r = 0 for the newest
    observation (Kulkarni & Ravishankar, §4.3: estimates of selectivity and arrival rate per round).
    The paper's sum runs over "the previous d values"; here r = 0 … window-1. ``decay = 0`` is the
    plain mean of the window. Not mergeable: the window is the last observations of one sequence.

    Parameters
    ----------
    window : int
        d, the number of observations kept (>= 1).
    decay : float
        a >= 0, the decay rate per observation.

    Examples
    --------
    With ``a = ln 2`` the newest three observations weigh 1, 1/2 and 1/4: after 1, 2, 3, 4 in a window of
    3 the estimate is ``(4 + 3/2 + 2/4)/(1 + 1/2 + 1/4) = 6/1.75 ≈ 3.4286``. ``decay = 0`` gives the plain
    mean of the window, 3.

    >>> import math
    >>> from pyspark_cq.estimators import DecayedMean
    >>> est = DecayedMean(window=3, decay=math.log(2))
    >>> for x in [1, 2, 3, 4]:
    ...     _ = est.update(x)
    >>> est.observations()
    array([4., 3., 2.])
    >>> round(est.value, 4)
    3.4286
    >>> plain = DecayedMean(window=3, decay=0.0)
    >>> for x in [1, 2, 3, 4]:
    ...     _ = plain.update(x)
    >>> plain.value
    3.0
    """

    _params = ("window", "decay")

    def __init__(self, window: int = 10, decay: float = 0.5):
        self.window = chk.integer(window, "window", minimum=1)
        self.decay = chk.non_negative(decay, "decay")
        self._buf = np.zeros(self.window, dtype=np.float64)
        self._pos = 0      # next write index
        self._count = 0    # values held (<= window)
        self._n = 0

    def update(self, x):
        """Add the observation ``x``; returns self."""
        self._buf[self._pos] = chk.real(x, "x")
        self._pos = (self._pos + 1) % self.window
        self._count = min(self.window, self._count + 1)
        self._n += 1
        return self

    def update_many(self, xs):
        """Add the observations ``xs`` in order; returns self."""
        xs = chk.real_array(xs, "xs")
        if xs.size:
            from . import _kernels

            pos, count = _kernels.ring_extend(self._buf, self._pos, self._count, xs)
            self._pos, self._count = int(pos), int(count)
            self._n += int(xs.size)
        return self

    def observations(self) -> np.ndarray:
        """The observations in the window, newest first."""
        idx = (self._pos - 1 - np.arange(self._count)) % self.window
        return self._buf[idx]

    @property
    def value(self) -> float:
        """The decay-weighted mean of the observations in the window (nan before any)."""
        return _formulas.decay_weighted_mean(self.observations(), self.decay)

    @property
    def n(self) -> int:
        """The number of observations so far."""
        return self._n
