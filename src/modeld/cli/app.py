"""The ``modeld`` command line: parse, call the client (or the daemon), render, map errors.

Start-up time is the latency of every shell call and every Tab press, so this module imports
only typer and the standard library at the top; everything else is imported inside commands.
Domain errors become exit codes only here (:func:`main`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from modeld import __version__
from modeld.cli.clustercmd import cluster
from modeld.cli.launch import launch
from modeld.cli.opts import (
    CtxOpt,
    GpuOpt,
    JsonOpt,
    KeepAliveOpt,
    KvOpt,
    MmprojOpt,
    ModelArg,
    NoPullOpt,
    RpcOpt,
    UnifiedOpt,
)
from modeld.cli.opts import connect as _client
from modeld.cli.opts import settings_with as _settings
from modeld.cli.rpccmd import rpc_worker
from modeld.cli.servecmd import serve, stop

app = typer.Typer(
    name="modeld",
    help="Keep local GGUF models warm in a memory-aware cache and run them.",
    no_args_is_help=True,
    add_completion=False,  # static completions (completions/) instead: no Python per Tab
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"modeld {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Show the version."
        ),
    ] = False,
) -> None:
    """modeld: a memory-aware model manager daemon for local GGUF models."""


# ---------------------------------------------------------------------- helpers


def _endpoints(text: str) -> tuple[str, ...]:
    from modeld.rpc.endpoints import parse_endpoints

    return parse_endpoints(text)


def _model_ref(model: str | None) -> str | None:
    """``default`` names the built-in default model explicitly."""
    if model in (None, "", "default"):
        return None
    from modeld.registry import normalize_ref

    return normalize_ref(model)


app.command()(serve)  # defined in cli/servecmd.py (this module's size)
app.command()(stop)


# ---------------------------------------------------------------------- run / embed


@app.command()
def run(
    model: Annotated[
        str | None, typer.Argument(help="Model (path, name, alias or 'default'); or the prompt.")
    ] = None,
    prompt: Annotated[str | None, typer.Argument(help="The prompt; also read from stdin.")] = None,
    system: Annotated[str | None, typer.Option(help="System prompt (chat mode).")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Most tokens to generate.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    top_p: Annotated[float | None, typer.Option(help="Nucleus sampling.")] = None,
    top_k: Annotated[int | None, typer.Option(help="Top-k sampling.")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed.")] = None,
    stop: Annotated[
        list[str] | None, typer.Option("--stop", help="Stop string (repeatable).")
    ] = None,
    keep_alive: KeepAliveOpt = None,
    ctx: CtxOpt = None,
    raw: Annotated[bool, typer.Option("--raw", help="Plain completion, no chat template.")] = False,
    format: Annotated[str | None, typer.Option(
        "--format", help="'json', or a JSON Schema file the reply must follow.")] = None,
    think: Annotated[bool | None, typer.Option(
        "--think/--no-think", help="The model's thinking on or off (models that think).")] = None,
    json_out: JsonOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Timings on stderr.")] = False,
    no_pull: NoPullOpt = False,
    rpc: RpcOpt = None,
    gpu_layers: GpuOpt = None,
    image: Annotated[list[Path] | None, typer.Option(
        "--image", help="An image (PNG, JPEG, WebP, GIF) the model sees with the prompt "
        "(repeatable; a model with an image projector).")] = None,
    mmproj: MmprojOpt = None,
) -> None:
    """Generate a reply, streamed to stdout. No prompt on a terminal opens a chat."""
    from modeld.cli.pullcmd import ensure_pulled
    from modeld.cli.runcmd import RunOptions, run_command

    settings = _settings()
    ensure_pulled(settings, model, no_pull=no_pull)
    opts = RunOptions(
        system=system,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        stop=stop or None,
        keep_alive=keep_alive,
        n_ctx=ctx,
        raw=raw,
        json_out=json_out,
        verbose=verbose,
        format=format,
        think=think,
        rpc=rpc,
        gpu_layers=_placement_opts(None, gpu_layers).get("gpu_layers"),
        images=tuple(image or ()),
        mmproj=mmproj,
    )
    run_command(settings, model, prompt, opts, lambda: _client(settings, autostart=True))


def _mmproj(path: str | None) -> str | None:
    """``--mmproj``: absolute (the daemon runs elsewhere); "" stays "" (none)."""
    return os.path.abspath(os.path.expanduser(path)) if path else path


@app.command()
def embed(
    model: ModelArg = None,
    text: Annotated[
        list[str] | None, typer.Argument(help="Texts to embed; '-' reads stdin.")
    ] = None,
    keep_alive: KeepAliveOpt = None,
) -> None:
    """Print embeddings as JSON (one vector per input text)."""
    from modeld.cli import render
    from modeld.cli.stdin import stdin_text
    from modeld.errors import InvalidRequestError

    inputs = list(text or [])
    if inputs == ["-"] or (not inputs and not sys.stdin.isatty()):
        inputs = [line for line in stdin_text().splitlines() if line.strip()]
    if not inputs:
        raise InvalidRequestError("nothing to embed", hint="pass text arguments or '-' for stdin")
    settings = _settings()
    reply = _client(settings, autostart=True).embed(
        _model_ref(model), inputs, keep_alive=keep_alive
    )
    render.emit_json("embed", {"model": model or "default", **reply})


@app.command()
def rerank(
    model: Annotated[str, typer.Argument(help="A reranker (path, name or alias).")],
    query: Annotated[str, typer.Argument(help="What the documents should answer.")],
    documents: Annotated[
        list[str] | None,
        typer.Argument(help="Documents to score; none or '-': one per line from stdin."),
    ] = None,
    top_n: Annotated[
        int | None, typer.Option("--top-n", min=1, help="Only the N best, best first.")
    ] = None,
    keep_alive: KeepAliveOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Score how well each document answers the query (a cross-encoder reranker)."""
    from modeld.cli import render, views
    from modeld.cli.stdin import stdin_text
    from modeld.errors import InvalidRequestError

    docs = list(documents or [])
    if docs == ["-"] or (not docs and not sys.stdin.isatty()):
        docs = [line for line in stdin_text().splitlines() if line.strip()]
    if not docs:
        raise InvalidRequestError(
            "nothing to rerank", hint="pass documents after the query, or one per line on stdin"
        )
    settings = _settings()
    reply = _client(settings, autostart=True).rerank(
        _model_ref(model), query, docs, top_n=top_n, keep_alive=keep_alive
    )
    data = {"model": model, "query": query, **reply}
    render.emit("rerank", data, as_json=json_out,
                text=lambda d: views.rerank_view(d, docs))  # fmt: skip


def _mode(embedding: bool, reranking: bool) -> str | None:
    """The mode the --embed/--rerank flags ask for; None: what the model is made for."""
    if embedding and reranking:
        from modeld.errors import InvalidRequestError

        raise InvalidRequestError("--embed and --rerank exclude each other")
    return "embed" if embedding else "rerank" if reranking else None


# ---------------------------------------------------------------------- cache management


def _placement_opts(kv: str | None, layers: str | None) -> dict[str, Any]:
    """``--kv-cache-type`` and ``--gpu-layers`` as the load request's fields (auto: -1)."""
    from modeld.settingvalues import parse_gpu_layers, parse_kv_cache_type

    try:
        out: dict[str, Any] = {} if kv is None else {"kv_cache_type": parse_kv_cache_type(kv)}
        if layers is not None:
            n = parse_gpu_layers(layers)
            out["gpu_layers"] = -1 if n is None else n
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    return out


@app.command()
def load(
    model: ModelArg = None,
    ctx: CtxOpt = None,
    keep_alive: KeepAliveOpt = None,
    pin: Annotated[bool, typer.Option("--pin", help="Never evict it for memory.")] = False,
    embedding: Annotated[bool, typer.Option("--embed", help="Load in embedding mode.")] = False,
    reranking: Annotated[
        bool, typer.Option("--rerank", help="Load in rerank mode (the default for a reranker).")
    ] = False,
    parallel: Annotated[
        int | None,
        typer.Option(
            min=1, max=64, help="Requests it decodes together (default: the setting, or auto)."
        ),
    ] = None,
    json_out: JsonOpt = False,
    no_pull: NoPullOpt = False,
    rpc: RpcOpt = None,
    kv_unified: UnifiedOpt = None,
    kv_cache_type: KvOpt = None,
    gpu_layers: GpuOpt = None,
    mmproj: MmprojOpt = None,
) -> None:
    """Load a model (or refresh its keep-alive) without generating."""
    from modeld.cli import render, views
    from modeld.cli.pullcmd import ensure_pulled

    settings = _settings()
    ensure_pulled(settings, model, no_pull=no_pull)
    client = _client(settings, autostart=True)
    with render.status(f"loading {model or 'the default model'}"):
        row = client.load(
            _model_ref(model),
            mode=_mode(embedding, reranking),
            n_ctx=ctx,
            keep_alive=keep_alive,
            pinned=pin,
            parallel=parallel,
            kv_unified=kv_unified,
            rpc=None if rpc is None else _endpoints(rpc),
            mmproj=_mmproj(mmproj),
            **_placement_opts(kv_cache_type, gpu_layers),
        )
    if json_out:
        render.emit_json("load", {"model": row})
    else:
        render.print_renderables(*views.ps_view({"models": [row]}))


@app.command()
def unload(
    model: ModelArg = None,
    all_models: Annotated[bool, typer.Option("--all", help="Unload every model.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Unload a model (or all); busy ones go as soon as their requests finish."""
    from modeld.cli import render
    from modeld.errors import InvalidRequestError

    if model is None and not all_models:
        raise InvalidRequestError(
            "name a model or pass --all", hint="see loaded models with modeld ps"
        )
    ref = "default" if model == "default" else _model_ref(model)  # "default" names one here
    reply = _client().unload(ref, all=all_models)
    if json_out:
        render.emit_json("unload", reply)
    else:
        now = reply.get("unloaded") or []
        later = reply.get("unloading_when_idle") or []
        render.message(
            f"unloaded {len(now)} model(s)" + (f", {len(later)} when idle" if later else "")
        )


@app.command()
def ps(
    json_out: JsonOpt = False,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="Also why each context was chosen, pid, path."),
    ] = False,
) -> None:
    """Show loaded models: memory, context, requests (running/queued), keep-alive."""
    from modeld.cli import render, views

    render.emit(
        "ps",
        {"models": _client().ps()},
        as_json=json_out,
        text=lambda data: views.ps_view(data, verbose=verbose),
    )


@app.command()
def stats(json_out: JsonOpt = False) -> None:
    """Cache statistics: hits, loads, evictions, memory, estimate accuracy."""
    from modeld.cli import render, views

    render.emit("stats", _client().stats(), as_json=json_out, text=views.stats_view)


@app.command()
def show(
    model: ModelArg = None,
    ctx: CtxOpt = None,
    embedding: Annotated[bool, typer.Option("--embed", help="As an embedding model.")] = False,
    reranking: Annotated[bool, typer.Option("--rerank", help="As a reranker.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Model metadata, the context it would get now and why, and its estimated memory."""
    from modeld.cli import render, views
    from modeld.describe import describe

    data = describe(
        _settings(), _model_ref(model), mode=_mode(embedding, reranking), n_ctx=ctx
    )
    render.emit("show", data, as_json=json_out, text=views.show_view)


@app.command("list")
def list_(json_out: JsonOpt = False) -> None:
    """GGUF models in the models directory, aliases, and the built-in default model."""
    from modeld.cli import render, views
    from modeld.describe import list_models

    render.emit("list", list_models(_settings()), as_json=json_out, text=views.list_view)


@app.command()
def pull(
    model: Annotated[
        str, typer.Argument(help="hf.co/ORG/REPO[:QUANT], ORG/REPO:QUANT or ORG/REPO/FILE.gguf.")
    ],
    json_out: Annotated[
        bool, typer.Option("--json", help="One JSON line per event (for scripts).")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print only the model file's path.")
    ] = False,
) -> None:
    """Download a GGUF model from Hugging Face (resumable, SHA-256 verified); default Q4_K_M."""
    from modeld.cli.pullcmd import pull_command

    pull_command(_settings(), model, json_out=json_out, quiet=quiet)


@app.command()
def rm(
    model: Annotated[str, typer.Argument(help="A model in the models dir (name or hf.co/… name).")],
    force: Annotated[
        bool, typer.Option("--force", "-f", help="Unload it first if it is loaded.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Delete a model (all its shards) from the models directory."""
    from modeld.cli.pullcmd import rm_command

    settings = _settings()
    rm_command(settings, model, force=force, json_out=json_out, connect=lambda: _client(settings))


@app.command()
def config(json_out: JsonOpt = False) -> None:
    """The effective settings and where each one came from."""
    from modeld.cli import render, views
    from modeld.config import load_settings

    settings, sources = load_settings()
    data = {"settings": settings.to_dict(), "sources": sources}
    render.emit("config", data, as_json=json_out, text=views.config_view)


app.command(context_settings={"ignore_unknown_options": True})(launch)


# ---------------------------------------------------------------------- entry point


app.command("rpc-worker")(rpc_worker)  # defined in cli/rpccmd.py (this module's size)
app.command("cluster")(cluster)  # defined in cli/clustercmd.py (likewise)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: run the app and turn domain errors into documented exit codes.

    Typer itself maps usage errors to 2 and Ctrl-C to 130 (ExitCode.INTERRUPTED).
    """
    from modeld.errors import ExitCode, ModeldError

    try:
        app(args=argv, prog_name="modeld")
    except ModeldError as exc:
        from modeld.cli import render

        json_out = "--json" in (argv if argv is not None else sys.argv[1:])
        sys.exit(render.report_error(exc, json_out=json_out))
    except BrokenPipeError:
        # stdout closed early (e.g. `| head`): not worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(int(ExitCode.OK))
