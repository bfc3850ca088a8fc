"""The report of ``pyspark-cq demo``: an HTML page with PNG plots and the time series as JSON.

:func:`write_report` writes into a directory:

- ``memory.png``: measured state bytes of the join and the aggregation (per micro-batch, from the
  operators' own reports), their sum as the runtime saw it, the cost-model estimate at the control values
  of the moment, the memory budget and the bound after the resource manager's reserve;
- ``rates.png``: offered packet rate (the generator's profile) and the input rates Spark measured;
- ``settings.png``: the join bound, the aggregation window and the granularity over time, with the
  resource manager's decisions marked;
- ``timeseries.json``: samples, per-batch records, decisions and the summary;
- ``report.html``: the three plots, the summary, the checks and the table of decisions.

Needs matplotlib (``pip install "pyspark-cq[report]"``).
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path

from ..vocabulary import metrics as M

__all__ = ["write_report"]


def _plt():
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError("the demo's report needs matplotlib: pip install \"pyspark-cq[report]\"") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(rows, key):
    pts = [(r["t"], r[key]) for r in rows if r.get(key) is not None and math.isfinite(r[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def _shade(ax, burst, t_max):
    if burst and burst[1] > burst[0]:
        ax.axvspan(burst[0], min(burst[1], t_max), color="tab:orange", alpha=0.08, lw=0, label="burst")


def _finish(fig, ax, path, t_max, ylabel, title, plt, axes=()):
    """Axes over the run's seconds, labels, grid and the legends *below* the plot (inside, a legend covers
    the peaks a reader looks for); save the figure as PNG and close it. ``axes`` are further panels
    sharing the time axis (the x label goes to the lowest one).
    """
    panels = [ax, *axes]
    for a in panels:
        a.set_xlim(0, t_max)
        a.set_ylim(bottom=0)
        a.grid(alpha=0.3)
    panels[-1].set_xlabel("seconds since start")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    handles, labels = [], []
    for a in panels:
        h, lab = a.get_legend_handles_labels()
        handles += h
        labels += lab
    seen = {}
    for h, lab in zip(handles, labels):
        seen.setdefault(lab, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), fontsize=8, loc="lower center", ncol=2, frameon=False)
        rows = (len(seen) + 1) // 2
        fig.tight_layout(rect=(0, 0.035 * rows + 0.03, 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _memory_plot(path, samples, batches, budget, reserve, burst, decisions, plt):
    fig, ax = plt.subplots(figsize=(10, 5.6))
    t_max = max([s["t"] for s in samples] or [1.0])
    _shade(ax, burst, t_max)
    kb = 1e3
    for q, op, color in (("pairs", "join1", "tab:blue"), ("traffic", "agg1", "tab:green")):
        pts = [(b.get("t_end", b["t"]), b[M.STATE_BYTES]) for b in batches.get(q, [])
               if b.get(M.STATE_BYTES) is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] / kb for p in pts], ".-", ms=4, lw=0.8, color=color, alpha=0.7,
                    label=f"measured {op} ({q}), after each micro-batch")
    both = [(s["t"], s["join1_state_bytes"] + s["agg1_state_bytes"]) for s in samples
            if s.get("join1_state_bytes") is not None and s.get("agg1_state_bytes") is not None]
    if both:
        ax.plot([p[0] for p in both], [p[1] / kb for p in both], color="black", lw=1.8,
                label="measured total (as the runtime's statistics show it)")
    est = [(s["t"], s["est_join_bytes"] + s["est_agg_bytes"]) for s in samples if s.get("est_join_bytes") is not None]
    if est:
        ax.plot([p[0] for p in est], [p[1] / kb for p in est], "--", color="tab:purple", lw=1.6,
                label="cost-model estimate (PIPES, as the resource manager costs it) at current settings")
    ax.axhline(budget / kb, color="tab:red", lw=1.5, label=f"budget {budget / kb:,.0f} KB")
    if reserve:
        ax.axhline(budget * (1 - reserve) / kb, color="tab:red", lw=0.8, ls=":",
                   label=f"bound after {reserve:.0%} reserve")
    for d in decisions:
        ax.axvline(d["t"], color="grey", lw=0.5, alpha=0.5)
    _finish(fig, ax, path, t_max, "state memory (KB)",
            "State memory against the budget (vertical lines: resource-manager decisions)", plt)


def _rates_plot(path, samples, batches, burst, plt):
    fig, ax = plt.subplots(figsize=(10, 4.2))
    t_max = max([s["t"] for s in samples] or [1.0])
    _shade(ax, burst, t_max)
    x, y = _series(samples, "offered")
    ax.step(x, y, where="post", color="black", lw=1.2, label="offered (generator: requests + responses)")
    for q, color, scale, note in (("pairs", "tab:blue", 0.5, " ÷ 2 (Spark counts both scans of the join)"),
                                  ("traffic", "tab:green", 1.0, "")):
        x, y = _series([b for b in batches.get(q, []) if b.get("rows")], "rate")
        if x:
            ax.plot(x, [v * scale for v in y], ".-", ms=4, lw=0.8, color=color,
                    label=f"input rate of {q}{note}, per micro-batch (at its start)")
    _finish(fig, ax, path, t_max, "packets / s", "Input rates", plt)


def _settings_plot(path, samples, decisions, burst, plt):
    # The granularity (about a second) has its own panel: on the windows' scale (tens of seconds) its
    # line would lie on the time axis.
    fig, (ax, gx) = plt.subplots(2, 1, figsize=(10, 5.4), sharex=True, gridspec_kw={"height_ratios": (2.2, 1)})
    t_max = max([s["t"] for s in samples] or [1.0])
    for a in (ax, gx):
        _shade(a, burst, t_max)
    for a, key, label, color in ((ax, "upper_s", "join1.upper (s)", "tab:blue"),
                                 (ax, "window_s", "agg1.window (s)", "tab:green"),
                                 (gx, "granularity_s", "agg1.granularity (s)", "tab:brown")):
        x, y = _series(samples, key)
        if x:
            a.step(x, y, where="post", color=color, lw=1.6, label=label)
    gx.set_ylabel("granularity (s)")
    _decision_labels(ax, gx, decisions)
    _finish(fig, ax, path, t_max, "seconds",
            "Windows and granularity set by the PIPES resource manager (grey: decisions)", plt, axes=(gx,))


def _param_text(param: str, value) -> str:
    """A control value as text: durations (µs) in seconds, a drop ratio as it is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value / 1e6:g} s" if param in ("upper", "lower", "window", "granularity") else f"{value:g}"


#: How far (points) a decision's label stands to the right of its grey line, on a white ground: on the line
#: itself the text and the line hid each other, and the step lines of the settings ran through the text.
LABEL_OFFSET = 3


def _decision_labels(ax, gx, decisions) -> list:
    """Mark the decisions on the settings panels: a grey line per round (decisions within a second share
    one) and, on the upper panel, the new values beside it; returns the labels (matplotlib annotations).
    """
    groups: list[list] = []
    for d in decisions:
        if groups and d["t"] - groups[-1][0] < 1.0:
            groups[-1][1].append(d)
        else:
            groups.append([d["t"], [d]])
    labels = []
    for t, group in groups:
        ax.axvline(t, color="grey", lw=0.6, alpha=0.6)
        gx.axvline(t, color="grey", lw=0.6, alpha=0.6)
        text = "; ".join(f"{d['operator']}." + ", ".join(f"{k} {_param_text(k, v)}" for k, v in d["new"].items()
                                                        if isinstance(v, (int, float))) for d in group)
        labels.append(ax.annotate(text, (t, 0.98), xycoords=("data", "axes fraction"), xytext=(LABEL_OFFSET, 0),
                                  textcoords="offset points", rotation=90, va="top", ha="left", fontsize=7,
                                  color="dimgrey", bbox={"boxstyle": "square,pad=0.1", "fc": "white",
                                                         "ec": "none", "alpha": 0.8}))
    return labels


def _fmt(v, key: str = "") -> str:
    """One summary value as readable HTML: sizes in KB / MB, numbers with few digits, nested mappings as
    nested lists (not JSON).
    """
    e = html.escape
    if isinstance(v, bool) or v is None:
        return e(str(v))
    if isinstance(v, (int, float)) and ("bytes" in key or key == "bytes"):
        return e(_size(v))
    if isinstance(v, float):
        return e(f"{v:,.3g}" if abs(v) < 1e4 else f"{v:,.0f}")
    if isinstance(v, int):
        return e(f"{v:,}")
    if isinstance(v, dict):
        items = "".join(f"<li>{e(str(k))}: {_fmt(x, str(k))}</li>" for k, x in v.items())
        return f"<ul>{items}</ul>"
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt(x, key) for x in v)
    return e(str(v))


def _size(n) -> str:
    n = float(n)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:,.3g} {unit}"
    return f"{n:,.0f} B"


def _html(summary, decisions, files) -> str:
    e = html.escape
    checks = "".join(f"<li><b>{'ok' if c['ok'] else 'FAIL'}</b> {e(c['name'])} ({e(c['detail'])})</li>"
                     for c in summary.get("checks", []))
    rows = []
    for d in decisions:
        new = ", ".join(f"{k} = {_param_text(k, v)}" for k, v in d["new"].items())
        old = ", ".join(f"{k} = {_param_text(k, v)}" for k, v in d["old"].items())
        applies = ", ".join(f"{k} {v:.1f}" for k, v in (d.get("applies_from_s") or {}).items())
        rows.append(f"<tr><td>{d['t']:.1f}</td><td>{e(str(d['query']))}</td><td>{e(d['operator'])}</td>"
                    f"<td>{e(old)}</td><td>{e(new)}</td><td>{e(applies)}</td><td class=r>{e(d['reason'])}</td></tr>")
    table = ("<table><tr><th>t (s)</th><th>query</th><th>operator</th><th>old</th><th>new</th>"
             "<th>applies to elements from event time (s)</th><th>reason</th></tr>"
             + "".join(rows) + "</table>") if rows else "<p>No decisions were taken.</p>"
    keys = ("seconds", "startup_seconds", "drain_seconds", "budget_bytes", "cap", "rate", "burst_rate", "decisions",
            "batches", "peak_state_bytes",
            "measured_over_estimate", "smallest", "final", "written", "totals", "injected", "runtime_statistics")
    facts = "".join(f"<tr><th>{e(k.replace('_', ' '))}</th><td>{_fmt(summary.get(k), k)}</td></tr>"
                    for k in keys if k in summary)
    imgs = "".join(f'<h2>{e(title)}</h2><img src="{e(name)}" alt="{e(title)}">' for name, title in files)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>pyspark-cq demo report</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;}} img{{max-width:100%;}}
table{{border-collapse:collapse;font-size:12px;}} ul{{margin:0;padding-left:1.2em;}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top;}}
td.r{{font-size:11px;color:#444;}} code{{font-size:11px;}}</style></head><body>
<h1>pyspark-cq demo: adaptive interval join and sliding aggregation under a memory budget</h1>
<p>Two continuous queries over a generated packet stream with a burst, registered with <code>CQRuntime</code> and
the PIPES resource manager (<code>pipes</code>). Measured state bytes come from the operators' own per-batch
reports; the estimate is the PIPES cost model (<code>pipes_estimate</code>) at the control values of the moment with
the measured packet distance d. Time series: <a href="timeseries.json">timeseries.json</a>.</p>
<h2>Checks</h2><ul>{checks}</ul>
{imgs}
<h2>Decisions of the resource manager</h2>{table}
<h2>Summary</h2>
<p><i>seconds</i> is the run on the demo's clock; before it Spark started and the queries warmed up
(<i>startup seconds</i>), after it they were stopped and their output counted (<i>drain seconds</i>). In
<i>totals</i>, <i>spark input rows</i> is Spark's own count of the rows read, which for <i>pairs</i> is twice
the packets, as the join reads the packet stream once per input (requests, responses); <i>input rows</i> are
the rows the operator took in, <i>output rows</i> the matched request-response pairs of <code>join1</code> and
the windows of <code>agg1</code>, <i>shed rows</i> the input rows the resource manager's load shedding
dropped (counted, never silently lost).</p>
<table>{facts}</table>
</body></html>
"""


def write_report(directory, *, samples, batches, decisions, summary, budget, reserve=0.0, burst=None) -> list[Path]:
    """Write the demo's report into ``directory``; returns the files written.

    Parameters
    ----------
    directory : str or Path
        Created if missing.
    samples : list of dict
        Per-second samples (``t``, ``offered``, ``<query>_rate``, ``<op>_state_bytes``, ``est_*_bytes``,
        ``upper_s``, ``window_s``, ``granularity_s``, ``decisions``).
    batches : dict query -> list of dict
        Per-micro-batch records (``t``, ``rows``, ``rate``, the operator's report such as ``state_bytes``).
    decisions : list of dict
        The resource manager's control-table changes (``t``, ``operator``, ``old``, ``new``, ``reason``).
    summary : dict
        The run's numbers and checks (JSON-able).
    budget : float
        Memory budget in bytes.
    reserve : float
        The resource manager's reserve share (drawn as the effective bound).
    burst : (float, float), optional
        Start and end of the burst, seconds since the start (shaded).
    """
    plt = _plt()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    _memory_plot(out / "memory.png", samples, batches, budget, reserve, burst, decisions, plt)
    _rates_plot(out / "rates.png", samples, batches, burst, plt)
    _settings_plot(out / "settings.png", samples, decisions, burst, plt)
    figures = [("memory.png", "State memory against the budget"), ("settings.png", "Windows and granularity"),
               ("rates.png", "Input rates")]
    with open(out / "timeseries.json", "w") as f:
        json.dump({"samples": samples, "batches": batches, "decisions": decisions, "summary": summary,
                   "budget_bytes": budget, "reserve": reserve, "burst": burst}, f, indent=1, default=str)
    (out / "report.html").write_text(_html(summary, decisions, figures))
    return [out / "report.html", out / "timeseries.json"] + [out / name for name, _ in figures]


def write_group_report(directory, *, summary, batches) -> list[Path]:
    """Write the report of ``pyspark-cq demo --group`` into ``directory``: ``report.html`` (the checks, the group's
    members with mode, shared slices, rows and state, the micro-batches) and ``timeseries.json`` (everything);
    returns the files written.

    Parameters
    ----------
    directory : str or Path
        Created if missing.
    summary : dict
        The run's numbers, the group's ``overview()`` under ``group`` and the checks (JSON-able).
    batches : list of dict
        Per-micro-batch records (``batch``, ``t``, ``spark_input_rows``, ``duration``, ``queries``: each query's
        counters), oldest first.
    """
    e = html.escape
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "timeseries.json", "w") as f:
        json.dump({"batches": batches, "summary": summary}, f, indent=1, default=str)
    g = summary["group"]
    checks = "".join(f"<li><b>{'ok' if c['ok'] else 'FAIL'}</b> {e(c['name'])} ({e(c['detail'])})</li>"
                     for c in summary.get("checks", []))
    head = ("query", "status", "mode", "slices of", "rows delivered", "input rows", "late rows", "malformed rows",
            "state rows", "state bytes", "query text")
    members = []
    for name, m in g["members"].items():
        t = summary["totals"][name]
        cells = (name, m["status"], m["mode"] if not m.get("why") else f"{m['mode']} ({m['why']})",
                 m["slices"] or "–", _fmt(m["rows"]), _fmt(t[M.INPUT_ROWS]), _fmt(t[M.LATE_ROWS]),
                 _fmt(t[M.MALFORMED_ROWS]), _fmt(m[M.STATE_ROWS]), _fmt(m[M.STATE_BYTES], "bytes"), m["text"])
        members.append("<tr>" + "".join(f"<td>{c if i in (4, 5, 6, 7, 8, 9) else e(str(c))}</td>"
                                         for i, c in enumerate(cells)) + "</tr>")
    names = list(g["members"])
    rows = "".join(f"<tr><td>{b['batch']}</td><td>{b['t']:.1f}</td><td>{b['spark_input_rows']:,}</td>"
                   f"<td>{b['duration']:.2f}</td>"
                   + "".join(f"<td>{b['queries'][n].get(M.OUTPUT_ROWS, 0):,}</td>" for n in names) + "</tr>"
                   for b in batches)
    classes = "; ".join(" + ".join(c) for c in g["slice_classes"]) or "–"
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>pyspark-cq demo report: query group</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto;}}
table{{border-collapse:collapse;font-size:12px;}} td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left;
vertical-align:top;}}</style></head><body>
<h1>pyspark-cq demo: {len(names)} continuous queries as one query group</h1>
<p>One Spark streaming query (<code>{e(g['name'])}</code>, {g['shards']} shards) runs every query over the generated
packet stream: the windowed aggregations share one scan, one projection, one slicer and one stateful stage; queries
that slice alike share one slice table (<i>slices of</i> names the query whose table it is), the others run alone
in the same Spark query. Ran {summary['seconds']:.0f} s on the clock, {summary['batches']} micro-batches. Data:
<a href="timeseries.json">timeseries.json</a>.</p>
<h2>Checks</h2><ul>{checks}</ul>
<h2>Members</h2>
<p>Slice classes: {e(classes)}. The group's state: {_fmt(g[M.STATE_ROWS])} rows, {_fmt(g[M.STATE_BYTES], 'bytes')}
(each shared slice table counted once: on its class's first query, the others report 0).</p>
<table><tr>{''.join(f'<th>{e(h)}</th>' for h in head)}</tr>{''.join(members)}</table>
<h2>Rows delivered per micro-batch</h2>
<table><tr><th>batch</th><th>t (s)</th><th>rows Spark read</th><th>duration (s)</th>
{''.join(f'<th>{e(n)}</th>' for n in names)}</tr>{rows}</table>
</body></html>
"""
    (out / "report.html").write_text(page)
    return [out / "report.html", out / "timeseries.json"]
