"""A streaming checkpoint that never committed a batch: the unfinished files a killed first start leaves.

Spark 4 (``spark.sql.streaming.verifyCheckpointDirectoryEmptyOnStart``, on by default) refuses to run batch 0
of a query whose checkpoint's ``offsets/``, ``commits/`` or ``state/`` holds any file, with
``[STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY]``. Spark writes each log entry to a hidden temporary
(``offsets/.0.<uuid>.tmp``) and renames it; a query killed during that first write leaves the temporary, and
its checkpoint can then never start again, although nothing in it was committed. Once ``offsets/0`` exists the
check does not apply (a restart runs the batch again and ignores temporaries), so only that window matters.
"""
from __future__ import annotations

import os

#: the checkpoint's directories Spark requires empty before batch 0
CHECKED = ("offsets", "commits", "state")


def _temporary(name: str) -> bool:
    """A hidden temporary of Hadoop's rename-on-commit writes, or its checksum (``..0.<uuid>.tmp.crc``)."""
    return name.startswith(".") and (name.endswith(".tmp") or name.endswith(".tmp.crc"))


def clear_unstarted_checkpoint(checkpoint) -> list[str]:
    """Remove the unfinished files of a checkpoint whose query never committed a batch, so that it can start.

    Only a checkpoint with no committed offset (no ``offsets/<n>`` file) is touched, and only hidden
    temporaries (``.<name>.tmp`` and their ``.crc``) under ``offsets/``, ``commits/`` and ``state/``: nothing a
    run committed is ever removed. Any other file there is left for Spark to refuse, as it is not ours to judge.
    Call it before ``start()`` on a checkpoint whose first run may have been killed; a query group does
    (:meth:`pyspark_cq.QueryGroup.start`).

    Parameters
    ----------
    checkpoint : str or os.PathLike
        The query's ``checkpointLocation``, a local directory (``file:`` URIs accepted). A directory that does
        not exist yet is fine (nothing to do).

    Returns
    -------
    list of str
        The removed files' paths (empty when the checkpoint has a committed batch or no leftovers).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> ck = pathlib.Path(tempfile.mkdtemp())
    >>> (ck / "offsets").mkdir(); _ = (ck / "offsets" / ".0.8f1c.tmp").write_text("v1")
    >>> [pathlib.Path(p).name for p in clear_unstarted_checkpoint(ck)]
    ['.0.8f1c.tmp']
    """
    if isinstance(checkpoint, os.PathLike):
        checkpoint = os.fspath(checkpoint)
    if not isinstance(checkpoint, str) or not checkpoint:
        raise TypeError(f"checkpoint must be a local directory path (str or os.PathLike), got {checkpoint!r}")
    if checkpoint.startswith("file:"):
        checkpoint = checkpoint[len("file:"):]
        checkpoint = "/" + checkpoint.lstrip("/")
    elif "://" in checkpoint:
        raise ValueError(f"checkpoint must be a local directory (a path or a file: URI), got {checkpoint!r}")
    offsets = os.path.join(checkpoint, "offsets")
    if os.path.isdir(offsets) and any(name.isdigit() for name in os.listdir(offsets)):
        return []                      # a committed batch: Spark restarts from it and ignores temporaries
    removed = []
    for sub in CHECKED:
        for root, _, files in os.walk(os.path.join(checkpoint, sub)):
            for name in files:
                if _temporary(name):
                    path = os.path.join(root, name)
                    os.remove(path)
                    removed.append(path)
    return sorted(removed)
