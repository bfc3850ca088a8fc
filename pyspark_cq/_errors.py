"""The pyspark-cq error inside a Spark exception raised by a Python worker.

An operator's worker refuses some things only when it runs: state restored from a checkpoint written with
another shard count or other key columns, a state format it does not know. Spark reports such an error as a
``StreamingQueryException`` (or a ``PythonException``) whose message is a page of Java and Python stack
traces, with the worker's own sentence at the very end of a Python traceback. :func:`explain_error` finds that
sentence.
"""

from __future__ import annotations

import re

__all__ = ["explain_error"]

_TRACEBACK = "Traceback (most recent call last):"
_OUR_FRAME = re.compile(r'File "[^"]*[/\\]pyspark_cq[/\\]')
# the exception line that ends a Python traceback (its first unindented line): "ValueError: ...",
# "pyarrow.lib.ArrowInvalid: ..."
_RAISED = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)(?:: (.*))?$")
_SQLSTATE = re.compile(r"(\s+SQLSTATE: \w+)+\s*$")    # Spark appends these to the worker's line


def explain_error(exc) -> str | None:
    r"""The error a pyspark-cq operator raised in a Spark worker, from the exception Spark reports.

    Parameters
    ----------
    exc : BaseException or str
        What ``query.awaitTermination()``, ``query.exception()``, ``collect()`` etc. raised or returned,
        or its text.

    Returns
    -------
    str or None
        ``"<ExceptionType>: <message>"`` of the last Python traceback in ``exc`` that passes through
        pyspark-cq's code, or None when ``exc`` holds none (the failure was not raised by pyspark-cq).

    Examples
    --------
    >>> text = ('[STREAM_FAILED] ... Traceback (most recent call last):\n'
    ...         '  File "/x/pyspark_cq/operators/_common/shards.py", line 119, in check_shard_count\n'
    ...         'ValueError: shards: this checkpoint was written with shards=4\n\tat org.apache.spark.Foo')
    >>> explain_error(text)
    'ValueError: shards: this checkpoint was written with shards=4'
    >>> explain_error("[STREAM_FAILED] a JVM error") is None
    True
    """
    if exc is None:
        raise TypeError("exc must be an exception or its text, got None")
    text = exc if isinstance(exc, str) else str(exc)
    for block in reversed(text.split(_TRACEBACK)[1:]):
        if not _OUR_FRAME.search(block):
            continue
        line = next((li for li in block.splitlines()[1:] if li.strip() and not li[0].isspace()), "")
        match = _RAISED.match(line)
        if match is not None:   # the message's first line: what follows may be Spark's report
            return f"{match.group(1)}: {_SQLSTATE.sub('', match.group(2) or '').strip()}"
    return None
