"""The per-task trace of Spark's Python workers (``sitecustomize.py``, put on the workers' ``PYTHONPATH``)."""
