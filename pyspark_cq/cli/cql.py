"""``pyspark-cq run`` and ``pyspark-cq explain``: CQL queries from a file, over file sources (docs/cql.md)."""
from __future__ import annotations

import os
import sys
import time

from ._common import add_master_argument

__all__ = ["add_run_arguments", "add_explain_arguments", "add_source_arguments", "source_paths", "source_columns",
           "check_query", "open_streams", "split_queries", "named_queries",
           "run", "explain_command"]

FORMATS = ("parquet", "json", "csv")


def _pairs(values, flag: str) -> dict:
    out = {}
    for v in values or []:
        if "=" not in v or not v.split("=", 1)[0] or not v.split("=", 1)[1]:
            raise SystemExit(f"pyspark-cq: {flag} expects NAME=VALUE, got {v!r}")
        k, val = v.split("=", 1)
        if k in out:
            raise SystemExit(f"pyspark-cq: {flag} {k} given twice")
        out[k] = val
    return out


def _format(path: str, given: str | None) -> str:
    if given:
        return given
    for _, _, files in os.walk(path):
        for f in sorted(files):
            ext = f.rsplit(".", 1)[-1].lower()
            if ext in FORMATS:
                return ext
            if ext == "jsonl":
                return "json"
    raise SystemExit(f"pyspark-cq: cannot tell the format of the files in {path} (give --format)")


def _read_query(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise SystemExit(f"pyspark-cq: cannot read the query file {path}: {exc.strerror}") from None


def _add_file_arguments(p, *, required: bool, why: str = "") -> None:
    p.add_argument("--source", action="append", metavar="NAME=DIR", required=required,
                   help=f"a stream: a directory of parquet / json / csv files (repeat per stream){why}")
    p.add_argument("--format", choices=FORMATS, help="input file format (default: from the file names)")
    p.add_argument("--schema", action="append", metavar="NAME=DDL",
                   help="a stream's schema, e.g. clicks='ts timestamp, user string' (default: inferred)")


def add_source_arguments(p, *, required: bool = True) -> None:
    """The file-stream arguments of ``pyspark-cq run`` and ``pyspark-cq console --cql``."""
    _add_file_arguments(p, required=required)
    p.add_argument("--watermark", default="10 seconds",
                   help="watermark delay on every stream's timestamp (default 10 seconds)")
    p.add_argument("--max-files", type=int, default=1, help="files per micro-batch (default 1)")


def source_paths(args) -> tuple[dict, dict]:
    """``--source`` and ``--schema`` as ``{name: directory}``, ``{name: DDL}``, checked (SystemExit naming the
    flag otherwise).
    """
    sources = _pairs(args.source, "--source")
    schemas = _pairs(args.schema, "--schema")
    for name in schemas:
        if name not in sources:
            raise SystemExit(f"pyspark-cq: --schema {name} names no --source")
    for name, path in sources.items():
        if not os.path.isdir(path):
            raise SystemExit(f"pyspark-cq: --source {name}: {path} is not a directory")
    return sources, schemas


def _ddl_names(ddl: str) -> list[str]:
    """The column names of a DDL schema such as ``ts timestamp, tags array<string>, `a b` int``."""
    names, depth, part = [], 0, ""
    for ch in ddl + ",":
        depth += (ch in "<(") - (ch in ">)")
        if ch == "," and depth == 0:
            part = part.strip()
            if part:
                names.append(part[1:part.index("`", 1)] if part.startswith("`")
                             else part.replace(":", " ").split()[0])
            part = ""
        else:
            part += ch
    return names


def source_columns(sources: dict, schemas: dict, fmt: str | None) -> dict | None:
    """Each source's column names without Spark: ``--schema``'s, else the files' (pyarrow, Spark's formats
    and ignored ``_``/``.`` files); None when some directory's files cannot be read so.
    """
    import pyarrow.dataset as ds

    columns = {}
    for name, path in sources.items():
        if name in schemas:
            columns[name] = _ddl_names(schemas[name])
            continue
        try:
            columns[name] = ds.dataset(path, format=_format(path, fmt)).schema.names
        except (OSError, ValueError, TypeError, ImportError):   # pyarrow.ArrowInvalid is a ValueError
            return None
    return columns


def check_query(statement, sources: dict, schemas: dict, args) -> None:
    """Analyze a query against the ``--source`` names and their files' columns before Spark starts (a
    misspelled name, an unsupported construct); raises CQLCompileError.
    """
    from ..lang.compiler import analyze

    columns = source_columns(sources, schemas, args.format)
    if columns is not None:   # the names as compile_cql matches them: exactly, else one case-insensitively
        for s in statement.query.sources:
            found = [k for k in columns if k.lower() == getattr(s, "name", "").lower()]
            if getattr(s, "name", None) not in columns and len(found) == 1:
                columns[s.name] = columns[found[0]]
    a = analyze(statement, args.name, columns, streams=list(columns or sources))
    if a.output_mode != "append" and args.sink != "console":   # Spark's file sink writes append mode only
        from ..lang.errors import CQLCompileError

        raise CQLCompileError(f"OUTPUT_MODE {a.output_mode.upper()} with a --sink directory", "the parquet file sink "
                              "writes append mode only: write to --sink console, or drop the clause",
                              statement.qos_item("OUTPUT_MODE"))


def open_streams(spark, sources: dict, schemas: dict, args) -> dict:
    """One streaming DataFrame per source directory (``maxFilesPerTrigger``, a watermark on its one
    timestamp column).
    """
    frames = {}
    for name, path in sources.items():
        fmt = _format(path, args.format)
        options = {"inferTimestamp": "true"} if fmt == "json" else ({"inferSchema": "true", "header": "true"}
                                                                   if fmt == "csv" else {})
        schema = schemas.get(name) or spark.read.format(fmt).options(**options).load(path).schema
        df = (spark.readStream.format(fmt).options(**options).schema(schema)
              .option("maxFilesPerTrigger", args.max_files).load(path))
        stamps = [f.name for f in df.schema.fields if f.dataType.typeName() in ("timestamp", "timestamp_ntz")]
        if len(stamps) == 1:
            # Spark's watermark needs TIMESTAMP (files written without a zone are read as TIMESTAMP_NTZ);
            # the session's zone is UTC (cq.spark), so the values stay the same instants
            df = df.withColumn(stamps[0], df[stamps[0]].cast("timestamp")).withWatermark(stamps[0], args.watermark)
        frames[name] = df
    return frames


def split_queries(text: str) -> list[str]:
    """The queries of a file: its text split at each ``;`` outside a quoted string or a ``--`` comment; blank
    pieces dropped.
    """
    out, cur, quote, i = [], [], None, 0
    while i < len(text):
        c = text[i]
        if quote:
            cur.append(c)
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
            cur.append(c)
        elif text.startswith("--", i):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            cur.append(text[i:end])
            i = end
            continue
        elif c == ";":
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    out.append("".join(cur))
    return [q.strip() for q in out if q.strip() and not all(line.strip().startswith("--") or not line.strip()
                                                           for line in q.splitlines())]


def named_queries(paths: list[str]) -> list[tuple[str, str, str]]:
    """``(name, text, file)`` of every query in ``paths``: a file's stem names its query, ``<stem>_<i>`` its
    i-th of several (1-based); SystemExit for a name used twice or a file without a query.
    """
    out = []
    for path in paths:
        queries = split_queries(_read_query(path))
        if not queries:
            raise SystemExit(f"pyspark-cq: the query file {path} holds no query")
        stem = os.path.splitext(os.path.basename(path))[0]
        for i, q in enumerate(queries, 1):
            out.append((stem if len(queries) == 1 else f"{stem}_{i}", q, path))
    names = [n for n, _, _ in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SystemExit(f"pyspark-cq: query name(s) {twice} used twice (a query is named after its file); "
                         f"rename the files")
    return out


def add_run_arguments(p) -> None:
    """Arguments of ``pyspark-cq run``."""
    p.add_argument("query", nargs="+", help="file(s) holding CQL queries: one query runs alone; several (files, or "
                                            "one file of ';'-separated queries) run as one query group, each "
                                            "into <sink>/<its name> (docs/groups.md)")
    add_source_arguments(p)
    p.add_argument("--sink", required=True, help="output directory (parquet files), or 'console'")
    p.add_argument("--checkpoint", help="checkpoint directory (default <sink>/_checkpoint)")
    p.add_argument("--name", default="q", help="query name (operator ids, metrics)")
    p.add_argument("--continuous", action="store_true",
                   help="keep running (trigger every PERIOD, else Spark's default) instead of processing the "
                        "files present and stopping")
    add_master_argument(p)


def add_explain_arguments(p) -> None:
    """Arguments of ``pyspark-cq explain``."""
    p.add_argument("query", help="file holding one CQL query")
    _add_file_arguments(p, required=False, why=", to resolve unqualified columns (read with pyarrow, no Spark)")
    p.add_argument("--name", default="q", help="query name (operator ids)")
    p.add_argument("--distance", type=float, default=1000.0,
                   help="mean distance d between a source's elements in µs for the PIPES estimate (default 1000)")


def explain_command(args) -> int:
    """Print the plan, the operators and the PIPES cost estimate of a query file."""
    from ..lang import CQLSyntaxError
    from ..lang.compiler import explain
    from ..lang.errors import CQLCompileError

    text = _read_query(args.query)
    columns = None
    if args.source:
        sources, schemas = source_paths(args)
        columns = source_columns(sources, schemas, args.format)
        if columns is None:
            raise SystemExit("pyspark-cq: cannot read the columns of the --source files with pyarrow (give "
                             "--format, or --schema NAME=DDL)")
    try:
        print(explain(text, columns, name=args.name, distance=args.distance))
    except (CQLSyntaxError, CQLCompileError) as exc:
        print(f"{args.query}: {exc}", file=sys.stderr)
        return 2
    return 0


def run(args) -> int:
    """Compile query files and run them over file sources, printing progress per micro-batch: one query alone,
    several as one :class:`~pyspark_cq.QueryGroup`.
    """
    import pyspark_cq

    from ..lang import CQLSyntaxError, parse
    from ..lang.errors import CQLCompileError

    queries = named_queries(args.query)
    sources, schemas = source_paths(args)
    statements = []
    for name, text, path in queries:
        try:   # before Spark starts (half a minute): the queries' own errors need no session
            statement = parse(text)
            check_query(statement, sources, schemas, args)
        except (CQLSyntaxError, CQLCompileError) as exc:
            print(f"{path}{'' if len(queries) == 1 else f' ({name})'}: {exc}", file=sys.stderr)
            return 2
        statements.append((name, statement, path))
    if len(statements) > 1 and args.sink == "console":
        raise SystemExit("pyspark-cq: several queries run as a group and write <sink>/<name>: give --sink DIR")
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()  # called in-process (tests, notebooks): keep their session as is
    own = active is None
    spark = pyspark_cq.spark(args.master, f"pyspark-cq-{args.name}") if own else active
    try:
        if own:
            spark.sparkContext.setLogLevel("ERROR")
        if len(statements) == 1:
            return _run(spark, statements[0][1], sources, schemas, args)
        return _run_group(spark, statements, sources, schemas, args)
    finally:   # also after an error: a session left to the interpreter's exit prints Spark's stack traces
        if own:
            spark.stop()


def _run_group(spark, statements, sources: dict, schemas: dict, args) -> int:
    """Several queries as one query group, each into ``<sink>/<name>``; progress per micro-batch."""
    import pyspark_cq

    from ..lang import CQLSyntaxError
    from ..lang.errors import CQLCompileError

    frames = open_streams(spark, sources, schemas, args)
    checkpoint = args.checkpoint or os.path.join(args.sink, "_checkpoint")
    group = pyspark_cq.QueryGroup(spark, frames, checkpoint, name=args.name)
    for name, statement, path in statements:
        try:
            group.add(name, statement, sink=os.path.join(args.sink, name))
        except (CQLSyntaxError, CQLCompileError, ValueError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            return 2
    for name, info in group.queries.items():
        print(f"{name}: {info['mode']}" + (f" ({info['why']})" if info["why"] else "") + f" -> {info['sink']}",
              flush=True)
    query = group.start(trigger=None if args.continuous else {"availableNow": True})
    batches, delivered = 0, {}

    def on_batch(p):
        nonlocal batches, delivered
        batches += 1
        rows = {n: q["rows"] for n, q in group.queries.items()}
        new = {n: r - delivered.get(n, 0) for n, r in rows.items()}
        delivered = rows
        print(f"batch {p.batchId}: read {p.numInputRows} rows, written "
              + ", ".join(f"{n} {v}" for n, v in new.items()) + f", {p.batchDuration} ms", flush=True)

    if not _follow(query, on_batch):
        return 1
    rows = {n: q["rows"] for n, q in group.queries.items()}
    print(f"done: {batches} batches, written {sum(rows.values())} rows ("
          + ", ".join(f"{n} {v}" for n, v in rows.items()) + f") to {args.sink}/<query>", flush=True)
    return 0


#: the observed metrics ``run`` adds: rows read per source (``<prefix><source>``) and rows given to the sink
READ_METRIC, WRITTEN_METRIC = "cq_run_read_", "cq_run_written"


def _count(progress, name: str) -> int:
    values = _read_metrics(progress, name)
    return values["rows"] if values else 0


def _run(spark, statement, sources: dict, schemas: dict, args) -> int:
    from pyspark.sql import functions as F

    from ..lang import CQLSyntaxError
    from ..lang.compiler import compile_cql
    from ..lang.errors import CQLCompileError

    # Rows read and written are counted here: Spark's numInputRows gave fewer rows than the files held for a
    # query with a WHERE, and an operator's output_rows is not what reaches the sink (issue 41)
    frames = {name: df.observe(READ_METRIC + name, F.count(F.lit(1)).alias("rows"))
              for name, df in open_streams(spark, sources, schemas, args).items()}
    try:
        compiled = compile_cql(spark, statement, frames, name=args.name)
    except (CQLSyntaxError, CQLCompileError) as exc:
        print(f"{args.query[0]}: {exc}", file=sys.stderr)
        return 2
    print(compiled.explain(), flush=True)
    checkpoint = args.checkpoint or (os.path.join(args.sink, "_checkpoint") if args.sink != "console"
                                     else os.path.join(os.getcwd(), f".pyspark-cq-{args.name}-checkpoint"))
    out = compiled.dataframe.observe(WRITTEN_METRIC, F.count(F.lit(1)).alias("rows"))
    writer = out.writeStream.outputMode(compiled.output_mode).option("checkpointLocation", checkpoint)
    writer = writer.queryName(args.name)
    writer = writer.format("console") if args.sink == "console" else writer.format("parquet").option("path", args.sink)
    period = compiled.analysis.options.get("period")
    if not args.continuous:
        writer = writer.trigger(availableNow=True)
    elif period:
        writer = writer.trigger(processingTime=f"{period / 1000:g} milliseconds")
    query = writer.start()
    read = dict.fromkeys(frames, 0)
    totals = {"batches": 0, "written": 0}
    operators = [op for op, _, _ in compiled.operators if op]

    def on_batch(p):
        totals["batches"] += 1
        counts = {name: _count(p, READ_METRIC + name) for name in frames}
        written = _count(p, WRITTEN_METRIC)
        for name, n in counts.items():
            read[name] += n
        totals["written"] += written
        line = f"batch {p.batchId}: read {_per_source(counts)}, written {written}, {p.batchDuration} ms"
        for op in operators:
            m = _read_metrics(p, op)
            if m:
                line += f"; {op}: " + ", ".join(f"{k} {v}" for k, v in m.items())
        print(line, flush=True)

    if not _follow(query, on_batch):
        return 1
    print(f"done: {totals['batches']} batches, read {_per_source(read)}, written {totals['written']} rows "
          f"(to {args.sink})", flush=True)
    return 0


def _follow(query, on_batch) -> bool:
    """Call ``on_batch(progress)`` once per new micro-batch until ``query`` ends (Ctrl-C stops it).

    Returns
    -------
    bool
        False, with the reason on stderr, when the query failed.
    """
    seen = -1
    try:
        while True:
            for p in query.recentProgress:
                if p.batchId > seen:
                    seen = p.batchId
                    on_batch(p)
            if not query.isActive:
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        query.stop()
    if query.exception() is not None:
        print(f"query failed: {query.exception()}", file=sys.stderr)
        return False
    return True


def _per_source(counts: dict) -> str:
    """``12 rows`` for one source, ``12 rows (A 5, B 7)`` for several."""
    total = f"{sum(counts.values())} rows"
    return total if len(counts) == 1 else f"{total} ({', '.join(f'{k} {v}' for k, v in counts.items())})"


def _read_metrics(progress, name: str):
    import pyspark_cq

    return pyspark_cq.read_metrics(progress, name)
