"""Left inputs anywhere in :func:`pyspark_cq.multi_join`'s chain (``how`` with a ``"left"`` before the last input).

With the last input alone ``"left"`` the tuples that need a null are the inner prefix's, and the worker keeps them
until their band closes (:mod:`.worker`). A left input ``L`` followed by others needs more: a tuple ``τ`` of the
inputs before ``L`` that no row of ``L`` matches becomes ``(τ, null)``, which the inputs after ``L`` extend, by
rows already stored and by rows still to come, exactly as Spark's next join extends the rows its left outer join
emits. Those partial tuples with a null are **entries**: an entry waits at *level* ``k`` (it binds the inputs
before ``k``) for rows of input ``k``:

- a row of ``k`` arriving with its key and every bound to the entry's non-null rows met extends it to level
  ``k + 1`` (at level ``n``: an output row);
- when the watermark proves no row of ``k`` can match any more (the entry's deadline, the interval join's left
  outer rule per bound to a non-null row, :func:`~.worker.outer_deadlines`), a left ``k`` pads an entry it never
  matched (``(entry, null)`` at level ``k + 1``) and an inner ``k`` drops it;
- an input ``k`` with a bound to an input that is null in the entry never matches it (SQL: a comparison with NULL
  is not true): padded (left) or dropped (inner) at once.

Tuples without a null are still the kernel's (MJoin: no intermediate state). The only such tuples kept are the
prefixes over ``0 .. L-1`` that no row of a left ``L`` has matched yet (level ``L``, no null), found as the
partial matches before the step that probes ``L`` (the probe order binds ``0 .. L-1`` first) and dropped as soon
as a row of ``L`` matches them. Rows are stored with an explicit end (:func:`retention`): the kernel's staged
eviction drops a row whose partner input has no row, which a null may stand for.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...vocabulary import metrics as M
from .._common.payload import KEPT

__all__ = ["LEVEL", "NULLS", "MATCHED", "nested_orders", "retention", "NestedLeft"]

LEVEL = "__cq_level"       # the entry waits for rows of this input (n: an output row)
NULLS = "__cq_nulls"       # bit i set: input i is null in the entry
MATCHED = "__cq_matched"   # a row of its level has matched it (a left level then never pads it)
EKEY = "__cq_ekey"         # the kernel's key of the entry's first row
EKEYNULL = "__cq_ekeynull"  # the first row's key is null: nothing ever matches the entry
DEADLINE = "__cq_deadline"  # the watermark (ms) from which no row of its level can match it
NEVER = np.iinfo(np.int64).max


def _pid(i: int) -> str:
    return f"__cq_id{i}"


def _ptime(i: int) -> str:
    return f"__cq_t{i}"


def _pcol(i: int, name: str) -> str:
    return f"__cq_o{i}_{name}"


def nested_orders(orders, hows) -> tuple[tuple[int, ...], ...]:
    """Each input's probe order with the inputs before every left input ``L`` bound before ``L`` (so that the
    partial matches before the step probing ``L`` are the prefixes it decides): the inputs in segments starting at
    each left input, segment by segment, the left input first in its segment, the others in the plan's order.
    ``hows``: per input, ``"inner"`` / ``"left"`` (input 0: ``"first"``).
    """
    lefts = [j for j, h in enumerate(hows) if h == "left"]

    def segment(j: int) -> int:
        return sum(1 for left in lefts if left <= j)

    return tuple(tuple(sorted(o, key=lambda j: (segment(j), j not in lefts, o.index(j)))) for o in orders)


def _floyd(n: int, bounds, members) -> np.ndarray:
    d = np.full((n, n), np.inf)
    for i in members:
        d[i][i] = 0.0
    for i, j, lo, up in bounds:
        if i in members and j in members:
            d[i][j] = min(d[i][j], up)
            d[j][i] = min(d[j][i], -lo)
    for k in members:
        d = np.minimum(d, d[:, [k]] + d[[k], :])
    return d


def retention(n: int, bounds, hows) -> tuple[int, ...]:
    """Per input, how long (µs past its time) a row is kept: while any tuple, with nulls or without, can still
    gain a row that meets it or an entry that it can extend can still be made. A tuple's non-null rows meet only
    the bounds among themselves, whose closure may reach further than the full one; an entry is made when the
    watermark passes a prefix's band (a bound's width past a row's time, plus the rule's rounding). So: the
    largest closure reach over the sets of inputs a tuple can have non-null, plus the widest bound, plus 2 ms.
    """
    widest = max(max(abs(lo), abs(up)) for _, _, lo, up in bounds)
    out = []
    for i in range(n):
        reach = 0.0
        for mask in range(1 << n):
            members = [m for m in range(n) if mask >> m & 1]
            if 0 not in members or i not in members:
                continue
            d = _floyd(n, bounds, members)
            finite = [d[i][m] for m in members if np.isfinite(d[i][m])]
            reach = max([reach] + finite)
        out.append(int(reach) + widest + 2000)
    return tuple(out)


class NestedLeft:
    """The entries of a join with a left input before the last (module docstring), for one shard and batch.

    ``config``: the worker's :class:`~.worker.MultiJoinConfig` (``hows`` per input).
    """

    def __init__(self, config, table: pa.Table | None = None):
        self.config = config
        self.schema = entry_schema(config)
        self.table = table if table is not None else self.schema.empty_table()
        #: per level k: the bounds (m, side, lower, upper) between k and an earlier input m (side: k's side)
        self.level_bounds = {k: [(i if j == k else j, 0 if j == k else 1, lo, up)
                                 for i, j, lo, up in config.bounds if k in (i, j) and min(i, j) < k]
                             for k in range(1, config.n)}
        self.out: list[pa.Table] = []

    # -- building entries

    def from_rows(self, sides, ids: np.ndarray, times: np.ndarray, keys: np.ndarray, level: int,
                   nulls: int = 0, keynull=None) -> pa.Table:
        """Entries of the rows ``ids`` (``-1``: null or not bound) of the inputs before ``level``."""
        config, m = self.config, len(ids)
        cols = {LEVEL: pa.array(np.full(m, level), pa.int64()), NULLS: pa.array(np.full(m, nulls), pa.int64()),
                MATCHED: pa.array(np.zeros(m, dtype=bool)), EKEY: pa.array(keys, pa.int64()),
                EKEYNULL: pa.array(np.zeros(m, dtype=bool) if keynull is None else keynull),
                DEADLINE: pa.array(np.full(m, NEVER), pa.int64())}
        kept = np.ones(m)
        for i in range(config.n):
            live = i < level and not nulls >> i & 1
            cols[_pid(i)] = pa.array(ids[:, i] if live else np.full(m, -1), pa.int64())
            cols[_ptime(i)] = pa.array(times[:, i] if live else np.zeros(m, dtype=np.int64), pa.int64())
            schema = config.input_schema(i)
            taken = sides[i].take(ids[:, i]) if live else None
            for c, f in enumerate(schema):
                cols[_pcol(i, f.name)] = taken.column(c) if live else pa.nulls(m, f.type)
            if config.kept and live:
                kept = kept * taken.column(KEPT).to_numpy()
        if config.kept:
            cols[KEPT] = pa.array(kept, pa.float64())
        return pa.Table.from_pydict(cols, schema=self.schema)

    def _extend(self, entries: pa.Table, sides, k: int, ids: np.ndarray, times: np.ndarray) -> pa.Table:
        """``entries`` (one per match) extended by the rows ``ids`` (times ``times``) of input ``k``."""
        m = entries.num_rows
        out = entries
        taken = sides[k].take(ids)
        for name, values in ((_pid(k), pa.array(ids, pa.int64())), (_ptime(k), pa.array(times, pa.int64())),
                             (LEVEL, pa.array(np.full(m, k + 1), pa.int64())),
                             (MATCHED, pa.array(np.zeros(m, dtype=bool))),
                             (DEADLINE, pa.array(np.full(m, NEVER), pa.int64()))):
            out = _set(out, name, values)
        for c, f in enumerate(self.config.input_schema(k)):
            out = _set(out, _pcol(k, f.name), taken.column(c))
        if self.config.kept:
            out = _set(out, KEPT, pa.array(out.column(KEPT).to_numpy() * taken.column(KEPT).to_numpy()))
        return out

    def _pad(self, entries: pa.Table) -> pa.Table:
        """``entries`` with their level's input null, one level on."""
        level = entries.column(LEVEL).to_numpy()
        return _set(_set(_set(entries, NULLS, pa.array(entries.column(NULLS).to_numpy() | (1 << level), pa.int64())),
                         LEVEL, pa.array(level + 1, pa.int64())), MATCHED, pa.array(np.zeros(len(level), dtype=bool)))

    # -- the kernel's prefixes: tuples without a null waiting for a left input

    def wait_prefixes(self, sides, level: int, ids, times, keys) -> None:
        """Keep the prefixes ``ids`` (over the inputs before the left input ``level``) that its probe step did not
        extend: they wait for a row of ``level`` until their deadline.
        """
        if len(ids):
            self.settle(self.from_rows(sides, ids, times, keys, level), sides, None, probe=False)

    def matched_prefixes(self, level: int, ids: np.ndarray) -> None:
        """Drop the prefixes waiting for ``level`` without a null that rows of it now match (``ids``: the partial
        matches binding the inputs before ``level`` and ``level``).
        """
        t = self.table
        if not len(ids) or not t.num_rows:
            return
        cand = (t.column(LEVEL).to_numpy() == level) & (t.column(NULLS).to_numpy() == 0)
        if not cand.any():
            return
        cols = list(range(level))
        waiting = np.column_stack([t.column(_pid(i)).to_numpy() for i in cols])
        hit = cand & np.isin(_row_keys(waiting), _row_keys(ids[:, cols]))
        if hit.any():
            self.table = t.filter(pa.array(~hit))

    # -- rows arriving on input k meet the entries waiting for k

    def arrive(self, kernel, sides, k: int, keys, micros, ids) -> None:
        """Rows of input ``k`` (stored already) extend the entries with a null waiting for ``k``."""
        t = self.table
        if not t.num_rows or not len(keys):
            return
        wait = np.flatnonzero((t.column(LEVEL).to_numpy() == k) & (t.column(NULLS).to_numpy() != 0)
                              & ~t.column(EKEYNULL).to_numpy(zero_copy_only=False))
        if not len(wait):
            return
        ekeys = t.column(EKEY).to_numpy()[wait]
        order = np.argsort(keys, kind="stable")
        lo = np.searchsorted(keys[order], ekeys, "left")
        hi = np.searchsorted(keys[order], ekeys, "right")
        e_idx = np.repeat(wait, hi - lo)
        x_idx = order[np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)])] if len(e_idx) else e_idx
        if not len(e_idx):
            return
        ok = self._bands_hold(t, e_idx, k, micros[x_idx])
        e_idx, x_idx = e_idx[ok], x_idx[ok]
        if self.config.hashed and len(e_idx):
            ok = self._same_key(t.take(pa.array(e_idx)), sides[k].take(ids[x_idx]), k)
            e_idx, x_idx = e_idx[ok], x_idx[ok]
        if not len(e_idx):
            return
        matched = t.column(MATCHED).to_numpy(zero_copy_only=False).copy()
        matched[e_idx] = True
        self.table = _set(t, MATCHED, pa.array(matched))
        self.settle(self._extend(t.take(pa.array(e_idx)), sides, k, ids[x_idx], micros[x_idx]), sides, kernel)

    def _bands_hold(self, t: pa.Table, e_idx, k: int, tk) -> np.ndarray:
        """Per (entry, row of ``k``): every bound between ``k`` and the entry's earlier inputs holds (entries with
        a null there never get here).
        """
        ok = np.ones(len(e_idx), dtype=bool)
        for m, side, lo, up in self.level_bounds[k]:
            tm = t.column(_ptime(m)).to_numpy()[e_idx]
            d = tk - tm if side == 0 else tm - tk   # side 0: bound (m, k): t_k - t_m in [lo, up]
            ok &= (d >= lo) & (d <= up)
        return ok

    def _same_key(self, entries: pa.Table, rows: pa.Table, k: int) -> np.ndarray:
        from .worker import _same_key

        config = self.config
        first = entries.column(_pcol(0, config.input_schema(0).field(config.key_pos[0]).name))
        return _same_key(first, rows.column(config.key_pos[k]))

    # -- settling new entries: probe the stored rows, wait, pad or drop

    def settle(self, entries: pa.Table, sides, kernel, *, probe: bool = True) -> None:
        """New ``entries`` (each at its level): level ``n`` is output; a level bound to one of the entry's nulls
        pads (left) or drops (inner) it; otherwise the level's stored rows extend it (``probe``; entries made from
        the kernel's prefixes have probed already) and it waits until its deadline.
        """
        config, n = self.config, self.config.n
        while entries.num_rows:
            level = entries.column(LEVEL).to_numpy()
            done = level == n
            if done.any():
                self.out.append(entries.filter(pa.array(done)))
                entries = entries.filter(pa.array(~done))
                level = level[~done]
            if not entries.num_rows:
                return
            nxt = []
            for k in np.unique(level):
                part = entries.filter(pa.array(level == k))
                nulls = part.column(NULLS).to_numpy()
                blocked = np.zeros(part.num_rows, dtype=bool)
                for m, *_ in self.level_bounds[k]:
                    blocked |= (nulls >> m & 1).astype(bool)
                if blocked.any():
                    gone = part.filter(pa.array(blocked))
                    if config.hows[k] == "left":
                        nxt.append(self._pad(gone))
                    part = part.filter(pa.array(~blocked))
                if not part.num_rows:
                    continue
                part = _set(part, DEADLINE, pa.array(self._deadline(part, int(k)), pa.int64()))
                if probe:
                    ext, matched = self._probe_stored(kernel, sides, part, int(k))
                    if ext is not None:
                        nxt.append(ext)
                    part = _set(part, MATCHED, pa.array(matched))
                self.table = pa.concat_tables([self.table, part]) if self.table.num_rows else part
            probe = True
            entries = pa.concat_tables(nxt) if nxt else self.schema.empty_table()

    def _deadline(self, part: pa.Table, k: int) -> np.ndarray:
        from .worker import outer_deadlines

        nulls = part.column(NULLS).to_numpy()
        out = np.full(part.num_rows, NEVER, dtype=np.int64)
        for m, side, lo, up in self.level_bounds[k]:
            at = outer_deadlines({m: part.column(_ptime(m)).to_numpy()}, [(m, side, lo, up)])
            out = np.where(nulls >> m & 1, out, np.minimum(out, at))
        return out

    def _probe_stored(self, kernel, sides, part: pa.Table, k: int):
        """The stored rows of input ``k`` that extend entries ``part`` (key and the bounds to their non-null
        rows): the extended entries, and per entry whether any did.
        """
        n = self.config.n
        matched = np.zeros(part.num_rows, dtype=bool)
        nulls = part.column(NULLS).to_numpy()
        keynull = part.column(EKEYNULL).to_numpy(zero_copy_only=False)
        outs = []
        for mask in np.unique(nulls):
            sel = np.flatnonzero((nulls == mask) & ~keynull)
            if not len(sel):
                continue
            members = [m for m in range(1, k) if not mask >> m & 1]
            order = members + [k] + [j for j in range(1, n) if j != k and j not in members]
            ids = np.column_stack([part.column(_pid(i)).to_numpy()[sel] for i in range(n)])
            times = np.column_stack([part.column(_ptime(i)).to_numpy()[sel] for i in range(n)])
            # the kernel's step checks only the bounds to inputs bound before the step (the non-null ones)
            key, pid, t = kernel.probe_step(0, order, len(members), part.column(EKEY).to_numpy()[sel], ids, times)
            if not len(key):
                continue
            rows = pid[:, k]
            # which entry each match came from: probe_step keeps the entries' order, a run per entry
            src = sel[_runs(ids, pid, k)]
            if self.config.hashed:
                ok = self._same_key(part.take(pa.array(src)), sides[k].take(rows), k)
                src, rows, t = src[ok], rows[ok], t[ok]
            if len(src):
                matched[src] = True
                outs.append(self._extend(part.take(pa.array(src)), sides, k, rows, t[:, k]))
        return (pa.concat_tables(outs) if outs else None), matched

    # -- the watermark: entries whose level can no longer match them

    def due(self, sides, kernel, wm_ms) -> None:
        """Pad (left level, never matched) or drop the entries whose deadline the watermark ``wm_ms`` has passed
        (all of them in a batch join, ``wm_ms`` None), settling the padded ones, until none is due. Called after
        every input of the batch: a row of the batch that matches an entry comes first.
        """
        while self.table.num_rows:
            t = self.table
            due = np.ones(t.num_rows, dtype=bool) if wm_ms is None else t.column(DEADLINE).to_numpy() <= wm_ms
            if not due.any():
                return
            gone = t.filter(pa.array(due))
            self.table = t.filter(pa.array(~due))
            level = gone.column(LEVEL).to_numpy()
            left = np.array([self.config.hows[k] == "left" for k in level], dtype=bool)
            pad = left & ~gone.column(MATCHED).to_numpy(zero_copy_only=False)
            if pad.any():
                self.settle(self._pad(gone.filter(pa.array(pad))), sides, kernel)

    def output(self, counters: dict) -> pa.Table | None:
        """The output rows made in this batch (all have a null: ``padded_rows``)."""
        if not self.out:
            return None
        rows = pa.concat_tables(self.out)
        self.out = []
        counters[M.PADDED_ROWS] += rows.num_rows
        config = self.config
        cols = [rows.column(_pcol(i, config.input_schema(i).field(p).name)) for i, p in config.out]
        if config.kept:
            cols.append(rows.column(KEPT))
        return pa.Table.from_arrays(cols, names=config.out_arrow.names)

    def min_deadline_us(self) -> int | None:
        """The earliest deadline of the entries (µs), for the shard's timeout; None without one."""
        if not self.table.num_rows:
            return None
        first = int(pc.min(self.table.column(DEADLINE)).as_py())
        return None if first == NEVER else first * 1000

    def renumber(self, i: int, old: np.ndarray, rows: int) -> None:
        """Input ``i``'s payload ids after the payload keeps the rows ``old`` (gone rows: -1)."""
        if not self.table.num_rows:
            return
        new = np.full(rows + 1, -1, dtype=np.int64)
        new[old] = np.arange(len(old), dtype=np.int64)
        self.table = _set(self.table, _pid(i), pa.array(new[self.table.column(_pid(i)).to_numpy()], pa.int64()))


def entry_schema(config) -> pa.Schema:
    """An entry: its level, nulls, matched flag, key, deadline; per input its payload id, time and columns; with
    ``kept`` the product of its rows' kept fractions.
    """
    fields = [pa.field(LEVEL, pa.int64()), pa.field(NULLS, pa.int64()), pa.field(MATCHED, pa.bool_()),
              pa.field(EKEY, pa.int64()), pa.field(EKEYNULL, pa.bool_()), pa.field(DEADLINE, pa.int64())]
    for i in range(config.n):
        fields += [pa.field(_pid(i), pa.int64()), pa.field(_ptime(i), pa.int64())]
        fields += [pa.field(_pcol(i, f.name), f.type) for f in config.input_schema(i)]
    if config.kept:
        fields.append(pa.field(KEPT, pa.float64()))
    return pa.schema(fields)


def _set(t: pa.Table, name: str, values) -> pa.Table:
    i = t.schema.get_field_index(name)
    return t.set_column(i, t.schema.field(i), values)


def _row_keys(ids: np.ndarray) -> np.ndarray:
    sub = np.ascontiguousarray(ids, dtype=np.int64)
    return sub.view(np.dtype((np.void, 8 * sub.shape[1]))).ravel()


def _runs(ids: np.ndarray, pid: np.ndarray, k: int) -> np.ndarray:
    """For each extended partial match ``pid`` (in the order probe_step emits them: the inputs' rows in order,
    each extended by its matches), the index of the input row ``ids`` it extends.
    """
    cols = [c for c in range(ids.shape[1]) if c != k]
    src = _row_keys(ids[:, cols])
    got = _row_keys(pid[:, cols])
    out = np.empty(len(got), dtype=np.int64)
    r = 0
    for g in range(len(got)):
        while src[r] != got[g]:
            r += 1
        out[g] = r
    return out
