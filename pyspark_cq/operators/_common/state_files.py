"""Immutable state files beside Spark's state store (issue 39, the join's ``state_persistence="files"``).

A stateful operator that keeps only a small manifest in ``GroupState`` writes its snapshots and deltas here,
one directory per group under the operator's state directory. The rules that keep this exactly-once with
Spark's versioned state store:

* **Immutable, uniquely named.** A file is never rewritten: its name carries the group's *call index* (one
  per call that wrote the group's state, counting on across state removals) and the random version token of
  the write (:func:`.resident.new_token`), so a retried or zombie attempt never overwrites a file another
  attempt's manifest names.
* **Written before it is named.** :meth:`StateFiles.write` writes a hidden temporary file and renames it; the
  caller updates ``GroupState`` only afterwards. A state version Spark committed therefore names only files
  that exist, and a batch Spark re-runs from an older version finds the files of that version's manifest.
* **Orphans are harmless.** A failed attempt leaves files no committed manifest names; they are deleted by
  the garbage collection like any old file.
* **Garbage collection never deletes a file a retained version may name** (:func:`collectable`): Spark keeps
  ``spark.sql.streaming.minBatchesToRetain`` (R) state versions. A version written at call index ``c`` names
  a snapshot written at index ``b <= c`` (its *base*) and the deltas at indices ``b+1 .. c``, and each delta
  file's name carries its base. Along one line of versions the index grows by one per call, so the retained
  versions were written at indices ``>= now - R - 1`` (at most one call per batch; one more for an attempt
  that is itself rolled back), and every file at an index below both that cut and the bases of the delta
  files at or above it is unreachable. A line that starts above the directory's files (a new group, a group
  whose state Spark removed, a checkpoint from another layout: :meth:`StateFiles.next_index`) jumps over the
  indices of orphans and rolled-back attempts, so it carries the lowest index present when it started
  (``floor``), kept until it is ``R + 1`` calls old (then every version before it has left the retention).

Paths are plain local paths or URIs that :func:`pyarrow.fs.FileSystem.from_uri` understands (``file://``,
``hdfs://``, ``s3://``); local paths are what the tests run.
"""
from __future__ import annotations

import re

__all__ = ["StateFiles", "snapshot_name", "delta_name", "parse_name", "collectable"]

_NAME = re.compile(r"^\.?(?:(s)(\d{12})|(d)(\d{12})-(\d{12}))-([0-9a-f]{32})(?:\.tmp)?$")


def snapshot_name(index: int, token: bytes) -> str:
    """The file name of a snapshot written at call ``index`` under version ``token``."""
    return f"s{index:012d}-{token.hex()}"


def delta_name(index: int, base: int, token: bytes) -> str:
    """The file name of a delta written at call ``index`` on the snapshot of call ``base``."""
    return f"d{index:012d}-{base:012d}-{token.hex()}"


def parse_name(name: str) -> tuple[int, int] | None:
    """``(index, base)`` of a state file's name (a snapshot is its own base; hidden temporaries included);
    None for a name that is not a state file's.
    """
    m = _NAME.match(name)
    if m is None:
        return None
    if m.group(1):
        index = int(m.group(2))
        return index, index
    return int(m.group(4)), int(m.group(5))


def collectable(names, index: int, retain: int, start: int = 0, floor: int = 0) -> list[str]:
    """The names among ``names`` (one group's files) that no retained state version can name, given that the
    newest write is at call ``index`` of a line of versions that started at ``start`` when the lowest file
    index present was ``floor``, and Spark retains ``retain`` versions (see the module docstring).
    """
    parsed = [(n, parse_name(n)) for n in names]
    parsed = [(n, p) for n, p in parsed if p is not None]
    cut = index - retain - 1
    keep_from = min([cut] + [base for _, (i, base) in parsed if i >= cut])
    if index - start <= retain + 1:
        keep_from = min(keep_from, floor)
    return [n for n, (i, _) in parsed if i < keep_from]


class StateFiles:
    """One operator's state directory: a sub-directory per group holding immutable snapshot / delta files."""

    def __init__(self, root: str):
        from pyarrow import fs as pafs

        self.root = root
        self.fs, self.path = pafs.FileSystem.from_uri(root) if "://" in root else (pafs.LocalFileSystem(), root)
        self.path = self.path.rstrip("/")

    def group_dir(self, group) -> str:
        """The directory of a group (a tuple of ints: its shard; stable across runs)."""
        return f"{self.path}/g" + "_".join(str(int(g)) for g in group)

    def groups(self) -> list[tuple[int, ...]]:
        """The groups that have a directory (the inverse of :meth:`group_dir`)."""
        from pyarrow import fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        return [tuple(int(g) for g in info.base_name[1:].split("_")) for info in infos
                if info.type == pafs.FileType.Directory and info.base_name.startswith("g")]

    def names(self, group) -> list[str]:
        """The file names in the group's directory (none when it does not exist)."""
        from pyarrow import fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self.group_dir(group), allow_not_found=True))
        return [info.base_name for info in infos if info.type == pafs.FileType.File]

    def next_index(self, group) -> tuple[int, int]:
        """``(start, floor)``: the call index after every file of the group (0 for a new group) and the lowest
        index present (``start`` when none): a group whose state Spark removed, or restored from another
        layout, starts above any file a retained version may name and keeps those files for a while.
        """
        indices = [p[0] for p in map(parse_name, self.names(group)) if p is not None]
        start = max(indices, default=-1) + 1
        return start, min(indices, default=start)

    def write(self, group, name: str, data) -> int:
        """Write ``data`` as the group's file ``name``: hidden temporary first, then renamed (never
        overwritten: names are unique). Returns the bytes written.
        """
        directory = self.group_dir(group)
        self.fs.create_dir(directory, recursive=True)
        tmp, final = f"{directory}/.{name}.tmp", f"{directory}/{name}"
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        self.fs.move(tmp, final)
        return len(data)

    def read(self, group, name: str) -> bytes:
        """The bytes of the group's file ``name``; FileNotFoundError with what to check when it is missing."""
        path = f"{self.group_dir(group)}/{name}"
        try:
            with self.fs.open_input_stream(path) as f:
                return f.read()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"join state: the file {path!r}, named by the checkpoint's state, is missing from the state "
                f"directory {self.root!r}; state_dir must be the directory this checkpoint was written with, "
                f"and nothing but the operator may delete files in it") from None

    def collect(self, group, index: int, retain: int, start: int = 0, floor: int = 0) -> int:
        """Delete the group's files no retained version can name (:func:`collectable`); returns how many."""
        doomed = collectable(self.names(group), index, retain, start, floor)
        self.delete(group, doomed)
        return len(doomed)

    def delete(self, group, names) -> None:
        """Delete the group's files ``names`` (one another attempt deleted first is no error)."""
        directory = self.group_dir(group)
        for name in names:
            try:
                self.fs.delete_file(f"{directory}/{name}")
            except FileNotFoundError:   # another attempt deleted it first
                pass
