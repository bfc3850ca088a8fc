"""The generated packet stream of ``pyspark-cq demo``: requests and responses with a burst.

A Spark Python streaming data source
(``spark.readStream.format("cq_demo_packets").options(**profile.options(clock_path))``) whose rows are a
deterministic function of time, so that every query reading it sees the same stream and the demo can
count what it injected:

- **Requests** arrive at a rate that follows a :class:`BurstProfile`: ``quiet`` requests/s, ``burst``
  requests/s between two instants, quiet again afterwards. Request ``j`` (an integer index, the flow id)
  arrives at ``T(j)``, the instant where the cumulative count of the profile reaches ``j``.
- **Responses**: flow ``j`` is answered at ``T(j) + delay(j)``, the delay exponential with a mean of
  ``mean_delay`` seconds (capped at ``max_delay``), so an interval join ``response.ts ∈
  [request.ts − 1 s, request.ts + upper]`` finds the response of a share ``1 − exp(−upper/mean)`` of them.
- Every 1009th request has a null time (a broken clock: *malformed*, its response is not sent), every
  997th request is stamped 60 seconds in the past (a skewed clock: *late* once a watermark exists).

The progress reported by Spark for this source is its real rate, which is what the runtime's statistics
(and so the PIPES resource manager, via the distance d = 1/λ) see. Offsets are milliseconds since the
epoch: a micro-batch reads the rows whose arrival time is in ``[start, end)``. The burst is scheduled
through a small JSON file (:func:`write_clock`) that the source reads on the driver at every micro-batch, so
the demo can start it once Spark is warm.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass

import numpy as np

__all__ = ["BurstProfile", "generate", "injected", "delays", "write_clock", "read_clock", "read_end", "PacketSource",
           "SOURCE_NAME", "MALFORMED_EVERY", "SKEWED_EVERY", "SKEW_SECONDS"]

SOURCE_NAME = "cq_demo_packets"
MALFORMED_EVERY, MALFORMED_AT = 1009, 7
SKEWED_EVERY, SKEWED_AT = 997, 3
SKEW_SECONDS = 60.0
_SCHEMA = "kind string, flow long, host int, bytes int, ts timestamp"
_FAR = 10.0 ** 7  # seconds: knots this far out extend the profile at the quiet rate


@dataclass(frozen=True)
class BurstProfile:
    """Request rate over time: ``quiet``/s, ``burst``/s in ``[burst_start, burst_end)``, then quiet.

    Times are epoch seconds; ``burst_start = inf`` means no burst (yet). The cumulative number of requests
    is ``C(t) = quiet·t + (burst − quiet)·clip(t − burst_start, 0, burst_end − burst_start)``; request ``j``
    arrives when ``C`` reaches ``j``. Setting the burst later (the data source reads it from its clock file)
    changes nothing before ``burst_start``, so rows already read stay the same.
    """

    quiet: float
    burst: float
    burst_start: float = math.inf
    burst_end: float = math.inf
    hosts: int = 50
    mean_delay: float = 4.0
    max_delay: float = 40.0

    def __post_init__(self):
        for name in ("quiet", "burst", "mean_delay", "max_delay"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not self.burst_start <= self.burst_end:
            raise ValueError(f"need burst_start <= burst_end, got {self.burst_start}, {self.burst_end}")
        if not (isinstance(self.hosts, int) and self.hosts > 0):
            raise ValueError(f"hosts must be a positive int, got {self.hosts!r}")

    def with_burst(self, start: float, end: float) -> BurstProfile:
        """A copy of this profile with the burst in ``[start, end)`` (epoch seconds)."""
        return dataclasses.replace(self, burst_start=float(start), burst_end=float(end))

    def count(self, t) -> np.ndarray:
        """Cumulative number of requests at epoch seconds ``t`` (vectorised)."""
        t = np.asarray(t, dtype=np.float64)
        if not math.isfinite(self.burst_start):
            return self.quiet * t
        return self.quiet * t + (self.burst - self.quiet) * np.clip(t - self.burst_start, 0.0,
                                                                     self.burst_end - self.burst_start)

    def arrival(self, j) -> np.ndarray:
        """Arrival time (epoch seconds) of request ``j`` (vectorised inverse of :meth:`count`)."""
        j = np.asarray(j, dtype=np.float64)
        if not math.isfinite(self.burst_start):
            return j / self.quiet
        c_start = self.quiet * self.burst_start
        c_end = c_start + self.burst * (self.burst_end - self.burst_start)
        return np.where(j < c_start, j / self.quiet,
                        np.where(j < c_end, self.burst_start + (j - c_start) / self.burst,
                                 self.burst_end + (j - c_end) / self.quiet))

    def rate_at(self, t) -> np.ndarray:
        """Requests per second at epoch seconds ``t`` (vectorised)."""
        t = np.asarray(t, dtype=np.float64)
        return np.where((t >= self.burst_start) & (t < self.burst_end), self.burst, self.quiet)

    def options(self, clock: str) -> dict[str, str]:
        """The data source options for this profile; the burst is read from the JSON file ``clock``
        (``{"burst_start": …, "burst_end": …}``, written with :func:`write_clock`) at every micro-batch.
        """
        out = {k: repr(getattr(self, k)) for k in ("quiet", "burst", "hosts", "mean_delay", "max_delay")}
        out["clock"] = str(clock)
        return out

    @classmethod
    def from_options(cls, options) -> BurstProfile:
        """Inverse of :meth:`options` (without the burst)."""
        kw = {k: float(options[k]) for k in ("quiet", "burst", "mean_delay", "max_delay")}
        return cls(hosts=int(options["hosts"]), **kw)


def write_clock(path, burst_start: float, burst_end: float, end: float | None = None) -> None:
    """Atomically write the burst's start and end (epoch seconds) for the data source to read; with ``end``
    (epoch seconds) the stream ends there: no packet arrives after it (:func:`read_end`).
    """
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"burst_start": burst_start, "burst_end": burst_end, **({} if end is None else {"end": end})}, f)
    os.replace(tmp, path)


def read_end(path) -> float:
    """The stream's end written by :func:`write_clock` (epoch seconds), or ``inf`` if none."""
    try:
        with open(path) as f:
            return float(json.load(f).get("end", math.inf))
    except (OSError, ValueError, AttributeError):
        return math.inf


def read_clock(path) -> tuple[float, float]:
    """The burst written by :func:`write_clock`, or ``(inf, inf)`` if none yet."""
    try:
        with open(path) as f:
            doc = json.load(f)
        return float(doc["burst_start"]), float(doc["burst_end"])
    except (OSError, ValueError, KeyError):
        return math.inf, math.inf


def _mix(x: np.ndarray, salt: int) -> np.ndarray:
    """A deterministic 64-bit hash of int64 values (splitmix64 finaliser)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64((salt * 0x9E3779B97F4A7C15) % (1 << 64))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _uniform(j: np.ndarray, salt: int) -> np.ndarray:
    return (_mix(j, salt) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def delays(profile: BurstProfile, j: np.ndarray) -> np.ndarray:
    """Response delay (seconds) of flows ``j``."""
    return np.minimum(-np.log1p(-_uniform(j, 1)) * profile.mean_delay, profile.max_delay)


def generate(profile: BurstProfile, start_ms: int, end_ms: int) -> dict[str, np.ndarray]:
    """The rows arriving in ``[start_ms, end_ms)`` (epoch milliseconds), as numpy columns.

    Columns: ``kind`` (0 request, 1 response), ``flow``, ``host``, ``bytes``, ``ts_us`` (event time in µs,
    ``valid`` False for a null time).
    """
    s, e = start_ms / 1000.0, end_ms / 1000.0
    if e <= s:
        return {k: np.zeros(0, dtype=np.int64) for k in ("kind", "flow", "host", "bytes", "ts_us")} | {
            "valid": np.zeros(0, dtype=bool)}
    j_req = np.arange(math.ceil(profile.count(s)), math.ceil(profile.count(e)), dtype=np.int64)
    t_req = profile.arrival(j_req)
    j_all = np.arange(math.ceil(profile.count(s - profile.max_delay)), math.ceil(profile.count(e)), dtype=np.int64)
    t_resp = profile.arrival(j_all) + delays(profile, j_all)
    answered = (t_resp >= s) & (t_resp < e) & (j_all % MALFORMED_EVERY != MALFORMED_AT)
    j_resp, t_resp = j_all[answered], t_resp[answered]
    event_req = np.where(j_req % SKEWED_EVERY == SKEWED_AT, t_req - SKEW_SECONDS, t_req)
    flow = np.concatenate([j_req, j_resp])
    times = np.concatenate([event_req, t_resp])
    order = np.argsort(np.concatenate([t_req, t_resp]), kind="stable")   # arrival order
    flow, times = flow[order], times[order]
    kind = np.concatenate([np.zeros(j_req.size, np.int64), np.ones(j_resp.size, np.int64)])[order]
    valid = ~((kind == 0) & (flow % MALFORMED_EVERY == MALFORMED_AT))
    host = (_mix(flow, 2) % np.uint64(profile.hosts)).astype(np.int64)
    size = np.where(kind == 0, 64 + (_mix(flow, 3) % np.uint64(1400)).astype(np.int64),
                    200 + (_mix(flow, 4) % np.uint64(60000)).astype(np.int64))
    ts_us = np.round(times * 1e6).astype(np.int64)
    return {"kind": kind, "flow": flow, "host": host, "bytes": size, "ts_us": ts_us, "valid": valid}


def injected(profile: BurstProfile, start_ms: int, end_ms: int) -> dict[str, int]:
    """Counts of what :func:`generate` produces in ``[start_ms, end_ms)``: rows, requests, responses,
    malformed (null time) and skewed (60 s in the past) requests.
    """
    g = generate(profile, start_ms, end_ms)
    req = g["kind"] == 0
    return {"rows": int(g["kind"].size), "requests": int(req.sum()), "responses": int((~req).sum()),
            "malformed": int((~g["valid"]).sum()),
            "skewed": int((req & (g["flow"] % SKEWED_EVERY == SKEWED_AT)).sum())}


def _record_batch(g: dict):
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array(np.where(g["kind"] == 0, "req", "resp")), pa.array(g["flow"]), pa.array(g["host"], pa.int32()),
         pa.array(g["bytes"], pa.int32()),
         pa.array(g["ts_us"], pa.timestamp("us", tz="UTC"), mask=~g["valid"])],
        names=["kind", "flow", "host", "bytes", "ts"])


try:  # the data source API (PySpark >= 4.0); the module stays importable without it
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
except ImportError:  # pragma: no cover
    DataSource = DataSourceStreamReader = InputPartition = object


class _Range(InputPartition):
    def __init__(self, start: int, end: int, burst: tuple[float, float]):
        self.start, self.end, self.burst = start, end, burst


class _Reader(DataSourceStreamReader):
    def __init__(self, options):
        self.profile = BurstProfile.from_options(options)
        self.clock = options["clock"]
        self.partitions_n = int(options.get("numPartitions", "2"))

    def initialOffset(self):
        return {"ms": int(time.time() * 1000)}

    def latestOffset(self):
        # the stream may have ended (write_clock's end): then no offset beyond it, and Spark goes idle
        return {"ms": int(min(time.time(), read_end(self.clock)) * 1000)}

    def partitions(self, start, end):
        s, e = int(start["ms"]), int(end["ms"])
        cuts = np.linspace(s, e, self.partitions_n + 1).astype(np.int64).tolist()
        burst = read_clock(self.clock)          # on the driver, once per micro-batch
        return [_Range(a, b, burst) for a, b in zip(cuts[:-1], cuts[1:])]

    def read(self, partition):
        g = generate(self.profile.with_burst(*partition.burst), partition.start, partition.end)
        if g["kind"].size:
            yield _record_batch(g)

    def commit(self, end):
        pass


class PacketSource(DataSource):
    """``spark.readStream.format("cq_demo_packets").options(**profile.options())``: see the module doc."""

    @classmethod
    def name(cls):
        """The format name Spark registers the source under."""
        return SOURCE_NAME

    def schema(self):
        """The packets' schema."""
        return _SCHEMA

    def streamReader(self, schema):
        """The reader of one streaming query."""
        return _Reader(self.options)
