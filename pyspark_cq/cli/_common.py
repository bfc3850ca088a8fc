"""What several commands of ``pyspark-cq`` parse alike."""
from __future__ import annotations

#: ``--master``'s help in every command (``pyspark_cq.demo`` has the same text): one default everywhere,
#: :func:`pyspark_cq.session.default_master`
MASTER_HELP = "Spark master (default $SPARK_MASTER or local[*])"


def add_master_argument(p, help: str = MASTER_HELP) -> None:
    """``--master``, default None: the commands resolve it with ``session.default_master``."""
    p.add_argument("--master", default=None, help=help)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE (e.g. spark.executor.memory=1g), got {text!r}")
    return key.strip(), value
