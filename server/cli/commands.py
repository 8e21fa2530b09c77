"""The `tandem` command line: Ollama's verbs.

`serve` runs the server; `run`, `stop`, `pull` and `bench` talk to it over the API (TANDEM_HOST, else
OLLAMA_HOST); `create` goes through `/api/blobs` + `/api/create` when a server answers; `list`, `show`, `cp`,
`rm` and `ps` ask the server too. When no server answers, `create`, `list`, `show`, `cp` and `rm` work on the
local store (TANDEM_MODELS) and say so on stderr; `ps` then has nothing running to list.

Errors go to stderr as `Error: <message>` with exit status 1, as Ollama's CLI does.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from blobs import BlobsError, BlobStore, ModelNotFoundError
from blobs.model import load_stored_model
from importer import (
    CreateError,
    LocalBlobSink,
    ProgressEvent,
    create_model,
    discarding_new_blobs_on_error,
    request_from_modelfile,
)
from engine.contract.gguf import format_parameter_count
from modelfile import ParseError, parse

from .client import APIError, Client, ServerBlobSink
from .progress import TransferProgress, human_bytes
from .bench.command import add_arguments as bench_arguments
from .train_drafter import add_arguments as train_drafter_arguments
from ..show import model_info, modelfile_text, parameters_text, projector_info


class CLIError(Exception):
    pass


def human_time_ago(t: datetime, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    seconds = max(0, int((now - t).total_seconds()))
    for unit, size in (("year", 365 * 86400), ("month", 30 * 86400), ("week", 7 * 86400), ("day", 86400),
                       ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = seconds // size
            return f"{'About a' if n == 1 and unit == 'hour' else n} {unit}{'s' if n > 1 else ''} ago"
    return "Less than a second ago" if seconds < 1 else f"{seconds} seconds ago"


def _print_progress() -> Callable[[ProgressEvent], None]:
    """A create's progress as lines: each status once, steps with a total at each whole ten percent (quantizing
    reports per tensor)."""
    lines = TransferProgress(tty=False)
    return lambda ev: lines(ev.to_json())


def cmd_create(args: argparse.Namespace, store: BlobStore) -> None:
    store.remove_dead_partials()  # a killed earlier create's partial file goes now, not at the next serve
    client = Client()
    try:
        if client.heartbeat():  # a tandem server: build the model there, like `ollama create`
            _create_remote(args, client)
            return
    finally:
        client.close()
    _create_local(args, store)


def _read_modelfile(args: argparse.Namespace) -> tuple[Path, list]:
    modelfile_path = Path(args.file) if args.file else Path("Modelfile")
    if not modelfile_path.exists():
        raise CLIError(f"open {modelfile_path}: no such file or directory")
    try:
        return modelfile_path, parse(modelfile_path.read_bytes())
    except ParseError as e:
        raise CLIError(str(e)) from None


def _create_remote(args: argparse.Namespace, client: Client) -> None:
    """Parse the Modelfile here, upload the blobs the server lacks (HEAD first), then POST /api/create."""
    modelfile_path, commands = _read_modelfile(args)
    progress = _print_progress()
    progress(ProgressEvent("gathering model components"))

    def uploaded(path: Path, digest: str, sent: bool) -> None:
        if sent:
            progress(ProgressEvent(f"copying file {digest} 100%"))

    warnings: list[str] = []
    req = request_from_modelfile(commands, args.model, modelfile_path.resolve().parent, ServerBlobSink(client, uploaded),
                                 warnings, progress)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    body = create_body(req)
    if args.quantize:
        body["quantize"] = args.quantize
    if args.draft_quantize:
        body["draft_quantize"] = args.draft_quantize
    for event in client.create(body):
        progress(ProgressEvent(event.get("status", ""), event.get("digest"), event.get("total"), event.get("completed")))


def create_body(req) -> dict:
    """A CreateRequest as the /api/create JSON body (empty fields left out, as Go's omitempty does)."""
    body: dict = {"model": req.model}
    for key, value in (("from", req.from_), ("files", req.files), ("draft_files", req.draft_files),
                       ("adapters", req.adapters), ("template", req.template), ("system", req.system),
                       ("license", req.license), ("parameters", req.parameters), ("messages", req.messages),
                       ("quantize", req.quantize), ("draft_quantize", req.draft_quantize),
                       ("renderer", req.renderer), ("parser", req.parser), ("requires", req.requires)):
        if value is not None and value != {} and value != []:
            body[key] = value
    return body


def _build_local(args: argparse.Namespace, store: BlobStore) -> None:
    modelfile_path = Path(args.file) if args.file else Path("Modelfile")
    if not modelfile_path.exists():
        raise CLIError(f"open {modelfile_path}: no such file or directory")
    try:
        commands = parse(modelfile_path.read_bytes())
    except ParseError as e:
        raise CLIError(str(e)) from None
    progress = _print_progress()
    progress(ProgressEvent("gathering model components"))
    sink = LocalBlobSink(store, on_copy=lambda path, digest: progress(ProgressEvent(f"copying file {digest} 100%")))
    warnings: list[str] = []
    req = request_from_modelfile(commands, args.model, modelfile_path.resolve().parent, sink, warnings, progress)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.quantize:
        req.quantize = args.quantize
    if args.draft_quantize:
        req.draft_quantize = args.draft_quantize
    req.check()
    create_model(store, req, progress)


def _create_local(args: argparse.Namespace, store: BlobStore) -> None:
    # The user's files copied in by request_from_modelfile go too if the create then fails.
    with discarding_new_blobs_on_error(store):
        _build_local(args, store)


def _server(store: BlobStore) -> Client | None:
    """A client for the server at TANDEM_HOST (else OLLAMA_HOST) when one answers; otherwise None, after
    saying on stderr that the local store is used instead (Ollama's CLI would fail; tandem can still
    read its store)."""
    client = Client()
    if client.heartbeat() is not None:
        return client
    client.close()
    print(f"tandem: no server answers at {client.base_url}; using the local store {store.root}", file=sys.stderr)
    return None


def _api(call: Callable[[], object]) -> object:
    try:
        return call()
    except APIError as e:
        raise CLIError(str(e)) from None


def cmd_list(args: argparse.Namespace, store: BlobStore) -> None:
    client = _server(store)
    if client is not None:
        with client:
            tags = _api(client.tags)
        rows_in = [(m.get("name", ""), m.get("digest", ""), int(m.get("size", 0)), _parse_time(m["modified_at"]))
                   for m in tags.get("models", [])]  # type: ignore[union-attr]
    else:
        store.remove_dead_partials()  # partial files of killed writers (only those: see BlobStore)
        rows_in = [(e.name.display(), e.digest, e.size, e.modified_at) for e in store.list_models()]
    rows = [("NAME", "ID", "SIZE", "MODIFIED")]
    for name, digest, size, modified in sorted(rows_in, key=lambda r: r[3], reverse=True):
        rows.append((name, digest[:12], human_bytes(size), human_time_ago(modified)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def _section(title: str, rows: list[tuple[str, str]]) -> None:
    print(f"  {title}")
    width = max([20] + [len(key) + 2 for key, _ in rows])  # a long key keeps a gap before its value
    for key, value in rows:
        print(f"    {key:<{width}}{value}")
    print()


def _local_show(store: BlobStore, name: str) -> dict:
    """What /api/show answers, from the local store (the fields `tandem show` prints)."""
    from ..effective_options import engine_info, speculation_info
    from ..prompting import ModelPrompting
    from ..settings import Settings

    model = load_stored_model(store, name)
    settings = Settings.from_env()
    prompting = ModelPrompting(model)
    return {"modelfile": modelfile_text(model), "parameters": parameters_text(model.params),
            "template": prompting.template_text, "system": model.system or "",
            "license": "\n".join(model.licenses), "details": model.details(), "model_info": model_info(model),
            "speculation": speculation_info(model, None, prompting.facts.has_mtp_head),
            "engine": engine_info(model, None, settings), "capabilities": prompting.capabilities(),
            **({"projector_info": projector_info(model)} if model.projector_path is not None else {})}


def _parameter_rows(text: str, tuning: dict) -> list[tuple[str, str]]:
    """Each PARAMETER with, beside a tuned one, where its value came from (`tandem bench --apply`)."""
    from .bench.provenance import describe

    rows = []
    for line in text.splitlines():
        key, value = line[:30].strip(), line[30:].strip()
        claim = tuning.get(key)
        rows.append((key, f"{value:<10} ({describe(claim)})" if isinstance(claim, dict) else value))
    return rows


def cmd_show(args: argparse.Namespace, store: BlobStore) -> None:
    client = _server(store)
    if client is not None:
        with client:
            info: dict = _api(lambda: client.show(args.model))  # type: ignore[assignment]
    else:
        info = _local_show(store, args.model)
    for flag in ("modelfile", "parameters", "template", "system", "license"):
        if getattr(args, flag):
            print(info.get(flag) or "")
            return
    details, mi = info.get("details") or {}, info.get("model_info") or {}
    arch = mi.get("general.architecture") or details.get("family", "")
    rows = [("architecture", arch), ("parameters", details.get("parameter_size", ""))]
    for key, label in (("context_length", "context length"), ("embedding_length", "embedding length")):
        if mi.get(f"{arch}.{key}"):
            rows.append((label, str(mi[f"{arch}.{key}"])))
    rows.append(("quantization", details.get("quantization_level", "")))
    # how the engine holds the weights: the model's PARAMETER, else auto (stored precision for a float file)
    params = dict((line[:30].strip(), line[30:].strip()) for line in (info.get("parameters") or "").splitlines())
    rows.append(("weight format", params.get("weight_format", "auto").strip('"')))
    engine = info.get("engine") or {}
    if engine.get("backend"):
        # for engine auto, why this one (the native engine does not run the architecture, a vision projector)
        rows.append(("engine", engine["backend"] + (f" ({engine['why']})" if engine.get("why") else "")))
    if engine.get("backend") == "vllm":
        method = engine.get("speculative_method")
        rows.append(("speculation", f"{method}, {engine.get('num_speculative_tokens')} tokens" if method else "none"))
    print()
    _section("Model", rows)
    if info.get("capabilities"):  # as `ollama show` lists them
        _section("Capabilities", [(cap, "") for cap in info["capabilities"]])
    projector = info.get("projector_info") or {}
    if projector:  # Ollama's Projector section: the vision encoder's shape
        arch = projector.get("general.architecture", "clip")
        rows = [("architecture", arch), ("parameters", format_parameter_count(int(projector.get("general.parameter_count") or 0)))]
        rows += [(label, str(projector[key])) for key, label in ((f"{arch}.vision.embedding_length", "embedding length"),
                                                                  (f"{arch}.vision.projection_dim", "dimensions"))
                 if key in projector]
        _section("Projector", rows)
    draft = (info.get("speculation") or {}).get("draft")
    if draft:
        rows = [("architecture", draft.get("family", "")), ("parameters", draft.get("parameter_size", "")),
                ("quantization", draft.get("quantization_level", ""))]
        trained = (info.get("speculation") or {}).get("trained_drafter") or {}
        rows += [(f"trained {key.replace('_', ' ')}", str(trained[key]))
                 for key in ("data", "tokens", "steps", "validation_acceptance") if key in trained]
        _section("Draft", rows)
    if info.get("parameters"):
        _section("Parameters", _parameter_rows(info["parameters"], (info.get("speculation") or {}).get("tuning") or {}))
    if info.get("system"):
        _section("System", [(line, "") for line in info["system"].splitlines()[:8]])
    if info.get("license"):
        _section("License", [(line, "") for line in info["license"].splitlines()[:2]])


def cmd_copy(args: argparse.Namespace, store: BlobStore) -> None:
    client = _server(store)
    if client is not None:
        with client:
            _api(lambda: client.copy(args.source, args.destination))
    else:
        store.copy(args.source, args.destination)
    print(f"copied '{args.source}' to '{args.destination}'")


def cmd_rm(args: argparse.Namespace, store: BlobStore) -> None:
    client = _server(store)
    try:
        for name in args.models:
            if client is not None:
                _api(lambda: client.delete(name))
            else:
                store.delete(name)
            print(f"deleted '{name}'")
    finally:
        if client is not None:
            client.close()



# --- server verbs ------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace, store: BlobStore) -> None:
    import logging

    from ..routes.app import create_app
    from ..serving import serve
    from ..settings import Settings

    settings = Settings.from_env()
    logging.basicConfig(level=logging.DEBUG if settings.debug else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings=settings)
    print(f"tandem listening on {settings.host.bind_host}:{settings.host.port} (models: {settings.models})",
          file=sys.stderr)
    # A bounded graceful shutdown: running generations get a short grace, then end with a final error
    # line (server.serving), instead of holding Ctrl-C hostage or being cut mid-stream.
    serve(app, app.state.ctx.lifecycle, settings.host.bind_host, settings.host.port,
          "debug" if settings.debug else "info")


def go_duration(ns: int) -> str:
    """Go's time.Duration.String(): 1.234567s, 12.5ms, 950µs, 1m2.5s."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{_trim(ns / 1_000)}µs"
    if ns < 1_000_000_000:
        return f"{sign}{_trim(ns / 1_000_000)}ms"
    total_s = ns / 1e9
    hours, rem = divmod(ns, 3_600_000_000_000)
    minutes, rem = divmod(rem, 60_000_000_000)
    secs = _trim(rem / 1e9) if rem else "0"
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{sign}{minutes}m{secs}s"
    return f"{sign}{_trim(total_s)}s"


def _trim(x: float) -> str:
    return f"{x:.9f}".rstrip("0").rstrip(".")


def print_stats(final: dict, out=None) -> None:
    """Ollama's `--verbose` summary, then tandem's speculation statistics."""
    out = out or sys.stderr

    def line(label: str, value: str) -> None:
        print(f"{label + ':':<22}{value}", file=out)

    if final.get("total_duration"):
        line("total duration", go_duration(final["total_duration"]))
    if final.get("load_duration"):
        line("load duration", go_duration(final["load_duration"]))
    if final.get("prompt_eval_count"):
        line("prompt eval count", f"{final['prompt_eval_count']} token(s)")
    if final.get("prompt_eval_duration"):
        line("prompt eval duration", go_duration(final["prompt_eval_duration"]))
        line("prompt eval rate", f"{final.get('prompt_eval_count', 0) / (final['prompt_eval_duration'] / 1e9):.2f} tokens/s")
    if final.get("eval_count"):
        line("eval count", f"{final['eval_count']} token(s)")
    if final.get("eval_duration"):
        line("eval duration", go_duration(final["eval_duration"]))
        line("eval rate", f"{final.get('eval_count', 0) / (final['eval_duration'] / 1e9):.2f} tokens/s")
    if "drafter" not in final:
        return
    line("drafter", final["drafter"])
    if final["drafter"] == "none":
        return
    line("draft tokens", str(final.get("draft_n", 0)))
    line("accepted tokens", str(final.get("draft_n_accepted", 0)))
    line("acceptance rate", f"{100 * final.get('acceptance_rate', 0.0):.2f}%")
    line("draft rounds", str(final.get("draft_rounds", 0)))
    line("mean accepted length", f"{final.get('mean_accepted_length', 0.0):.2f} tokens/forward")
    line("mean draft depth", f"{final.get('mean_depth', 0.0):.2f}")
    by_pos = final.get("acceptance_by_position") or []
    if by_pos:
        line("position acceptance", "  ".join(f"{i + 1}: {100 * a:.1f}%" for i, a in enumerate(by_pos)))


def _ensure_model(client: Client, name: str, insecure: bool = False) -> dict:
    """The model's /api/show; pulled first when missing, as `ollama run` does."""
    try:
        return client.show(name)
    except APIError as e:
        if e.status != 404:
            raise
    _pull(client, name, insecure)
    return client.show(name)


def _pull(client: Client, name: str, insecure: bool = False) -> None:
    _transfer(client.pull(name, insecure=insecure))


def _transfer(events) -> None:
    """Draw a pull's or a push's progress stream (server.cli.progress)."""
    progress = TransferProgress()
    try:
        for event in events:
            progress(event)
    finally:
        progress.close()


class _Session:
    """State of a `tandem run` conversation: history, options set with /set, verbosity."""

    def __init__(self, client: Client, model: str, args: argparse.Namespace):
        self.client = client
        self.model = model
        self.messages: list[dict] = []
        self.options: dict = {}
        self.system: str | None = None
        self.verbose = bool(args.verbose)
        self.keep_alive = args.keepalive

    def chat(self, prompt: str, out=None) -> None:
        out = out or sys.stdout
        messages = list(self.messages)
        if self.system:
            messages = [{"role": "system", "content": self.system}] + messages
        messages.append({"role": "user", "content": prompt})
        body: dict = {"model": self.model, "messages": messages}
        if self.options:
            body["options"] = self.options
        if self.keep_alive is not None:
            body["keep_alive"] = self.keep_alive
        parts: list[str] = []
        final: dict = {}
        stream = self.client.chat(body)
        try:
            for part in stream:
                text = part.get("message", {}).get("content", "")
                if text:
                    parts.append(text)
                    out.write(text)
                    out.flush()
                if part.get("done"):
                    final = part
        except KeyboardInterrupt:  # stop this answer, keep the session
            close = getattr(stream, "close", None)
            if close:
                close()
            out.write("\n")
            return
        text = "".join(parts)
        out.write("\n" if not text.endswith("\n") else "")
        if self.verbose and final:
            print_stats(final)
        self.messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}]


_HELP = """Available Commands:
  /set            Set session variables
  /show           Show model information
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command

Use \"\"\" to begin a multi-line message."""

_SET_HELP = """Available Commands:
  /set parameter ...     Set a parameter (incl. draft_num_predict, draft_p_min, draft_n_min,
                         relaxed_top_n, relaxed_scope, draft_schedule, drafter, draft_trace)
  /set system <string>   Set system message
  /set verbose           Show statistics (incl. speculation)
  /set quiet             Disable statistics"""


def _interactive(session: _Session, client: Client) -> None:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    print('>>> Send a message (/? for help)', file=sys.stderr)
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print()
            return
        except KeyboardInterrupt:
            print("\nUse Ctrl + d or /bye to exit.")
            continue
        if line.startswith('"""'):
            lines = [line[3:]]
            while not lines[-1].endswith('"""'):
                try:
                    lines.append(input("... "))
                except EOFError:
                    break
            line = "\n".join(lines)
            line = line[:-3] if line.endswith('"""') else line
        elif line.startswith("/"):
            if _command(session, client, line.strip()):
                return
            continue
        if not line.strip():
            continue
        try:
            session.chat(line)
        except APIError as e:
            print(f"Error: {e}", file=sys.stderr)


def _command(session: _Session, client: Client, line: str) -> bool:
    """Handle a slash command; True means exit."""
    words = line.split()
    cmd = words[0]
    if cmd in ("/bye", "/exit"):
        return True
    if cmd in ("/?", "/help"):
        print(_SET_HELP if len(words) > 1 and words[1] == "set" else _HELP)
    elif cmd == "/clear":
        session.messages = []
        print("Cleared session context")
    elif cmd == "/set":
        _set(session, words[1:], line)
    elif cmd == "/show":
        _show_interactive(session, client, words[1:])
    else:
        print(f"Unknown command '{cmd}'. Type /? for help")
    return False


def _set(session: _Session, args: list[str], line: str) -> None:
    from modelfile import ParamError, format_params

    if not args:
        print(_SET_HELP)
        return
    if args[0] == "parameter":
        if len(args) < 3:
            print("Usage:\n  /set parameter <name> <value>")
            return
        name, value = args[1], " ".join(args[2:])
        try:
            params, _ = format_params({name: [value]})
        except ParamError as e:
            print(f"Couldn't set parameter: {e}")
            return
        for key, val in params.items():
            if key == "stop":
                session.options["stop"] = session.options.get("stop", []) + val
            else:
                session.options[key] = val
        print(f"Set parameter '{name}' to '{value}'")
    elif args[0] == "system":
        session.system = line.split("system", 1)[1].strip().strip('"')
        print("Set system message.")
    elif args[0] == "verbose":
        session.verbose = True
        print("Set 'verbose' mode.")
    elif args[0] == "quiet":
        session.verbose = False
        print("Set 'quiet' mode.")
    else:
        print(f"Unknown command '/set {args[0]}'. Type /? for help")


def _show_interactive(session: _Session, client: Client, args: list[str]) -> None:
    info = client.show(session.model)
    what = args[0] if args else "info"
    if what == "info":
        d = info.get("details", {})
        print(f"  Model\n    architecture        {d.get('family', '')}\n    parameters          {d.get('parameter_size', '')}\n"
              f"    quantization        {d.get('quantization_level', '')}")
        spec = info.get("speculation") or {}
        draft = spec.get("draft")
        if draft:
            print(f"  Draft\n    architecture        {draft.get('family', '')}\n"
                  f"    parameters          {draft.get('parameter_size', '')}\n"
                  f"    quantization        {draft.get('quantization_level', '')}")
        eff = dict(spec.get("effective") or {})
        eff.update({k: v for k, v in session.options.items() if k in eff})
        if eff:
            print("  Speculation")
            for k, v in eff.items():
                print(f"    {k:<20}{v}")
    elif what == "modelfile":
        print(info.get("modelfile", ""))
    elif what == "parameters":
        print(info.get("parameters", "") or "No parameters were specified for this model.")
        for k, v in session.options.items():
            print(f"{k:<30} {v!r}  (this session)")
    elif what == "system":
        print(session.system or info.get("system", "") or "No system message was specified for this model.")
    elif what == "template":
        print(info.get("template", "") or "No prompt template was specified for this model.")
    elif what == "license":
        print(info.get("license", "") or "No license was specified for this model.")
    else:
        print(f"Unknown command '/show {what}'. Type /? for help")


def cmd_run(args: argparse.Namespace, store: BlobStore) -> None:
    client = Client()
    try:
        _ensure_model(client, args.model, args.insecure)
        prompt = " ".join(args.prompt)
        piped = None if sys.stdin.isatty() else sys.stdin.read()
        if piped is not None:
            prompt = f"{piped} {prompt}".strip() if prompt else piped
        if "embedding" in client.show(args.model).get("capabilities", []):
            _print_embedding(client, args, prompt)
            return
        session = _Session(client, args.model, args)
        if piped is not None:
            session.chat(prompt)
        elif prompt:
            session.chat(prompt)
        else:
            _interactive(session, client)
    except APIError as e:
        raise CLIError(str(e)) from None
    finally:
        client.close()


def _print_embedding(client: Client, args: argparse.Namespace, text: str) -> None:
    """Ollama's `run` on an embedding model: the input's vector as one JSON line."""
    if not text:
        raise CLIError(f'embedding models require input text. Usage: tandem run {args.model} "your text here"')
    body: dict = {"model": args.model, "input": text}
    if args.keepalive is not None:
        body["keep_alive"] = args.keepalive
    if args.truncate is not None:
        body["truncate"] = args.truncate
    if args.dimensions:
        body["dimensions"] = args.dimensions
    vectors = client.embed(body).get("embeddings") or []
    if not vectors:
        raise CLIError("no embeddings returned")
    print(json.dumps(vectors[0], separators=(",", ":")))


def human_until(t: datetime, now: datetime | None = None) -> str:
    """Ollama's format.HumanTime for a future time, "Forever" for keep_alive < 0."""
    now = now or datetime.now(timezone.utc)
    if t.year > now.year + 100:
        return "Forever"
    seconds = (t - now).total_seconds()
    if seconds < 0:
        return "Stopping..."
    s = int(seconds)
    if s < 1:
        text = "Less than a second"
    elif s == 1:
        text = "1 second"
    elif s < 60:
        text = f"{s} seconds"
    elif s < 120:
        text = "About a minute"
    elif s < 3600:
        text = f"{s // 60} minutes"
    elif round(s / 3600) == 1:
        text = "About an hour"
    else:
        text = f"{round(s / 3600)} hours"
    return f"{text} from now"


def _parse_time(value: str) -> datetime:
    # RFC3339 with up to 9 fraction digits; Python takes 6.
    import re

    m = re.match(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", value)
    if not m:
        return datetime.now(timezone.utc)
    frac = (m.group(2) or ".0")[:7]
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(m.group(1) + frac + zone)


def cmd_ps(args: argparse.Namespace, store: BlobStore) -> None:
    with Client() as client:
        if client.heartbeat() is None:  # no server: nothing can be running
            print(f"tandem: no server answers at {client.base_url}; no models are running", file=sys.stderr)
            models = []
        else:
            try:
                models = client.ps().get("models", [])
            except APIError as e:
                raise CLIError(str(e)) from None
    rows = [("NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL")]
    for m in models:
        size, vram = m.get("size", 0), m.get("size_vram", 0)
        if vram == 0:
            processor = "100% CPU"
        elif vram >= size:
            processor = "100% GPU"
        else:
            cpu = round(100 * (size - vram) / size)
            processor = f"{cpu}%/{100 - cpu}% CPU/GPU"
        rows.append((m.get("name", ""), m.get("digest", "")[:12], human_bytes(size), processor,
                     str(m.get("context_length", "")), human_until(_parse_time(m.get("expires_at", "")))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def cmd_stop(args: argparse.Namespace, store: BlobStore) -> None:
    with Client() as client:
        try:
            loaded = client.ps().get("models", [])
            wanted = args.model if ":" in args.model.rsplit("/", 1)[-1] else args.model + ":latest"
            if not any(m.get("name") in (args.model, wanted) for m in loaded):
                raise CLIError(f'couldn\'t find model "{args.model}" to stop')
            for _ in client.generate({"model": args.model, "keep_alive": 0}):
                pass
        except APIError as e:
            raise CLIError(str(e)) from None


def cmd_pull(args: argparse.Namespace, store: BlobStore) -> None:
    with Client() as client:
        try:
            _pull(client, args.model, args.insecure)
        except APIError as e:
            raise CLIError(str(e)) from None


def cmd_push(args: argparse.Namespace, store: BlobStore) -> None:
    with Client() as client:
        try:
            _transfer(client.push(args.model, insecure=args.insecure))
        except APIError as e:
            raise CLIError(str(e)) from None


def cmd_train_drafter(args: argparse.Namespace, store: BlobStore) -> None:
    from .train_drafter import TrainDrafterError, modelfile_for, train

    try:
        head = train(args, store)
    except TrainDrafterError as e:
        raise CLIError(str(e)) from None
    modelfile = head.with_suffix(".Modelfile")
    modelfile.write_text(modelfile_for(args.model, head), encoding="utf-8")
    cmd_create(argparse.Namespace(model=args.as_name, file=str(modelfile), quantize=None, draft_quantize=None), store)


def cmd_bench(args: argparse.Namespace, store: BlobStore) -> None:
    from .bench.command import BenchError, run_bench

    try:
        run_bench(args)
    except BenchError as e:
        raise CLIError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tandem", description="An Ollama-compatible model server with speculative decoding")
    sub = p.add_subparsers(dest="command", required=True)

    sv = sub.add_parser("serve", aliases=["start"], help="Start the server (TANDEM_HOST, default 127.0.0.1:11434)")
    sv.set_defaults(func=cmd_serve)

    r = sub.add_parser("run", help="Run a model: one prompt, piped stdin, or an interactive chat")
    r.add_argument("model")
    r.add_argument("prompt", nargs="*")
    r.add_argument("--verbose", action="store_true", help="Show timings and speculation statistics")
    r.add_argument("--keepalive", help="How long the model stays loaded (e.g. 5m, 0, -1)")
    r.add_argument("--nowordwrap", action="store_true", help="Accepted for compatibility (output is not wrapped)")
    r.add_argument("--truncate", type=lambda v: v.lower() in ("1", "true", "yes"), nargs="?", const=True,
                   default=None, help="For embedding models: truncate inputs exceeding the context (default true)")
    r.add_argument("--dimensions", type=int, default=0, help="For embedding models: keep this many dimensions")
    r.add_argument("--insecure", action="store_true", help="Pull a missing model from an insecure registry (http)")
    r.set_defaults(func=cmd_run)

    ps = sub.add_parser("ps", help="List running models")
    ps.set_defaults(func=cmd_ps)

    st = sub.add_parser("stop", help="Stop a running model")
    st.add_argument("model")
    st.set_defaults(func=cmd_stop)

    b = sub.add_parser("bench", help="Benchmark speculation settings (speed, or --quality) against a running server")
    bench_arguments(b)
    b.set_defaults(func=cmd_bench)

    td = sub.add_parser("train-drafter", help="Fit an MTP head to a stored model on this machine and create NAME, "
                                              "the model with the head as its DRAFT")
    train_drafter_arguments(td)
    td.set_defaults(func=cmd_train_drafter)

    pl = sub.add_parser("pull", help="Pull a model from a registry (the Ollama library, host/namespace/model:tag; "
                                     "TANDEM_REGISTRY for names without a host) or from Hugging Face (hf.co/<org>/<repo>[:<quant>])")
    pl.add_argument("model")
    pl.add_argument("--insecure", action="store_true", help="Use an insecure registry (plain http)")
    pl.set_defaults(func=cmd_pull)

    pu = sub.add_parser("push", help="Push a model to a registry (tandem cp it to host/namespace/model:tag first)")
    pu.add_argument("model")
    pu.add_argument("--insecure", action="store_true", help="Use an insecure registry (plain http)")
    pu.set_defaults(func=cmd_push)

    c = sub.add_parser("create", help="Create a model from a Modelfile")
    c.add_argument("model")
    c.add_argument("-f", "--file", help="Name of the Modelfile (default: Modelfile)")
    c.add_argument("-q", "--quantize", help="Quantize the model to this level (e.g. q8_0, q4_0)")
    c.add_argument("--draft-quantize", "--quantize-draft", dest="draft_quantize", help="Quantize the draft model to this level")
    c.set_defaults(func=cmd_create)

    ls = sub.add_parser("list", aliases=["ls"], help="List models")
    ls.set_defaults(func=cmd_list)

    s = sub.add_parser("show", help="Show information for a model")
    s.add_argument("model")
    for flag in ("modelfile", "parameters", "template", "system", "license"):
        s.add_argument(f"--{flag}", action="store_true", help=f"Show the {flag} of the model")
    s.set_defaults(func=cmd_show)

    cp = sub.add_parser("cp", help="Copy a model")
    cp.add_argument("source")
    cp.add_argument("destination")
    cp.set_defaults(func=cmd_copy)

    rm = sub.add_parser("rm", help="Remove a model")
    rm.add_argument("models", nargs="+")
    rm.set_defaults(func=cmd_rm)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    store = BlobStore()
    try:
        args.func(args, store)
    except ModelNotFoundError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except (CLIError, CreateError, BlobsError, ParseError, APIError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
