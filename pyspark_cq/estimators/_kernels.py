"""Numba kernels for batch updates of the estimators.

Importing this module imports Numba, so the estimator classes import it only inside ``update_many``
(and the sampler): plain ``update`` calls never load Numba. The kernels are the batch loops of
:mod:`._formulas` compiled with ``njit(cache=True)``: compiled on first call (no eager signatures)
and cached on disk next to ``_formulas.py`` — set ``NUMBA_CACHE_DIR`` to a writable directory on
Spark workers whose package directory is read-only. The scalar formulas they call are registered as
jitable, so nothing is written twice, and the cache follows edits of ``_formulas.py``.
"""
from __future__ import annotations

from numba import njit
from numba.extending import register_jitable

from . import _formulas

# let compiled code call the scalar formulas (they stay plain Python functions)
register_jitable(_formulas.ses_step)
register_jitable(_formulas.bin_index)

ses_run = njit(cache=True)(_formulas.ses_run)
ring_extend = njit(cache=True)(_formulas.ring_extend)
min_max_count = njit(cache=True)(_formulas.min_max_count)
bernoulli_counts = njit(cache=True)(_formulas.bernoulli_counts)
selection_sample = njit(cache=True)(_formulas.selection_sample)
bin_counts = njit(cache=True)(_formulas.bin_counts)

__all__ = ["ses_run", "ring_extend", "min_max_count", "bernoulli_counts", "selection_sample", "bin_counts"]
