"""``python -m pyspark_cq.cli``: the ``pyspark-cq`` command."""
import sys

from . import main

if __name__ == "__main__":   # imported (e.g. by the doctest runner) it does nothing
    sys.exit(main())
