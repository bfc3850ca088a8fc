"""The FAIR scheduler pools of ``pyspark_cq.spark(..., edf=True)``: their allocation file and a check that a
session runs them (what the pools are for: :mod:`pyspark_cq.runtime.pools`).
"""
from __future__ import annotations

import os
import tempfile

__all__ = ["URGENT_POOL", "PERIODIC_POOL", "allocation_file", "has_pools"]

URGENT_POOL = "pyspark_cq_urgent"
PERIODIC_POOL = "pyspark_cq_periodic"

#: Above the cores of any cluster, so that the urgent pool is always needy (FAIR scheduler minShare).
_URGENT_MIN_SHARE = 1_000_000

_XML = f"""<?xml version="1.0"?>
<!-- pyspark-cq: deadline order of periodic queries (pyspark_cq.runtime.pools) -->
<allocations>
  <pool name="{URGENT_POOL}">
    <schedulingMode>FIFO</schedulingMode>
    <weight>1000</weight>
    <minShare>{_URGENT_MIN_SHARE}</minShare>
  </pool>
  <pool name="{PERIODIC_POOL}">
    <schedulingMode>FAIR</schedulingMode>
    <weight>1</weight>
    <minShare>0</minShare>
  </pool>
</allocations>
"""


def allocation_file(directory: str | None = None) -> str:
    """Write the FAIR scheduler allocation file of pyspark-cq's two pools and return its path."""
    directory = directory or tempfile.mkdtemp(prefix="pyspark-cq-pools-")
    path = os.path.join(directory, "fairscheduler.xml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(_XML)
    return path


def has_pools(spark) -> bool:
    """Whether ``spark`` runs the FAIR scheduler with pyspark-cq's pools (a classic session started with
    ``pyspark_cq.spark(..., edf=True)``); False for Spark Connect, which has no SparkContext here.
    """
    try:
        sc = spark.sparkContext
        if sc.getConf().get("spark.scheduler.mode", "FIFO").upper() != "FAIR":
            return False
        return all(sc._jsc.sc().getPoolForName(p).isDefined() for p in (URGENT_POOL, PERIODIC_POOL))
    except Exception:
        return False
