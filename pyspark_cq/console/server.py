"""The live web console of a :class:`~pyspark_cq.runtime.CQRuntime` (STREAM's query and control-table
interface, Motwani et al., §6): a Starlette app served by uvicorn in a background thread.

What it serves
--------------
=============================  =================================================================
``GET /``                      the page (``static/index.html``; charts by plotly.js, shipped in the
                               ``plotly`` package, no CDN)
``GET /static/plotly.min.js``  plotly.js from the installed ``plotly`` package
``GET /api/state``             everything at once (JSON): queries, plans as SVG, QoS ranges, the
                               control table, the change log, the decisions log, all samples
``GET /api/groups``            the registered query groups (JSON, read now): members with status,
                               mode, the query whose slices each shares, rows delivered, counters,
                               and the group's state with each shared table counted once
``GET /api/events``            server-sent events: every ``interval`` the samples taken since
                               ``?after=<seq>`` and, when they changed, the control table, the
                               change log and the decisions log
``POST /api/control/{op}``     an edit: ``{"changes": {...}, "who": ..., "reason": ...}`` with header
                               ``Authorization: Bearer <token>``; goes through
                               :meth:`CQRuntime.set_control` (the runtime's own checks); 400 with the
                               reason when refused (nothing written), 401/403 without / with a wrong
                               token, 404 for an unknown operator
=============================  =================================================================

A sampler thread reads :meth:`CQRuntime.statistics` every ``interval`` seconds and keeps one sample per
query whenever the query's batch count moved (the runtime's smoothed rates and latest state sizes, as the
policies see them), the latest ``history`` samples per query.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import math
import secrets
import threading
import time
from collections import deque
from importlib import resources

from ..vocabulary import metrics as M
from .graph import plan_svg

__all__ = ["Console"]

#: Decisions-log and change-log records sent to the page (the latest ones).
LOG_TAIL = 200


def _clean(value):
    """JSON-able: NaN/inf -> None, numpy scalars -> Python, unknown objects -> str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "item"):   # numpy scalars
        return _clean(value.item())
    if hasattr(value, "to_dict"):
        return _clean(value.to_dict())
    return str(value)


def _plotly_js() -> bytes:
    """plotly.js as shipped inside the ``plotly`` PyPI package."""
    try:
        return resources.files("plotly").joinpath("package_data", "plotly.min.js").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise RuntimeError("the console's charts need plotly.js from the 'plotly' package: "
                           "pip install 'pyspark-cq[console]'") from exc


#: What the console reads and calls on its runtime (a :class:`~pyspark_cq.runtime.CQRuntime`).
_RUNTIME_API = ("statistics", "control_table", "decisions_log", "policies", "memory_budget", "set_control",
                "groups")


class Console:
    """The live web console of ``runtime`` (start it with :meth:`CQRuntime.serve` or :meth:`start`).

    Parameters
    ----------
    runtime : CQRuntime
        The runtime whose queries, statistics, control table and logs it shows.
    host : str
        Address to bind (default this machine only).
    port : int
        TCP port; 0 picks a free one (see :attr:`url`).
    token : str, optional
        The token an edit must carry (``Authorization: Bearer <token>``); default a new random one.
    interval : float
        Seconds between samples and between server-sent events.
    history : int
        Samples kept per query.
    """

    def __init__(self, runtime, *, host: str = "127.0.0.1", port: int = 8050, token: str | None = None,
                 interval: float = 1.0, history: int = 600):
        # the runtime is passed in, never imported: the console is a view of it (docs/architecture.md, "Layers")
        missing = [a for a in _RUNTIME_API if not hasattr(runtime, a)]
        if missing:
            raise TypeError(f"runtime must be a CQRuntime, got {type(runtime).__name__} (no {', '.join(missing)})")
        if not isinstance(host, str) or not host:
            raise TypeError(f"host must be an address such as '127.0.0.1', got {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535] (0: any free port), got {port!r}")
        if token is not None and (not isinstance(token, str) or len(token) < 8):
            raise ValueError("token must be a str of at least 8 characters or None (generated)")
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0.05 <= interval <= 60:
            raise ValueError(f"interval must be a number of seconds in [0.05, 60], got {interval!r}")
        if isinstance(history, bool) or not isinstance(history, int) or history < 2:
            raise ValueError(f"history must be an int >= 2, got {history!r}")
        self.runtime, self.host, self.port = runtime, host, port
        self.token = token or secrets.token_urlsafe(18)
        self.interval, self.history = float(interval), history
        self._lock = threading.Lock()
        self._samples: dict[str, deque] = {}
        self._seq = 0
        self._batches: dict[str, int] = {}
        self._logs: dict = {"control": [], "changes": [], "decisions": [], "plans": {}, "queries": {}, "groups": {}}
        self._logs_version = 0
        self._stop = threading.Event()
        self._server = None
        self._threads: list[threading.Thread] = []

    # -- sampling ----------------------------------------------------------------------------------

    def sample(self) -> None:
        """Take one sample of every query whose batch count moved, and refresh the tables and logs."""
        rt = self.runtime
        snap = rt.statistics()
        table = rt.control_table()
        entries = table.entries()
        control = {op: dict(e.params) for op, e in entries.items()}
        now = time.time()
        with self._lock:
            for name, q in snap.queries.items():
                if self._batches.get(name) == q.batches and name in self._samples:
                    continue
                self._batches[name] = q.batches
                self._seq += 1
                ops = {}
                for op, st in q.operators.items():
                    ops[op] = {"input_rate": st.input_rate, M.OUTPUT_ROWS: st.output_rows,
                               "selectivity": st.selectivity, M.STATE_ROWS: st.state_rows,
                               M.STATE_BYTES: st.state_bytes, "late": st.late_rows_total,
                               "shed": st.totals.get(M.SHED_ROWS, 0),
                               "malformed": st.totals.get(M.MALFORMED_ROWS, 0),
                               "batches": st.batches}
                point = {"seq": self._seq, "t": now, "query": name, "batches": q.batches,
                         "input_rate": q.input_rate, "duration": q.batch_duration, M.STATE_ROWS: q.state_rows,
                         M.STATE_BYTES: q.state_bytes, "late": q.late_rows_total, "operators": ops}
                self._samples.setdefault(name, deque(maxlen=self.history)).append(_clean(point))
            for name in [n for n in self._samples if n not in snap.queries]:
                del self._samples[name]
        groups = rt.groups()
        member_of = {m: g for g, info in groups.items() for m in info["members"]}
        queries = {}
        for name, q in snap.queries.items():
            queries[name] = {
                "group": member_of.get(name),
                "name": name, "operators": sorted(q.operators), "period": q.period, "deadline": q.deadline,
                "qos": {k: v.to_dict() for k, v in q.qos.items()},
                "plan": None if q.plan is None else str(q.plan),
                "plan_svg": None if q.plan is None else plan_svg(q.plan, control),
            }
        rows = [{"operator": op, "query": e.query, "version": e.version, "params": dict(e.params)}
                for op, e in entries.items()]
        logs = _clean({"control": rows, "changes": [c.to_dict() for c in table.changes()[-LOG_TAIL:]],
                       "decisions": rt.decisions_log()[-LOG_TAIL:], "queries": queries, "groups": groups,
                       "memory_budget": rt.memory_budget, "policies": [p.name for p in rt.policies]})
        with self._lock:
            if logs != self._logs:
                self._logs = logs
                self._logs_version += 1

    def _sampler(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as exc:  # the console must outlive a failed read; the page shows it
                with self._lock:
                    self._logs = {**self._logs, "error": f"{type(exc).__name__}: {exc}"}
                    self._logs_version += 1
            self._stop.wait(self.interval)

    def state(self, after: int = 0) -> dict:
        """Samples with ``seq > after`` (oldest first), the tables and logs, and their versions (JSON-able)."""
        with self._lock:
            samples = sorted((p for d in self._samples.values() for p in d if p["seq"] > after),
                             key=lambda p: p["seq"])
            return {"seq": self._seq, "logs_version": self._logs_version, "samples": samples, **self._logs}

    # -- edits -------------------------------------------------------------------------------------

    def edit(self, operator: str, changes, *, who: str, reason: str = "") -> dict:
        """Apply an edit through :meth:`CQRuntime.set_control`; the change is logged as ``console:<who>``.

        Returns ``{"changes": [...], "entry": {...}}``; raises what ``set_control`` raises (nothing written).
        """
        if not isinstance(changes, dict) or not changes:
            raise ValueError(f"changes must be a non-empty object of parameter -> value, got {changes!r}")
        if not isinstance(who, str) or not who.strip():
            raise ValueError("who must name the person making the change (the change log shows it)")
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {reason!r}")
        done = self.runtime.set_control(operator, who=f"console:{who.strip()}",
                                        reason=reason.strip() or "edited in the console", **changes)
        entry = self.runtime.control_table().entry(operator)
        self.sample()
        return _clean({"changes": [c.to_dict() for c in done],
                       "entry": {"operator": operator, "version": entry.version, "params": dict(entry.params)}})

    # -- the app -----------------------------------------------------------------------------------

    def app(self):
        """The Starlette application."""
        from starlette.applications import Starlette
        from starlette.middleware import Middleware
        from starlette.middleware.trustedhost import TrustedHostMiddleware
        from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        static = resources.files(__package__).joinpath("static")
        plotly = _plotly_js()

        def asset(name: str, media: str):
            body = static.joinpath(name).read_bytes()

            async def endpoint(request):
                return Response(body, media_type=media)
            return endpoint

        async def index(request):
            return HTMLResponse(static.joinpath("index.html").read_text(encoding="utf-8"))

        async def plotly_js(request):
            return Response(plotly, media_type="text/javascript", headers={"Cache-Control": "max-age=3600"})

        def _after(request) -> int:
            try:
                return max(int(request.query_params.get("after", "0")), 0)
            except ValueError:
                return 0

        async def api_state(request):
            return JSONResponse(self.state(_after(request)))

        async def api_groups(request):
            groups = await asyncio.to_thread(self.runtime.groups)
            return JSONResponse(_clean({"groups": groups}))

        async def api_events(request):
            after, logs_seen = _after(request), -1

            async def stream():
                nonlocal after, logs_seen
                yield "retry: 2000\n\n"
                while not self._stop.is_set():
                    state = self.state(after)
                    message = {"seq": state["seq"], "samples": state["samples"]}
                    if state["logs_version"] != logs_seen:
                        message.update({k: v for k, v in state.items() if k not in ("seq", "samples")})
                        logs_seen = state["logs_version"]
                    after = state["seq"]
                    yield f"data: {json.dumps(message, allow_nan=False)}\n\n"
                    if await request.is_disconnected():
                        break
                    await asyncio.sleep(self.interval)

            return StreamingResponse(stream(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        async def api_control(request):
            given = request.headers.get("authorization", "")
            if not given.startswith("Bearer ") or not given[7:]:
                return JSONResponse({"error": "an edit needs the console's token: header "
                                              "'Authorization: Bearer <token>' (printed when the console started)"},
                                    status_code=401)
            if not hmac.compare_digest(given[7:].encode(), self.token.encode()):
                return JSONResponse({"error": "wrong token"}, status_code=403)
            try:
                body = await request.json()
            except ValueError:
                return JSONResponse({"error": "the body must be JSON: {\"changes\": {...}, \"who\": ..., "
                                              "\"reason\": ...}"}, status_code=400)
            if not isinstance(body, dict):
                return JSONResponse({"error": "the body must be a JSON object"}, status_code=400)
            operator = request.path_params["operator"]
            try:
                result = await asyncio.to_thread(self.edit, operator, body.get("changes"),
                                                 who=body.get("who") or "", reason=body.get("reason") or "")
            except KeyError as exc:
                return JSONResponse({"error": str(exc.args[0] if exc.args else exc)}, status_code=404)
            except (TypeError, ValueError) as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            return JSONResponse(result)

        hosts = ["127.0.0.1", "localhost", "::1", self.host] if self.host not in ("0.0.0.0", "::") else ["*"]
        return Starlette(routes=[
            Route("/", index),
            Route("/static/plotly.min.js", plotly_js),
            Route("/static/console.js", asset("console.js", "text/javascript")),
            Route("/static/console.css", asset("console.css", "text/css")),
            Route("/api/state", api_state),
            Route("/api/groups", api_groups),
            Route("/api/events", api_events),
            Route("/api/control/{operator:str}", api_control, methods=["POST"]),
        ], middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts)])

    # -- running -----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The page's address (with the actual port once started)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self, timeout: float = 30.0) -> Console:
        """Start the sampler and the web server (background threads); returns once the server listens."""
        import uvicorn

        if self._server is not None:
            return self
        app = self.app()
        self.sample()
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._stop.clear()
        self._threads = [threading.Thread(target=self._server.run, name="pyspark-cq-console", daemon=True),
                         threading.Thread(target=self._sampler, name="pyspark-cq-console-sampler", daemon=True)]
        for t in self._threads:
            t.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._threads[0].is_alive():
                self._server = None
                self._stop.set()
                raise RuntimeError(f"the console could not listen on {self.host}:{self.port} (port in use?)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the console did not start within {timeout} s")
            time.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Stop the web server and the sampler."""
        self._stop.set()
        if self._server is not None:
            self._server.should_exit = True
        for t in self._threads:
            t.join(timeout=10)
        self._threads, self._server = [], None

    def __enter__(self) -> Console:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
