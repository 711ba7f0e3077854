"""Settings: built-in defaults < TOML config file < ``MODELD_*`` environment < CLI flags.

One frozen :class:`Settings` per process, built by :func:`load_settings`, which also reports
where each value came from (``modeld stats``/``--verbose`` show it, so "why is my budget X?" has
an answer). Pure: reads one file and the given environment mapping, imports nothing heavy.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from modeld import paths
from modeld.cache.policy import parse_keep_alive
from modeld.errors import InvalidRequestError
from modeld.model.memory import MiB
from modeld.pull.store import PARTIAL_MAX_AGE_S
from modeld.settingvalues import (
    model_option_names,
    parse_aliases,
    parse_api_key,
    parse_auto_int,
    parse_bool,
    parse_bytes,
    parse_eviction,
    parse_float,
    parse_gpu_layers,
    parse_http,
    parse_http_address,
    parse_http_users,
    parse_int,
    parse_keep_alive_text,
    parse_kv_cache_type,
    parse_log_level,
    parse_mmproj,
    parse_model_options,
    parse_optional_bytes,
    parse_optional_int,
    parse_origins,
    parse_path,
    parse_rpc,
    parse_socket,
)

#: Default and most draft tokens a reply checks per step (prompt-lookup speculation,
#: runner/speculate.py): a decode call of a greedy-invariant shape holds 7 rows
#: (runner/microbatch.py), the sequence's next token and 6 drafts; the runner caps there.
DRAFT_MAX = 6
MAX_DRAFT = 16
#: The smallest automatic bound of each generate-mode runner's prompt-state store (the
#: ``prompt_cache_mib`` setting, :func:`prompt_cache_auto`): about 20 snapshots of a short
#: gemma-3-270m prompt (18 KiB of KV per token plus a 1 MiB logits row); the bound a load
#: message without the field gets.
PROMPT_CACHE_MIB = 32
#: The automatic bound is this share of the memory budget (issue 47: an agent's 20-40k-token
#: prefix with gemma-3-270m is a ~140 MiB snapshot plus ~15 MiB per context checkpoint) ...
PROMPT_CACHE_SHARE = 16
#: ... and at most this many MiB.
PROMPT_CACHE_MAX_MIB = 4096


def prompt_cache_auto(budget_bytes: int) -> int:
    """The automatic prompt-cache bound, in bytes, for a memory budget of ``budget_bytes``."""
    share = max(0, budget_bytes) // PROMPT_CACHE_SHARE
    return max(PROMPT_CACHE_MIB * MiB, min(share, PROMPT_CACHE_MAX_MIB * MiB))


DEFAULT_HTTP = "127.0.0.1:11434"  # Ollama's port, so its clients work unchanged


CONFIG_ENV = "MODELD_CONFIG"

# ---------------------------------------------------------------------- the settings table


@dataclass(frozen=True)
class Setting:
    """How one setting is read and described: its environment variable (None: only the config
    file and CLI set it), parser, help line (man page, ``python -m modeld.daemon --help``),
    other spellings accepted in the config file and as flags, and its own range check (returns
    why a value is wrong, or None)."""

    env: str | None
    parse: Callable[[object], Any]
    help: str
    synonyms: tuple[str, ...] = ()
    check: Callable[[Any], str | None] | None = None
    env_also: str | None = None  # read when ``env`` is unset (a peer's variable: Ollama's)


def _spec(**spec: Any) -> dict[str, Setting]:
    """A :class:`Settings` field's metadata: its :class:`Setting` (the one declaration)."""
    return {"setting": Setting(**spec)}


def _at_least(low: float, what: str = "") -> Callable[[Any], str | None]:
    return lambda v: None if v >= low else f"must be at least {what or low}"


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be greater than 0"


def _not_negative(v: float) -> str | None:
    return None if v >= 0 else "must not be negative"


def _multiple_of_256(v: int) -> str | None:
    return None if v >= 256 and v % 256 == 0 else "must be a positive multiple of 256"


@dataclass(frozen=True)
class Settings:
    """Every tunable of the daemon and CLI (docs/configuration.md has the long form)."""

    socket: str = field(default_factory=paths.socket_endpoint, metadata=_spec(
        env="MODELD_SOCKET", parse=parse_socket,
        help="ZeroMQ endpoint the daemon binds and the client connects to; a bare path means"
        " ipc://PATH."))
    models_dir: Path = field(default_factory=paths.models_dir, metadata=_spec(
        env="MODELD_MODELS", parse=parse_path, synonyms=("models",),
        help="Directory where model names are looked up (*.gguf, up to 3 levels deep)."))
    memory_fraction: float = field(default=0.75, metadata=_spec(
        env="MODELD_MEMORY_FRACTION", parse=parse_float,
        check=lambda v: None if 0 < v <= 1 else "must be in (0, 1]",
        help="Share of available RAM (capped by a cgroup limit) the cache may use, in (0, 1]."
        " Each card has a budget of its own (vram_cap)."))
    memory_cap_bytes: int | None = field(default=None, metadata=_spec(
        env="MODELD_MEMORY_CAP", parse=parse_optional_bytes, synonyms=("memory_cap",),
        help="Hard cap on the cache budget, e.g. 8GiB or 512M; none or 0 removes it."))
    vram_cap_bytes: int | None = field(default=None, metadata=_spec(
        env="MODELD_VRAM_CAP", parse=parse_optional_bytes, synonyms=("vram_cap",),
        help="Hard cap on what modeld's models may hold on each GPU, e.g. 12GiB (a card shared"
        " with other work); none: the card's memory less what other processes hold and 512"
        " MiB."))
    rpc_worker_memory_bytes: int | None = field(default=None, metadata=_spec(
        env="MODELD_RPC_WORKER_MEMORY", parse=parse_optional_bytes,
        synonyms=("rpc_worker_memory",),
        help="Most of each llama.cpp RPC worker's memory a model may plan with, e.g. 4GiB;"
        " none: the memory it reports free (a CPU worker reports all its RAM)."))
    max_models: int = field(default=3, metadata=_spec(
        env="MODELD_MAX_MODELS", parse=parse_int, check=_at_least(1),
        help="Most models loaded (or loading) at once."))
    keep_alive: str = field(default="5m", metadata=_spec(
        env="MODELD_KEEP_ALIVE", parse=parse_keep_alive_text,
        help="How long a model stays loaded after its last request ends: seconds, a duration"
        " (30s, 5m, 1h), 0 (unload when idle) or negative (until memory is needed)."))
    ctx_floor: int = field(default=2048, metadata=_spec(
        env="MODELD_CTX_FLOOR", parse=parse_int, check=_multiple_of_256,
        help="Smallest context length chosen automatically (a multiple of 256)."))
    ctx_ceiling: int = field(default=8192, metadata=_spec(
        env="MODELD_CTX_CEILING", parse=parse_int, check=_multiple_of_256,
        help="Largest context length chosen automatically; longer prompts grow it on demand up"
        " to the training context when memory allows."))
    max_message_bytes: int = field(default=16 * MiB, metadata=_spec(
        env="MODELD_MAX_MESSAGE_BYTES", parse=parse_bytes,
        check=_at_least(64 * 1024, "64 KiB"), help="Largest protocol message accepted."))
    max_grammar_bytes: int = field(default=1 * MiB, metadata=_spec(
        env="MODELD_MAX_GRAMMAR_BYTES", parse=parse_bytes,
        check=_at_least(64 * 1024, "64 KiB"),
        help="Largest grammar a JSON Schema (format, a forced tool call) may become; enum/const"
        " lists are bounded from it before anything is built (a third as many values, twice"
        " as many bytes of their text)."))
    load_timeout_s: float = field(default=120.0, metadata=_spec(
        env="MODELD_LOAD_TIMEOUT", parse=parse_float, synonyms=("load_timeout",),
        check=_positive, help="Seconds a model load may take before it counts as failed."))
    runner_stall_s: float = field(default=15.0, metadata=_spec(
        env="MODELD_RUNNER_STALL_S", parse=parse_float, synonyms=("runner_stall",),
        check=_positive,
        help="Seconds a runner may go without a heartbeat before it is killed."))
    queue_timeout_s: float = field(default=300.0, metadata=_spec(
        env="MODELD_QUEUE_TIMEOUT", parse=parse_float, synonyms=("queue_timeout",),
        check=_positive, help="Seconds a request may wait for memory held by busy models."))
    spare_runner: bool = field(default=True, metadata=_spec(
        env="MODELD_SPARE_RUNNER", parse=parse_bool, synonyms=("spare",),
        help="Keep one runner process pre-started so a cold load pays only the model load"
        " (true or false); with runner_fork, only until the first runner measured its baseline."))
    runner_fork: bool = field(default=True, metadata=_spec(
        env="MODELD_RUNNER_FORK", parse=parse_bool,
        help="Start runners as forks of one process that has imported llama_cpp, sharing its"
        " memory and starting in milliseconds (Linux, llama.cpp without GPU backends; true or"
        " false)."))
    runner_fork_idle_s: float = field(default=30.0, metadata=_spec(
        env="MODELD_RUNNER_FORK_IDLE", parse=parse_float, synonyms=("runner_fork_idle",),
        check=_not_negative,
        help="Seconds without a new runner after which the fork server exits (its own ~10 MiB"
        " go back); the next runner starts it again, ~0.2 s."))
    partial_max_age_s: float = field(default=PARTIAL_MAX_AGE_S, metadata=_spec(
        env="MODELD_PARTIAL_MAX_AGE", parse=parse_float, synonyms=("partial_max_age",),
        check=_not_negative,
        help="Seconds after which a pull's partial download that no pull is using counts as"
        " abandoned: the next pull deletes it from the models dir's .partial/ (7 days)."))
    aliases: dict[str, str] = field(default_factory=dict, metadata=_spec(
        env=None, parse=parse_aliases,
        help='Model names for paths: a table name = "path" (NAME=PATH,... as a flag).'))
    rpc: dict[str, tuple[str, ...]] = field(default_factory=dict, metadata=_spec(
        env=None, parse=parse_rpc,
        help='llama.cpp RPC workers per model name: a table name = ["HOST:PORT", ...]; every'
        " request for that name loads it with its layers on them (docs/rpc.md)."))
    mmproj: dict[str, str] = field(default_factory=dict, metadata=_spec(
        env=None, parse=parse_mmproj,
        help='Image projectors per model: a table name = "path" (an empty path: none); by'
        " default the mmproj file beside the model is used (issue 38)."))
    log_dir: Path = field(default_factory=paths.log_dir, metadata=_spec(
        env="MODELD_LOG_DIR", parse=parse_path,
        help="Directory for the daemon log and one log per runner."))
    log_level: str = field(default="info", metadata=_spec(
        env="MODELD_LOG_LEVEL", parse=parse_log_level,
        help="debug, info, warning or error."))
    threads: int | None = field(default=None, metadata=_spec(
        env="MODELD_THREADS", parse=parse_optional_int,
        check=_at_least(1, "1 (or 0/auto)"),
        help="Threads per runner; auto or 0 derives it from the CPU quota."))
    failure_cooldown_s: float = field(default=30.0, metadata=_spec(
        env="MODELD_FAILURE_COOLDOWN", parse=parse_float,
        synonyms=("failure_cooldown",), check=_not_negative,
        help="Seconds before a failed load of the same file is retried (doubles with each"
        " further failure, up to 10 minutes)."))
    max_queue: int = field(default=64, metadata=_spec(
        env="MODELD_MAX_QUEUE", parse=parse_int, check=_at_least(1),
        help="Requests that may wait at once; further ones are refused."))
    eviction: str = field(default="cost", metadata=_spec(
        env="MODELD_EVICTION", parse=parse_eviction,
        help="Which idle model goes first when room is needed: cost (often used, slow to reload"
        " and small models stay) or lru."))
    prompt_cache_mib: int | None = field(default=None, metadata=_spec(
        env="MODELD_PROMPT_CACHE_MIB", parse=parse_auto_int,
        synonyms=("prompt_cache",),
        check=lambda v: None if 0 <= v <= 1 << 20 else "must be between 0 (off) and 1048576",
        help="MiB of evaluated-prompt snapshots and context checkpoints each generating model"
        " keeps (reserved with its memory estimate); auto (the default) is 1/16 of the memory"
        " budget, between 32 MiB and 4 GiB; 0 turns the prompt cache off."))
    draft_max: int = field(default=DRAFT_MAX, metadata=_spec(
        env="MODELD_DRAFT_MAX", parse=parse_int, synonyms=("draft",),
        check=lambda v: None if 0 <= v <= MAX_DRAFT else f"must be between 0 (off) and {MAX_DRAFT}",
        help="Most tokens a reply drafts from its context and checks in one step (prompt-lookup"
        " speculative decoding: greedy text unchanged, fewer steps where it repeats the context); 0"
        " turns it off. A request's draft_max option wins."))
    http: str = field(default=DEFAULT_HTTP, metadata=_spec(
        env="MODELD_HTTP", parse=parse_http,
        help="HOST:PORT of the HTTP front door (Ollama, OpenAI and Anthropic APIs), or off."))
    api_key: str | None = field(default=None, metadata=_spec(
        env="MODELD_API_KEY", parse=parse_api_key,
        help="Bearer key HTTP clients must send; required when http is not loopback."))
    http_origins: tuple[str, ...] = field(default=(), metadata=_spec(
        env="MODELD_HTTP_ORIGINS", parse=parse_origins,
        help="Comma-separated browser origins allowed to call the HTTP API (CORS)."))
    kv_cache_type: str = field(default="f16", metadata=_spec(
        env="MODELD_KV_CACHE_TYPE", env_also="OLLAMA_KV_CACHE_TYPE", parse=parse_kv_cache_type,
        help="KV cache type: f16, q8_0 (about half the memory of f16) or q4_0 (about a"
        " quarter), so a budget holds 2-4x the context; as Ollama's OLLAMA_KV_CACHE_TYPE"
        " (also read) and llama-server's -ctk/-ctv. Per model in [model_options.NAME]."))
    gpu_layers: int | None = field(default=None, metadata=_spec(
        env="MODELD_GPU_LAYERS", parse=parse_gpu_layers,
        help="Layers on the GPUs: auto (as many as fit each card's free VRAM, the rest in"
        " RAM), a number, or 0 (CPU only). Without a GPU build or card: CPU only. Per model"
        " in [model_options.NAME]."))
    model_options: dict[str, dict[str, object]] = field(default_factory=dict, metadata=_spec(
        env=None, parse=parse_model_options,
        help="Options per model name: tables [model_options.NAME] with"
        f" {model_option_names(' and ')}."))
    http_header_timeout_s: float = field(default=10.0, metadata=_spec(
        env="MODELD_HTTP_HEADER_TIMEOUT", parse=parse_float, synonyms=("http_header_timeout",),
        check=_positive,
        help="Seconds an HTTP connection may take to send a request's headers (408 and closed"
        " after)."))
    http_body_timeout_s: float = field(default=20.0, metadata=_spec(
        env="MODELD_HTTP_BODY_TIMEOUT", parse=parse_float, synonyms=("http_body_timeout",),
        check=_positive,
        help="Seconds an HTTP request's body may take, plus 1 s per 16 KiB received (408 and"
        " closed after)."))
    http_client_connections: int = field(default=32, metadata=_spec(
        env="MODELD_HTTP_CLIENT_CONNECTIONS", parse=parse_int, check=_at_least(1),
        help="Most HTTP connections one client address may have sending a request at once;"
        " one more closes its oldest (429)."))
    http_connections: int = field(default=1024, metadata=_spec(
        env="MODELD_HTTP_CONNECTIONS", parse=parse_int, check=_at_least(8),
        help="Most HTTP connections open at once, all clients together (fewer when the"
        " descriptor limit is low); past it the oldest idle one is closed, else the new one"
        " refused (503)."))
    http_users: str = field(default="owner", metadata=_spec(
        env="MODELD_HTTP_USERS", parse=parse_http_users,
        help="Local users the HTTP front door serves over loopback: owner (the daemon's user"
        " and root), key (others when they send the api_key) or all."))
    http_model_paths: bool = field(default=False, metadata=_spec(
        env="MODELD_HTTP_MODEL_PATHS", parse=parse_bool,
        help="Let HTTP requests name a model by a file path (true or false); by default they"
        " name models (the models dir, pulled names, aliases) and the CLI takes paths."))
    parallel: int | None = field(default=None, metadata=_spec(
        env="MODELD_PARALLEL", parse=parse_optional_int,
        check=lambda v: None if 1 <= v <= 64 else "must be between 1 and 64 (or 0/auto)",
        help="Requests one generating model decodes together, each with its own context; auto"
        " or 0 is 4 (as llama-server); fewer when memory cannot hold them."))
    kv_unified: bool = field(default=False, metadata=_spec(
        env="MODELD_KV_UNIFIED", parse=parse_bool,
        help="The parallel requests of a model share one pool of n_ctx cells (llama-server's"
        " --kv-unified; true or false): one may use the whole context. Per model in"
        " [model_options.NAME]."))

    def prompt_cache_bytes(self, budget_bytes: int) -> int:
        """The prompt-state cache of one generate-mode runner, in bytes (reserved with its
        estimate), in a memory budget of ``budget_bytes``."""
        if self.prompt_cache_mib is None:
            return prompt_cache_auto(budget_bytes)
        return self.prompt_cache_mib * MiB

    @property
    def keep_alive_s(self) -> float:
        """The default keep-alive in seconds (``math.inf`` = until memory is needed)."""
        return parse_keep_alive(self.keep_alive)

    def to_dict(self) -> dict[str, object]:
        """JSON-safe form (paths as strings; the API key masked: `modeld config` prints this)."""
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, Path):
                data[key] = str(value)
            elif isinstance(value, tuple):
                data[key] = list(value)
        if data.get("api_key"):
            data["api_key"] = "(set)"
        return data

    @property
    def http_address(self) -> tuple[str, int] | None:
        """(host, port) of the HTTP front door, None when it is off."""
        return parse_http_address(self.http)


#: Every setting's declaration, by name (the derived tables below and the daemon's flags).
SETTINGS: dict[str, Setting] = {f.name: f.metadata["setting"] for f in fields(Settings)}
#: Environment variable of each setting that has one.
ENV_VARS: dict[str, str] = {name: s.env for name, s in SETTINGS.items() if s.env}
# Friendlier spellings accepted in the config file and CLI overrides.
_SYNONYMS = {alias: name for name, s in SETTINGS.items() for alias in s.synonyms}

def _canonical(name: str) -> str:
    key = name.strip().replace("-", "_").lower()
    return _SYNONYMS.get(key, key)


def _unknown_key(name: str, where: str) -> InvalidRequestError:
    import difflib  # only on this error path: keeps CLI start-up lean

    known = sorted(SETTINGS) + sorted(_SYNONYMS)
    close = difflib.get_close_matches(_canonical(name), known, n=3)
    hint = (
        f"did you mean {', '.join(close)}?"
        if close
        else f"known settings: {', '.join(sorted(SETTINGS))}"
    )
    return InvalidRequestError(
        f"unknown setting {name!r} in {where}",
        hint=hint,
        details={"key": name, "source": where},
    )


def _convert(name: str, value: object, where: str) -> object:
    try:
        return SETTINGS[name].parse(value)
    except InvalidRequestError as exc:
        raise InvalidRequestError(
            f"invalid value for {name} in {where}: {exc.message}", hint=exc.hint,
            details={"key": name, "value": str(value), "source": where},
        ) from exc
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(
            f"invalid value for {name} in {where}: {exc}",
            hint="see docs/configuration.md for the expected form",
            details={"key": name, "value": str(value), "source": where},
        ) from exc


def _validate(s: Settings, sources: Mapping[str, str]) -> None:
    """Each setting's own check, then the one rule between two settings; the message names
    where the bad value came from."""

    def bad(name: str, why: str) -> InvalidRequestError:
        return InvalidRequestError(
            f"invalid {name} ({getattr(s, name)!r} from {sources.get(name, 'default')}): {why}",
            hint="see docs/configuration.md",
            details={"key": name, "source": sources.get(name, "default")},
        )

    for name, spec in SETTINGS.items():
        value = getattr(s, name)
        if spec.check is not None and value is not None and (why := spec.check(value)):
            raise bad(name, why)
    if s.ctx_ceiling < s.ctx_floor:
        raise bad("ctx_ceiling", f"must be >= ctx_floor ({s.ctx_floor})")
    if s.http_users == "key" and not s.api_key:
        raise bad("http_users", "key needs an api_key (MODELD_API_KEY) for other users to send")


def read_config_file(path: Path) -> dict[str, object]:
    """The raw table of a TOML config file (InvalidRequestError on a syntax error)."""
    import tomllib  # only when a config file exists

    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidRequestError(
            f"config file {path} is not valid TOML: {exc}",
            hint="fix the file or point MODELD_CONFIG elsewhere",
            details={"path": str(path)},
        ) from exc
    except OSError as exc:
        raise InvalidRequestError(
            f"cannot read config file {path}: {exc.strerror or exc}",
            hint="check the path given with --config or MODELD_CONFIG",
            details={"path": str(path)},
        ) from exc


def load_settings(
    cli_overrides: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    config_path: str | os.PathLike[str] | None = None,
) -> tuple[Settings, dict[str, str]]:
    """Build the settings and say where each came from.

    Sources are reported as ``"default"``, ``"config:<path>"``, ``"env:<VAR>"`` or ``"cli"``.
    ``cli_overrides`` values that are None are ignored (unset Typer options). The config file is
    ``config_path``, else ``$MODELD_CONFIG``, else the per-user default; only the default may be
    missing. Unknown keys anywhere raise :class:`InvalidRequestError` naming the key and source.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {name: "default" for name in SETTINGS}

    explicit = config_path is not None or bool(environ.get(CONFIG_ENV))
    if config_path is not None:
        cfg_path = Path(os.fspath(config_path)).expanduser()
    elif environ.get(CONFIG_ENV):
        cfg_path = Path(environ[CONFIG_ENV]).expanduser()
    else:
        cfg_path = paths.config_file()
    if explicit or cfg_path.is_file():
        where = f"config:{cfg_path}"
        for raw_key, raw_value in read_config_file(cfg_path).items():
            name = _canonical(raw_key)
            if name not in SETTINGS:
                raise _unknown_key(raw_key, f"config file {cfg_path}")
            values[name] = _convert(name, raw_value, f"config file {cfg_path}")
            sources[name] = where

    for name, var in ENV_VARS.items():
        also = SETTINGS[name].env_also
        if not (environ.get(var) or "").strip() and also and (environ.get(also) or "").strip():
            var = also
        raw = environ.get(var)
        if raw is not None and raw.strip() != "":
            values[name] = _convert(name, raw, f"environment variable {var}")
            sources[name] = f"env:{var}"

    for raw_key, raw_value in (cli_overrides or {}).items():
        if raw_value is None:
            continue
        name = _canonical(raw_key)
        if name not in SETTINGS:
            raise _unknown_key(raw_key, "command-line options")
        if name == "aliases" and "aliases" in values and isinstance(raw_value, Mapping):
            merged = dict(values["aliases"])
            merged.update(parse_aliases(raw_value))
            values[name] = merged
        else:
            values[name] = _convert(name, raw_value, "command-line options")
        sources[name] = "cli"

    settings = Settings(**values)
    _validate(settings, sources)
    return settings, sources
