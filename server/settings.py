"""Server settings from the environment, parsed the way Ollama's envconfig parses its OLLAMA_* twins.

| variable               | Ollama twin             | default                 |
|------------------------|-------------------------|-------------------------|
| TANDEM_HOST            | OLLAMA_HOST             | 127.0.0.1:11434 (http)  |
| TANDEM_MODELS          | OLLAMA_MODELS           | ~/.tandem/models        |
| TANDEM_KEEP_ALIVE      | OLLAMA_KEEP_ALIVE       | 5m                      |
| TANDEM_MAX_QUEUE       | OLLAMA_MAX_QUEUE        | 512                     |
| TANDEM_ORIGINS         | OLLAMA_ORIGINS          | (none beyond the local) |
| TANDEM_NOPRUNE         | OLLAMA_NOPRUNE          | false                   |
| TANDEM_CONTEXT_LENGTH  | OLLAMA_CONTEXT_LENGTH   | 4096                    |
| TANDEM_DEBUG           | OLLAMA_DEBUG            | false                   |
| TANDEM_LOAD_TIMEOUT    | OLLAMA_LOAD_TIMEOUT     | 5m                      |
| TANDEM_ENGINE_TIMEOUT  | (tandem only)           | 10s; 0 = no watchdog    |
| TANDEM_NUM_THREAD      | (tandem only)           | 0 = the engine's choice |
| TANDEM_NUM_PARALLEL    | OLLAMA_NUM_PARALLEL (read too) | 0 = up to 4, as memory allows |
| TANDEM_WEIGHT_FORMAT   | (tandem only)           | auto (see weight_format) |
| TANDEM_ENGINE          | (tandem only)           | auto: native where it runs the model, else llamacpp |
| TANDEM_LLAMA_SERVER    | (tandem only)           | (none): the llama-server to start (default: .venv's, then PATH) |
| TANDEM_LLAMACPP_URL    | (tandem only)           | (none): a running llama-server to attach to instead |
| TANDEM_LLAMACPP_ARGS   | (tandem only)           | (none): more llama-server flags, shell-quoted |
| TANDEM_VLLM_PYTHON     | (tandem only)           | (none): the Python whose vLLM tandem starts |
| TANDEM_VLLM_URL        | (tandem only)           | (none): a running vLLM to attach to instead |
| TANDEM_VLLM_MODEL      | (tandem only)           | (none): the model at TANDEM_VLLM_URL (its first) |
| TANDEM_VLLM_ARGS       | (tandem only)           | (none): more vLLM flags, shell-quoted |
| TANDEM_CREATE_PATHS    | (tandem only)           | (none)                  |
| TANDEM_REGISTRY        | (tandem only)           | (none): the registry serving names without a host (e.g. http://127.0.0.1:5000) instead of registry.ollama.ai |
| TANDEM_REGISTRY_USER, TANDEM_REGISTRY_PASSWORD | (tandem only) | (none): credentials for a registry that asks |

TANDEM_CREATE_PATHS lists the directories (separated by `os.pathsep`, `:` on Linux, as PATH is) whose files an
`/api/create` naming local paths may read; by default none, so files reach the server only as uploaded blobs.
| TANDEM_MAX_REQUEST_BYTES | (tandem only)         | 64 MiB (0 = no limit)   |
| TANDEM_MAX_BLOB_BYTES  | (tandem only)           | 256 GiB (0 = no limit)  |
| TANDEM_QUEUE_TIMEOUT   | (tandem only)           | 10m (0 = no limit)      |
| TANDEM_SUFFIX_TOKENS   | (tandem only)           | 131072: tokens of earlier outputs each loaded model keeps for the suffix drafter (oldest dropped first; 0 = none) |
| TANDEM_STEP_TRACE      | (tandem only)           | (none): a directory where each native engine process appends one line per batched forward (engine.batching.step_trace) |
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from blobs import default_models_root
from engine.contract.options import OPTION_CHOICES
from engine.contract.protocol import DEFAULT_SUFFIX_TOKENS

log = logging.getLogger("tandem.settings")

DEFAULT_PORT = 11434
DEFAULT_KEEP_ALIVE = 300.0  # seconds (Ollama's 5m)
DEFAULT_MAX_QUEUE = 512
DEFAULT_CONTEXT_LENGTH = 4096
DEFAULT_LOAD_TIMEOUT = 300.0  # seconds (Ollama's OLLAMA_LOAD_TIMEOUT 5m)
# Seconds a busy engine may stay silent before it is killed. It beats every second while it works (forwards
# release the GIL, so a long prefill beats too), so ten silent seconds are a frozen engine, not a slow one, and
# its model serves again within about 15 s (docs/watchdog.md); 5 minutes held every request to it that long.
DEFAULT_ENGINE_TIMEOUT = 10.0
DEFAULT_MAX_REQUEST_BYTES = 64 << 20  # a JSON body; prompts of a whole 256k context are a few MB
DEFAULT_MAX_BLOB_BYTES = 256 << 30  # an uploaded blob; larger than any model a local server runs
DEFAULT_QUEUE_TIMEOUT = 600.0  # seconds a request waits for its model before 503
FOREVER: float = math.inf  # keep_alive that never expires (Ollama: time.Duration(math.MaxInt64))


def env_value(env: Mapping[str, str], key: str) -> str:
    """Ollama's envconfig.Var: trimmed of spaces, then of surrounding quotes."""
    return env.get(key, "").strip().strip("\"'")


def env_bool(env: Mapping[str, str], key: str) -> bool:
    """envconfig.Bool: set and not a false-ish strconv.ParseBool value counts as true."""
    value = env_value(env, key)
    if not value:
        return False
    return value not in ("0", "f", "F", "FALSE", "false", "False")


# --- hosts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostSpec:
    """Where the server listens (and where clients connect)."""

    scheme: str
    host: str  # "" = every interface (Ollama's `:PORT` form)
    port: int
    path: str = ""

    @property
    def bind_host(self) -> str:
        return self.host or "0.0.0.0"

    @property
    def connect_host(self) -> str:
        """The address a local client dials: the unspecified address means this machine."""
        if not self.host or self.host in ("0.0.0.0", "::"):
            return "127.0.0.1"
        return self.host

    def url(self) -> str:
        host = self.connect_host
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{self.port}" + (f"/{self.path}" if self.path else "")

    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def _split_host_port(hostport: str) -> tuple[str, str] | None:
    """Go's net.SplitHostPort: requires a port; IPv6 literals in brackets."""
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0 or not hostport[end + 1:].startswith(":"):
            return None
        return hostport[1:end], hostport[end + 2:]
    if hostport.count(":") != 1:
        return None
    host, port = hostport.split(":")
    return host, port


def parse_host(value: str | None) -> HostSpec:
    """envconfig.Host(): optional scheme, default port 11434 (80/443 for an explicit http/https scheme)."""
    s = (value or "").strip().strip("\"'")
    default_port = str(DEFAULT_PORT)
    scheme, sep, hostport = s.partition("://")
    if not sep:
        scheme, hostport = "http", s
        if s == "ollama.com":
            scheme, hostport = "https", "ollama.com:443"
    elif scheme == "http":
        default_port = "80"
    elif scheme == "https":
        default_port = "443"
    hostport, _, path = hostport.partition("/")
    split = _split_host_port(hostport)
    if split is None:
        host, port = "127.0.0.1", default_port
        stripped = hostport.strip("[]")
        try:
            host = str(ipaddress.ip_address(stripped))
        except ValueError:
            if hostport:
                host = hostport
    else:
        host, port = split
    try:
        n = int(port)
        if not 0 <= n <= 65535:
            raise ValueError
    except ValueError:
        n = int(default_port)
    return HostSpec(scheme=scheme, host=host, port=n, path=path.rstrip("/"))


# --- durations ------------------------------------------------------------------------------

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")


class DurationError(ValueError):
    pass


def parse_go_duration(s: str) -> float:
    """Go's time.ParseDuration, in seconds: `300ms`, `-1.5h`, `2h45m`, `0`. Raises with Go's message."""
    orig = s
    if s in ("0", "+0", "-0"):
        return 0.0
    if not s:
        raise DurationError(f'time: invalid duration "{orig}"')
    sign = 1.0
    if s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if not s:
        raise DurationError(f'time: invalid duration "{orig}"')
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None or m.group(1) in ("", "."):
            # Distinguish Go's two messages: digits without a unit vs. garbage.
            rest = s[pos:]
            if re.fullmatch(r"[0-9.]+", rest):
                raise DurationError(f'time: missing unit in duration "{orig}"')
            unit = re.match(r"[0-9.]*([^0-9.]+)", rest)
            if unit and re.match(r"[0-9.]+", rest) and unit.group(1)[:1].isalpha():
                raise DurationError(f'time: unknown unit "{unit.group(1)}" in duration "{orig}"')
            raise DurationError(f'time: invalid duration "{orig}"')
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total


def keep_alive_seconds(value: object, default: float) -> float:
    """A request's `keep_alive` (api.Duration): number = seconds, string = Go duration; negative = forever.

    ``None`` (absent or null) gives the server default. Raises ValueError with the decoder's message.
    """
    if value is None:
        return default
    if isinstance(value, bool):
        raise ValueError("Unsupported type: 'bool'")
    if isinstance(value, (int, float)):
        return FOREVER if value < 0 else float(value)
    if isinstance(value, str):
        seconds = parse_go_duration(value)
        return FOREVER if seconds < 0 else seconds
    raise ValueError(f"Unsupported type: '{_go_type_name(value)}'")


def _go_type_name(value: object) -> str:
    if isinstance(value, list):
        return "[]interface {}"
    if isinstance(value, dict):
        return "map[string]interface {}"
    return type(value).__name__


def _env_seconds(env: Mapping[str, str], key: str, default: float) -> float:
    """A duration variable as Ollama's envconfig reads one: a Go duration, else integer seconds, else
    (unset or unparseable) the default."""
    s = env_value(env, key)
    if s:
        try:
            return parse_go_duration(s)
        except DurationError:
            try:
                return float(int(s))
            except ValueError:
                pass
    return default


def env_keep_alive(env: Mapping[str, str]) -> float:
    """envconfig.KeepAlive(): Go duration, else integer seconds, else 5m; negative = forever."""
    seconds = _env_seconds(env, "TANDEM_KEEP_ALIVE", DEFAULT_KEEP_ALIVE)
    return FOREVER if seconds < 0 else seconds


def _env_uint(env: Mapping[str, str], key: str, default: int) -> int:
    s = env_value(env, key)
    if not s:
        return default
    try:
        n = int(s)
    except ValueError:
        return default
    return n if n >= 0 else default


def env_choice(env: Mapping[str, str], key: str, option: str, default: str) -> str:
    """``key``: one of the ``option`` option's values; anything else is ``default`` (with a warning, as an
    unparseable variable falls back to its default)."""
    value = (env_value(env, key) or default).strip().lower()
    if value not in OPTION_CHOICES[option]:
        log.warning("%s=%r is not one of %s; using %s", key, value, ", ".join(OPTION_CHOICES[option]), default)
        return default
    return value


def env_weight_format(env: Mapping[str, str]) -> str:
    """TANDEM_WEIGHT_FORMAT: one of the ``weight_format`` option's values, else "auto"."""
    return env_choice(env, "TANDEM_WEIGHT_FORMAT", "weight_format", "auto")


@dataclass(frozen=True)
class VllmSettings:
    """Where the vllm engine comes from (engine.vllm): a Python to start vLLM with, or a vLLM to attach to."""

    python: str = ""  # TANDEM_VLLM_PYTHON
    url: str = ""  # TANDEM_VLLM_URL
    model: str = ""  # TANDEM_VLLM_MODEL
    args: tuple[str, ...] = ()  # TANDEM_VLLM_ARGS, split as a shell would

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "VllmSettings":
        try:
            args = tuple(shlex.split(env.get("TANDEM_VLLM_ARGS", "")))
        except ValueError:
            log.warning("TANDEM_VLLM_ARGS is not shell-quoted correctly; ignored")
            args = ()
        return cls(python=env_value(env, "TANDEM_VLLM_PYTHON").strip(), url=env_value(env, "TANDEM_VLLM_URL").strip(),
                   model=env_value(env, "TANDEM_VLLM_MODEL").strip(), args=args)


@dataclass(frozen=True)
class RegistrySettings:
    """Where pulls and pushes of names without a host go (importer.registry), and with what credentials."""

    url: str = ""  # TANDEM_REGISTRY; "" = registry.ollama.ai, as Ollama
    user: str = ""  # TANDEM_REGISTRY_USER
    password: str = ""  # TANDEM_REGISTRY_PASSWORD

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "RegistrySettings":
        return cls(url=env_value(env, "TANDEM_REGISTRY").strip(), user=env_value(env, "TANDEM_REGISTRY_USER"),
                   password=env_value(env, "TANDEM_REGISTRY_PASSWORD"))


def env_timeout(env: Mapping[str, str], key: str, default: float) -> float:
    """A timeout variable: a Go duration or integer seconds (as TANDEM_LOAD_TIMEOUT); unparseable =
    the default; zero or negative = no limit (math.inf)."""
    seconds = _env_seconds(env, key, default)
    return FOREVER if seconds <= 0 else seconds


# --- CORS origins -------------------------------------------------------------------------


def allowed_origins(env: Mapping[str, str]) -> list[str]:
    """envconfig.AllowedOrigins(): TANDEM_ORIGINS first, then the local and app origins."""
    s = env_value(env, "TANDEM_ORIGINS")
    origins = [o.strip() for o in s.split(",")] if s else []
    for host in ("localhost", "127.0.0.1", "0.0.0.0"):
        origins += [f"http://{host}", f"https://{host}", f"http://{host}:*", f"https://{host}:*"]
    origins += ["app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*"]
    return [o for o in origins if o]


def create_paths(env: Mapping[str, str]) -> tuple[Path, ...]:
    """TANDEM_CREATE_PATHS: `os.pathsep`-separated directories (`~` expanded); empty entries ignored."""
    s = env_value(env, "TANDEM_CREATE_PATHS")
    return tuple(Path(p.strip()).expanduser() for p in s.split(os.pathsep) if p.strip())


@dataclass
class Settings:
    host: HostSpec = field(default_factory=lambda: parse_host(None))
    models: Path = field(default_factory=default_models_root)
    keep_alive: float = DEFAULT_KEEP_ALIVE  # seconds; math.inf = forever; 0 = unload after each request
    max_queue: int = DEFAULT_MAX_QUEUE  # waiting requests per model before 503
    origins: list[str] = field(default_factory=lambda: allowed_origins({}))
    noprune: bool = False
    context_length: int = DEFAULT_CONTEXT_LENGTH  # num_ctx when neither model nor request sets it
    debug: bool = False
    load_timeout: float = DEFAULT_LOAD_TIMEOUT  # seconds an engine may take to load; inf = no limit
    num_thread: int = 0  # engine threads when the request does not say (0 = the engine's choice)
    # sequences a loaded model serves at once (engine.batching); 0 = as many as fit, up to 4 (engine.load)
    num_parallel: int = 0
    weight_format: str = "auto"  # the target's weight format when neither model nor request says
    engine: str = "auto"  # the engine when neither model nor request says (TANDEM_ENGINE)
    vllm: VllmSettings = field(default_factory=VllmSettings)
    registry: RegistrySettings = field(default_factory=RegistrySettings)
    create_paths: tuple[Path, ...] = ()  # directories an HTTP create may read local files from
    engine_timeout: float = DEFAULT_ENGINE_TIMEOUT  # the watchdog's bound (server.lifecycle); inf = off
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # request body size before 413; 0 = no limit
    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES  # /api/blobs upload size before 413; 0 = no limit
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT  # seconds waiting for a busy model before 503; inf = none
    # tokens of earlier outputs each loaded model keeps for the suffix drafter (TANDEM_SUFFIX_TOKENS)
    suffix_tokens: int = DEFAULT_SUFFIX_TOKENS
    # a directory where each native engine process traces its step loop's forwards (TANDEM_STEP_TRACE); "" = none
    step_trace: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        models = env_value(env, "TANDEM_MODELS")
        ctx = _env_uint(env, "TANDEM_CONTEXT_LENGTH", 0) or DEFAULT_CONTEXT_LENGTH
        load_timeout = env_timeout(env, "TANDEM_LOAD_TIMEOUT", DEFAULT_LOAD_TIMEOUT)
        return cls(
            host=parse_host(env_value(env, "TANDEM_HOST")),
            models=Path(models) if models else default_models_root(),
            keep_alive=env_keep_alive(env),
            max_queue=_env_uint(env, "TANDEM_MAX_QUEUE", DEFAULT_MAX_QUEUE),
            origins=allowed_origins(env),
            noprune=env_bool(env, "TANDEM_NOPRUNE"),
            context_length=ctx,
            debug=env_bool(env, "TANDEM_DEBUG"),
            load_timeout=load_timeout,
            num_thread=_env_uint(env, "TANDEM_NUM_THREAD", 0),
            # an Ollama user's OLLAMA_NUM_PARALLEL is honoured too (TANDEM_ first)
            num_parallel=_env_uint(env, "TANDEM_NUM_PARALLEL", _env_uint(env, "OLLAMA_NUM_PARALLEL", 0)),
            weight_format=env_weight_format(env),
            engine=env_choice(env, "TANDEM_ENGINE", "engine", "auto"),
            vllm=VllmSettings.from_env(env),
            registry=RegistrySettings.from_env(env),
            create_paths=create_paths(env),
            engine_timeout=env_timeout(env, "TANDEM_ENGINE_TIMEOUT", DEFAULT_ENGINE_TIMEOUT),
            max_request_bytes=_env_uint(env, "TANDEM_MAX_REQUEST_BYTES", DEFAULT_MAX_REQUEST_BYTES),
            max_blob_bytes=_env_uint(env, "TANDEM_MAX_BLOB_BYTES", DEFAULT_MAX_BLOB_BYTES),
            queue_timeout=env_timeout(env, "TANDEM_QUEUE_TIMEOUT", DEFAULT_QUEUE_TIMEOUT),
            suffix_tokens=_env_uint(env, "TANDEM_SUFFIX_TOKENS", DEFAULT_SUFFIX_TOKENS),
            step_trace=env_value(env, "TANDEM_STEP_TRACE"),
        )

