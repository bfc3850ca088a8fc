"""The live web console of the adaptive runtime (docs/console.md).

``CQRuntime.serve(port)`` or ``pyspark-cq console`` serve a page on 127.0.0.1 that shows the registered
queries and their plans (SVG), the registered query groups (members, sharing, rows, state counted once),
per-operator live charts (rates, state rows and bytes, batch duration
against the deadline and period, late / shed / malformed rows), the policies' decisions log and the
control table's change log, and edits control-table entries within their QoS ranges through
:meth:`CQRuntime.set_control` (the runtime's own checks; a token is required).

=================  ==============================================================
name               what
=================  ==============================================================
`Console`          the server (Starlette app, uvicorn thread, sampler thread)
`plan_svg`         a plan as an SVG tree with the control table's values
`demo_query`       the demo query ``pyspark-cq console`` runs (rate source,
                   ``sliding_aggregate`` under control, QoS ranges)
=================  ==============================================================

Needs the ``console`` extra (``pip install "pyspark-cq[console]"``: starlette, uvicorn, plotly).
"""
from .._lazy import lazy_exports
from .graph import format_duration, plan_svg

__all__ = ["Console", "plan_svg", "format_duration", "demo_query"]

_LAZY = {"Console": ".server", "demo_query": ".demo"}


__getattr__ = lazy_exports(__name__, _LAZY)
