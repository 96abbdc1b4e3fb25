"""``metaroles watch``: a run directory as a local web page, live or replayed; a run's controls behind a token.

The page (``watch.html``, ``watch.js``, ``watch.css``: package data, no CDN) is served by a
starlette app on 127.0.0.1 (uvicorn). It reads the run from its files through a
:class:`~metaroles.flow.timeline.Timeline` — so one process or many shards, running or finished,
it follows the record — and receives each round as a Server-Sent Event carrying that round's
delta, never the history. Routes:

- ``GET /api/info``: the run (scenario, rounds so far, whether it ended), and whether it has controls.
- ``GET /api/round/N``: round N's delta (a replay's scrub); ``GET /api/role/NAME?round=N``: a role's panel
  (its messages, its model calls); ``GET /api/state/NAME?round=N``: its persona and state, the run rebuilt;
  ``GET /api/distribution?round=N``: the roles' readings as histograms; ``GET /api/series``,
  ``/api/network?round=N``, ``/api/thread/ID``, ``/api/compare``: figures over rounds, who talks to
  whom, a conversation, another run beside this one.
- ``GET /api/stream?from=N``: the deltas of round N on as the run writes them, and the controls' state.
- ``POST /api/interview``: a role's answer to a question as it stood after a round, on a fork.
- ``POST /api/human``: a person's answer for the role they play (``--human ROLE --watch``).
- ``POST /api/control/ACTION`` (``claim``, ``pause``, ``step``, ``resume``, ``inject``, ``release``):
  with the run's token in ``X-Control-Token``; one controller at a time (its id in
  ``X-Controller``, bound to its open stream: a page closed mid-step lets another claim the run,
  which stays as it was left — paused, and resumable).

The page answers only requests addressed to it by an address (127.0.0.1 or localhost on its port:
a name a page elsewhere points here, DNS rebinding, is refused), a POST from another site's page
never, and bodies are capped (:mod:`metaroles.core.guard`).

Message text only ever reaches the page as JSON strings, which the script puts into the page as
text (``textContent``), never as HTML; the page's Content-Security-Policy allows no other source.
"""

from __future__ import annotations

import html
import secrets
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from metaroles.core.exceptions import ConfigError, InvalidValueError, MetarolesError
from metaroles.core.guard import Guarded
from metaroles.flow.link import STEERS, Answers, Controls, bind, steer
from metaroles.flow.timeline import TEXT_CHARS, Timeline, bisect_round
from metaroles.team.control import Injection

__all__ = ["StateReader", "WatchServer", "bind", "histogram", "watch_app", "watch_page"]

SHUTDOWN_SECONDS = 10
"""How long the streams open when the run ends have to send its last rounds before the server stops."""
ROUNDS_KEPT = 256
"""Rounds whose events the page keeps made, for the streams that have yet to send them."""
POLL_SECONDS = 0.2
"""How often a stream looks for rounds the run wrote (the page shows a round within this of its end)."""
_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'self'"
)
_ASSETS = {"watch.js": "text/javascript", "watch.css": "text/css"}


class Steering:
    """The run's controls as the page reaches them: its token, and the one controller that holds them."""

    def __init__(self, control: Controls, token: str) -> None:
        self.control, self.token = control, token
        self.holder: str | None = None
        self.streams: dict[str, int] = {}

    def check(self, request: Request, *, claiming: bool = False) -> None:
        token = request.headers.get("x-control-token", "")
        if not secrets.compare_digest(token.encode(), self.token.encode()):
            raise _Refused(403, "wrong or missing control token: use the one the run printed (its URL's #token=)")
        if not claiming and request.headers.get("x-controller") != self.holder:
            raise _Refused(409, "this page does not hold the controls: claim them first")

    def claim(self) -> str:
        if self.holder is not None and self.streams.get(self.holder, 0) > 0:
            raise _Refused(409, "another page controls this run; watching is fine, control is one at a time")
        self.holder = secrets.token_hex(8)
        return self.holder

    def opened(self, controller: str) -> None:
        self.streams[controller] = self.streams.get(controller, 0) + 1

    def closed(self, controller: str) -> None:
        self.streams[controller] -= 1
        if self.streams[controller] <= 0 and self.holder == controller:
            self.holder = None  # the run stays as it was left: paused stays paused


class _Refused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


Interviewer = Callable[[str, int, str], Awaitable[list[dict[str, Any]]]]
"""Asks ``(roles, round, question)`` of a run on a fork; the answers as rows (``project.interview``)."""
StateReader = Callable[[int], Awaitable[dict[str, Any]]]
"""Every role's state after a round, the run rebuilt in memory: ``round``, ``as_of`` (the round it is
the state of: a checkpoint's when the rounds since cannot be run again), ``note`` (why not) and
``roles`` (each its ``project.panel.role_state``)."""
HISTOGRAM_BINS = 20
"""The bars of a reading's distribution over the roles."""


def watch_app(
    run_dir: Path,
    *,
    control: Controls | None = None,
    token: str | None = None,
    starting: bool = False,
    interviewer: Interviewer | str = "",
    desk: Answers | None = None,
    compare: Path | None = None,
    states: StateReader | str = "",
) -> Starlette:
    """The watch page's app over ``run_dir``; with ``control`` (and its ``token``), the run's controls too.

    ``compare``: another run drawn beside it (its figures, and the round where the two first differ).
    ``states`` reads the roles' state after a round (a role panel's persona and state fields, the
    distributions of the roles' readings); a text instead says why the page cannot (as ``interviewer``).

    ``starting``: the run is about to write ``run_dir`` (a run's own page, started before its manifest).
    ``interviewer`` puts a role panel's questions to the role on a fork; a text instead says why
    the page cannot (it would import code the run directory names: ``--trust``). ``desk`` holds the
    questions a person playing a role answers on the page (with the controls' token).

    Raises:
        ConfigError: If ``run_dir`` is not a run directory (as :class:`Timeline` says).
    """
    steering = Steering(control, token or secrets.token_urlsafe(16)) if control is not None else None
    page = _Page(Timeline(run_dir, starting=starting), steering, interviewer, desk)
    page.other = Timeline(compare) if compare is not None else None
    page.states = states
    routes = [
        Route("/", page.page),
        Route("/static/{name}", page.asset),
        Route("/api/info", page.info),
        Route("/api/round/{number}", page.one_round),
        Route("/api/series", page.series),
        Route("/api/network", page.network),
        Route("/api/thread/{message}", page.thread),
        Route("/api/compare", page.compare),
        Route("/api/role/{name}", page.role),
        Route("/api/state/{name}", page.state),
        Route("/api/distribution", page.distribution),
        Route("/api/stream", page.stream),
        Route("/api/control/{action}", page.act, methods=["POST"]),
        Route("/api/interview", page.interview, methods=["POST"]),
        Route("/api/human", page.human, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={_Refused: _refused, MetarolesError: _failed})
    app.state.closing = page.closing
    return app


class _Page:
    """The routes' handlers over one run's timeline and, if it has them, its controls."""

    def __init__(
        self, timeline: Timeline, steering: Steering | None, interviewer: Interviewer | str, desk: Answers | None
    ) -> None:
        self.timeline, self.steering, self.interviewer, self.desk = timeline, steering, interviewer, desk
        self.closing = threading.Event()
        """Set when the server stops: every stream sends what the run wrote last, then ends."""
        self.other: Timeline | None = None
        """A run compared with this one (``metaroles watch RUN --compare OTHER``)."""
        self.states: StateReader | str = ""
        self._rounds: dict[int, tuple[bytes, list[str]]] = {}
        timeline.refresh()

    async def round_event(self, number: int) -> tuple[bytes, list[str]]:
        """Round ``number``'s event, and the ids of its messages whose texts came later: made once for every stream."""
        made = self._rounds.get(number)
        if made is None:
            delta = await anyio.to_thread.run_sync(self.timeline.delta, number)
            made = _sse("round", delta), [row[3] for row in delta["flow"] if row[4] is None]
            self._rounds[number] = made
            if len(self._rounds) > ROUNDS_KEPT:
                del self._rounds[min(self._rounds)]
        return made

    async def page(self, request: Request) -> Response:
        return Response(_asset("watch.html"), media_type="text/html", headers=_HEADERS)

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _ASSETS:
            return _error(404, "no such file")
        return Response(_asset(name), media_type=_ASSETS[name], headers=_HEADERS)

    async def info(self, request: Request) -> Response:
        self.timeline.refresh()
        return _json({**_info(self.timeline, self.steering), "compare": self.other is not None})

    async def one_round(self, request: Request) -> Response:
        timeline = self.timeline
        timeline.refresh()
        number = _int(request.path_params["number"], "round")
        if not timeline.rounds:
            return _error(404, "the run has logged no round yet")
        if number not in timeline.line_of:
            number = bisect_round(timeline.rounds, number)
        return _json(await anyio.to_thread.run_sync(timeline.delta, number))

    async def series(self, request: Request) -> Response:
        self.timeline.refresh()
        return _json(await anyio.to_thread.run_sync(self.timeline.series))

    async def network(self, request: Request) -> Response:
        timeline = self.timeline
        timeline.refresh()
        through = _int(request.query_params.get("round", str(timeline.rounds[-1] if timeline.rounds else 0)), "round")
        return _json(await anyio.to_thread.run_sync(timeline.network, through))

    async def compare(self, request: Request) -> Response:
        if self.other is None:
            return _error(404, "no run is compared with this one; metaroles watch RUN --compare OTHER")
        return _json(await anyio.to_thread.run_sync(compared, self.timeline, self.other))

    async def thread(self, request: Request) -> Response:
        self.timeline.refresh()
        message = request.path_params["message"]
        try:
            return _json(await anyio.to_thread.run_sync(self.timeline.thread, message))
        except KeyError:
            return _error(404, f"no message {message!r} in the run's log")

    async def role(self, request: Request) -> Response:
        timeline = self.timeline
        timeline.refresh()
        name = request.path_params["name"]
        through = _int(request.query_params.get("round", str(timeline.rounds[-1] if timeline.rounds else 0)), "round")
        try:
            return _json(await anyio.to_thread.run_sync(timeline.role, name, through))
        except KeyError:
            return _error(404, f"no role named {name!r} took part up to round {through}")

    async def read_states(self, request: Request) -> dict[str, Any]:
        """The roles' state after the round asked (the last logged by default)."""
        if isinstance(self.states, str):
            raise _Refused(403, self.states or "this page reads no role's state")
        timeline = self.timeline
        timeline.refresh()
        if not timeline.rounds:
            raise _Refused(404, "the run has logged no round yet")
        asked = _int(request.query_params.get("round", str(timeline.rounds[-1])), "round")
        try:
            return await self.states(bisect_round(timeline.rounds, asked))
        except (MetarolesError, ValueError) as exc:
            raise _Refused(400, str(exc)) from exc

    async def state(self, request: Request) -> Response:
        """A role's persona, state fields and readings after a round (``GET /api/state/NAME?round=N``)."""
        states = await self.read_states(request)
        name = request.path_params["name"]
        if name not in states["roles"]:
            return _error(404, f"no role named {name!r} at round {states['round']}")
        head = {key: states[key] for key in ("round", "as_of", "note")}
        return Response(
            orjson.dumps({**head, "role": name, "state": states["roles"][name]}, default=str),
            media_type="application/json",
            headers=_HEADERS,
        )

    async def distribution(self, request: Request) -> Response:
        """How the roles' readings (an opinion) are spread after a round (``GET /api/distribution?round=N``)."""
        states = await self.read_states(request)
        values: dict[str, list[float]] = {}
        for state in states["roles"].values():
            for name, value in state["readings"].items():
                if isinstance(value, int | float) and not isinstance(value, bool) and value == value:
                    values.setdefault(name, []).append(float(value))
        head = {key: states[key] for key in ("round", "as_of", "note")}
        return _json({**head, "roles": len(states["roles"]), "readings": {k: histogram(v) for k, v in values.items()}})

    async def stream(self, request: Request) -> Response:
        start = _int(request.query_params.get("from", "0"), "from")
        controller = request.query_params.get("controller", "")
        return _EventStream(_events(self, start, controller))

    async def interview(self, request: Request) -> Response:
        """Ask a role a question as it stood after a round: ``{"role", "round", "question"}``."""
        if request.headers.get("x-metaroles") != "1":  # a custom header: another site's page cannot send it
            return _error(403, "interviews are asked from the watch page (X-Metaroles: 1)")
        if isinstance(self.interviewer, str):
            return _error(403, self.interviewer or "this page asks no interviews")
        body = orjson.loads(await request.body() or b"{}")
        if not (isinstance(body, dict) and isinstance(body.get("role"), str) and isinstance(body.get("question"), str)):
            return _error(400, 'an interview takes {"role": NAME, "round": N, "question": TEXT}')
        at = body.get("round")
        if type(at) is not int or at < 0:
            return _error(400, f"round={at!r} is not a round number")
        try:
            return _json({"answers": await self.interviewer(body["role"], at, body["question"])})
        except (MetarolesError, ValueError) as exc:
            return _error(400, str(exc))

    async def human(self, request: Request) -> Response:
        """A person's answer for the role they play: ``{"number": N, "text": TEXT}`` (the controller's page)."""
        if self.desk is None or self.steering is None:
            return _error(404, "nobody is asked on this page: run with --human ROLE --watch")
        try:
            self.steering.check(request)
            body = orjson.loads(await request.body() or b"{}")
            if not (isinstance(body, dict) and type(body.get("number")) is int and isinstance(body.get("text"), str)):
                return _error(400, 'an answer is {"number": N, "text": TEXT}')
            self.desk.answer(body["number"], body["text"])
        except _Refused as refused:
            return _error(refused.status, refused.detail)
        except (InvalidValueError, ValueError) as exc:
            return _error(400, str(exc))
        return _json({"answered": body["number"]})

    async def act(self, request: Request) -> Response:
        steering = self.steering
        if steering is None:
            return _error(404, "this run has no controls: start it with `metaroles run ... --watch` to steer it")
        action = request.path_params["action"]
        try:
            steering.check(request, claiming=action == "claim")
            return _json(await _act(steering, action, request))
        except _Refused as refused:
            return _error(refused.status, refused.detail)
        except (InvalidValueError, ValueError) as exc:
            return _error(400, str(exc))


_HEADERS = {"Content-Security-Policy": _POLICY, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


def _asset(name: str) -> bytes:
    return resources.files("metaroles.flow").joinpath(name).read_bytes()


def _json(value: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type="application/json", headers=_HEADERS)


def _error(status: int, detail: str) -> Response:
    return _json({"error": detail}, status)


async def _refused(request: Request, exc: Exception) -> Response:
    refused = exc if isinstance(exc, _Refused) else _Refused(400, str(exc))
    return _error(refused.status, refused.detail)


async def _failed(request: Request, exc: Exception) -> Response:
    return _error(400, str(exc))


def _int(text: str, name: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise _Refused(400, f"{name}={text!r} is not a round number (0, 1, 2, ...)")
    return int(text)


def histogram(values: list[float], bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """``values`` in ``bins`` equal bars from their least to their greatest: ``edges``, ``counts``, ``n``, ``mean``."""
    low, high = min(values), max(values)
    width = (high - low) / bins or 1.0
    counts = [0] * bins
    for value in values:
        counts[min(int((value - low) / width), bins - 1)] += 1
    edges = [low + width * i for i in range(bins + 1)]
    return {"edges": edges, "counts": counts, "n": len(values), "mean": sum(values) / len(values)}


def compared(timeline: Timeline, other: Timeline) -> dict[str, Any]:
    """The other run beside this one: its name and figures, and the round where their messages first differ.

    Two runs that share no beginning (another scenario, or no first message alike) are said to be
    unrelated: where they differ means nothing then.
    """
    from metaroles.project.diff import first_divergence, run_messages

    other.refresh()
    mine, theirs = run_messages(timeline.run_dir), run_messages(other.run_dir)
    parting = first_divergence(mine, theirs)
    same_start = bool(mine and theirs) and first_divergence(mine[:1], theirs[:1]) is None
    related = timeline.manifest.get("scenario") == other.manifest.get("scenario") and same_start
    return {
        "run": other.run_dir.name,
        "related": related,
        "parting": parting if related else None,
        "note": ""
        if related
        else "the runs share no beginning (another scenario, or another first message): "
        "they are not branches of one run, so where they differ says nothing",
        "series": other.series(),
    }


def _info(timeline: Timeline, steering: Steering | None) -> dict[str, Any]:
    manifest = timeline.manifest
    return {
        "run": timeline.run_dir.name,
        "scenario": manifest.get("scenario", ""),
        "rounds": timeline.rounds,
        "n_round": manifest.get("n_round"),
        "ended": (timeline.run_dir / "report.json").is_file(),
        "control": None if steering is None else {**steering.control.state(), "held": steering.holder is not None},
    }


async def _act(steering: Steering, action: str, request: Request) -> dict[str, Any]:
    control = steering.control
    if action == "claim":
        return {"controller": steering.claim(), **control.state()}
    if action == "release":
        steering.holder = None
    elif action in STEERS:
        steer(control, action, await _injection(request) if action == "inject" else None)
    else:
        raise _Refused(404, f"no control named {action!r}: claim, pause, step, resume, inject or release")
    return control.state()


async def _injection(request: Request) -> Injection:
    """The injection a page asks for: its body's name, content and recipients, published at the next barrier."""
    body = orjson.loads(await request.body() or b"{}")
    if not isinstance(body, dict):
        raise InvalidValueError("inject takes a JSON object: name, content, send_to")
    return Injection.model_validate({"name": "inject", **body, "after_round": None})


async def _events(page: _Page, start: int, controller: str) -> AsyncIterator[bytes]:
    """The stream: each round from ``start`` as it is logged, and what changes (late texts, controls, questions).

    A round's texts its checkpoint writes after the round's line follow it (``texts``); the
    controls' state (``control``) and the questions a person is asked (``human``) when they change.
    """
    timeline, steering, desk = page.timeline, page.steering, page.desk
    if steering is not None and controller:
        steering.opened(controller)
    try:
        sent, last, untold = start, dict[str, Any](), dict[int, list[str]]()
        yield _sse("info", _info(timeline, steering))
        while True:
            closing = page.closing.is_set()  # seen before the look at the run: that look sends what it wrote last
            timeline.refresh()
            for number in [r for r in timeline.rounds if r >= sent]:
                event, later = await page.round_event(number)
                yield event
                untold[number] = list(later)
                sent = number + 1
            for number, texts in _texts_since(timeline, untold):
                yield _sse("texts", {"round": number, "texts": texts})
            now = {"control": _info(timeline, steering)["control"], "human": _asked(desk)}
            for name, value in now.items():
                if name not in last or last[name] != value:
                    yield _sse(name, value)
            last = now
            if closing:
                return
            await anyio.sleep(POLL_SECONDS)
    finally:
        if steering is not None and controller:
            steering.closed(controller)


def _asked(desk: Answers | None) -> list[dict[str, Any]]:
    return [question.as_data() for question in desk.pending()] if desk is not None else []


def _texts_since(timeline: Timeline, untold: dict[int, list[str]]) -> list[tuple[int, dict[str, str]]]:
    """The texts the message table gained for rounds already sent without them (its checkpoint came after)."""
    found = []
    for number in list(untold):
        texts = timeline.texts(untold[number])
        if texts:
            found.append((number, {key: text[:TEXT_CHARS] for key, text in texts.items()}))
        untold[number] = [i for i in untold[number] if i not in texts]
        if not untold[number] or number < max(untold) - 3:
            del untold[number]  # a few rounds on, the page has moved on
    return found


def _sse(event: str, data: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class _EventStream(Response):
    """A Server-Sent Events response of an async iterator of ready-made event bytes."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks
        self.background = None
        headers = {**_HEADERS, "Content-Type": "text/event-stream; charset=utf-8", "X-Accel-Buffering": "no"}
        self.raw_headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async with anyio.create_task_group() as group:

            async def until_closed() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                group.cancel_scope.cancel()

            group.start_soon(until_closed)
            try:
                async for chunk in self.chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            finally:
                with anyio.CancelScope(shield=True):
                    await self.chunks.aclose()  # type: ignore[attr-defined]
            await send({"type": "http.response.body", "body": b"", "more_body": False})  # the server stops
            group.cancel_scope.cancel()


def watch_page(run_dir: Path, *, port: int = 0) -> WatchServer:
    """Serve ``run_dir``'s page (read-only: live or replay) in a thread of this process; shown inline in a notebook.

    Raises:
        ConfigError: If ``run_dir`` is not a run directory, or ``port`` cannot be had.
    """
    return WatchServer(watch_app(run_dir), bind(port)).start()


class WatchServer:
    """The page's app served by uvicorn on a socket, in a thread of this process (a notebook's page), or here.

    ``url`` is where it listens; :meth:`start` returns once it accepts connections, :meth:`stop` ends it.
    """

    def __init__(self, app: Starlette, sock: socket.socket) -> None:
        import uvicorn  # the watch extra: imported only when a page is served

        self.sock, self.app = sock, app
        host, port = sock.getsockname()[:2]
        self.url = f"http://{host}:{port}/"
        guarded = Guarded(app)  # Host and Origin checked, bodies capped (metaroles.core.guard)
        config = uvicorn.Config(
            guarded, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=SHUTDOWN_SECONDS
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def serve(self) -> None:
        """Serve here until :meth:`stop` (or Ctrl-C)."""
        self.server.run(sockets=[self.sock])

    def start(self) -> WatchServer:
        """Serve in a daemon thread; return once it accepts connections."""
        self._thread = threading.Thread(target=self.serve, name="metaroles-watch", daemon=True)
        self._thread.start()
        while not self.server.started and self._thread.is_alive():
            self._thread.join(0.01)
        if not self.server.started:
            raise ConfigError(f"the watch page could not start on {self.url}")
        return self

    def _repr_html_(self) -> str:
        """The page inline in a notebook (an iframe of its URL)."""
        return (
            f'<iframe src="{html.escape(self.url)}" width="100%" height="640" style="border:1px solid #ddd"></iframe>'
        )

    def end(self) -> None:
        """Ask the server to stop, from any thread: open streams end at their next look at the run."""
        self.app.state.closing.set()
        self.server.should_exit = True

    def stop(self) -> None:
        """Stop serving (a page's stream never ends by itself) and wait until the server has."""
        self.end()
        if self._thread is not None:
            self._thread.join(SHUTDOWN_SECONDS + 5)
        self.sock.close()
