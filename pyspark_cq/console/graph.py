"""A query plan (:mod:`pyspark_cq.plan`) as an SVG tree: the console's plan view.

Pure (standard library and :mod:`pyspark_cq.plan`). Each node shows its operator symbol and size; a node
whose label names a control-table parameter (``"<operator>.<param>"``) shows the value in force from the
control table instead of the plan's initial size, and is drawn as adjustable.

Examples
--------
>>> from pyspark_cq import plan as P
>>> svg = plan_svg(P.Aggregate(P.Window(P.Source("rate"), 6_000_000, label="agg.window"), groups=10),
...                {"agg": {"window": 3_000_000}})
>>> "ω 3 s" in svg and "agg.window" in svg and svg.startswith("<svg")
True
"""
from __future__ import annotations

from collections.abc import Mapping
from html import escape

from .. import _human
from .. import plan as P

__all__ = ["plan_svg", "format_duration"]

_W, _H, _DX, _DY = 150, 44, 24, 34   # node box, horizontal gap, vertical gap (px)


def format_duration(micros) -> str:
    """A duration in µs as short text: ``6 s``, ``250 ms``, ``1.5 min``, ``12 µs`` (``_human.duration``)."""
    return _human.duration(micros)


def _text(node: P.Node, control: Mapping) -> tuple[str, bool]:
    """The node's first line, and whether it shows a control-table value."""
    live = None
    if node.label and "." in node.label:
        op, param = node.label.rsplit(".", 1)
        live = control.get(op, {}).get(param)
    if isinstance(node, P.Source):
        return node.name, False
    if isinstance(node, P.Window):
        size = node.size if live is None else live
        text = f"{_human.plain(size)} rows" if node.kind == "tuple" else format_duration(size)
        return f"ω {text}", live is not None
    if isinstance(node, P.Granularity):
        return f"Γ {format_duration(node.granularity if live is None else live)}", live is not None
    if isinstance(node, P.Select):
        return f"σ {_human.plain(node.selectivity)}", False
    if isinstance(node, P.Aggregate):
        return ("α" if node.groups == 1 else f"γ {_human.plain(node.groups)} groups"), False
    return getattr(node, "symbol", type(node).__name__), False


def plan_svg(plan: P.Node, control: Mapping[str, Mapping] | None = None) -> str:
    """The plan as an SVG tree, the root at the top and the sources at the bottom.

    Parameters
    ----------
    plan : pyspark_cq.plan.Node
        The query's plan.
    control : mapping operator -> params, optional
        The control table's current parameters (``Entry.params`` by operator id), shown on labelled nodes.
    """
    if not isinstance(plan, P.Node):
        raise TypeError(f"plan must be a pyspark_cq.plan.Node, got {type(plan).__name__}")
    control = control or {}
    pos: dict[int, tuple[float, int]] = {}
    leaves = [0]

    def place(node: P.Node, depth: int) -> float:   # leaves left to right, a parent over its children
        kids = node.children
        if not kids:
            x = leaves[0]
            leaves[0] += 1
        else:
            xs = [place(k, depth + 1) for k in kids]
            x = sum(xs) / len(xs)
        pos[id(node)] = (x, depth)
        return x

    place(plan, 0)
    depth = max(d for _, d in pos.values())
    width, height = leaves[0] * (_W + _DX), (depth + 1) * (_H + _DY)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plan" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">']

    def centre(node: P.Node) -> tuple[float, float]:
        x, d = pos[id(node)]
        return x * (_W + _DX) + (_W + _DX) / 2, d * (_H + _DY) + _DY / 2 + _H / 2

    for node in P.postorder(plan):
        cx, cy = centre(node)
        for kid in node.children:
            kx, ky = centre(kid)
            parts.append(f'<line x1="{cx:g}" y1="{cy + _H / 2:g}" x2="{kx:g}" y2="{ky - _H / 2:g}" '
                         f'stroke="#888"/>')
    for node in P.postorder(plan):
        cx, cy = centre(node)
        first, live = _text(node, control)
        fill = "#fff4d6" if live else ("#e8f0fe" if not isinstance(node, P.Source) else "#eeeeee")
        parts.append(f'<g class="node{" adjustable" if live else ""}">'
                     f'<rect x="{cx - _W / 2:g}" y="{cy - _H / 2:g}" width="{_W}" height="{_H}" rx="6" '
                     f'fill="{fill}" stroke="#557"/>')
        lines = [first] + ([node.label] if node.label else [])
        for i, line in enumerate(lines):
            y = cy + (i - (len(lines) - 1) / 2) * 15 + 4
            weight = ' font-weight="bold"' if i == 0 else ' fill="#555"'
            parts.append(f'<text x="{cx:g}" y="{y:g}" text-anchor="middle"{weight}>{escape(line)}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)
