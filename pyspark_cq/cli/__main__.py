"""``python -m pyspark_cq.cli``: the ``pyspark-cq`` command."""
import sys

from . import main

sys.exit(main())
