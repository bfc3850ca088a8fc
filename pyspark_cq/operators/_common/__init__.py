"""What several operators share (private; no operator package imports another).

- :mod:`.metrics`: the per-batch report (``read_metrics``), packed output rows;
- :mod:`.shards`: the key shards of a state (murmur3 shard keys, the shard-count rules);
- :mod:`.shed`: load shedding by a hash of the row;
- :mod:`.state_bytes`: compressed state blobs and Arrow tables as bytes;
- :mod:`.chunks`: the worker-side chunk scheduler of the plan-switchable operators;
- :mod:`.codec`: exact value and key transport of the joins;
- :mod:`.payload`: the joins' payload tables, input tags and event-time timeout;
- :mod:`.arrow`: Arrow tables from the pandas frames of a stateful step;
- :mod:`.partitions`: the ``spark.sql.shuffle.partitions`` warning.
"""
