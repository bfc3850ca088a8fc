"""What several commands of ``pyspark-cq`` parse alike."""
from __future__ import annotations


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE (e.g. spark.executor.memory=1g), got {text!r}")
    return key.strip(), value
