"""The `tandem` command line: Ollama's verbs, working on the local model store.

Errors go to stderr as `Error: <message>` with exit status 1, as Ollama's CLI does.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from blobs import BlobsError, BlobStore, ModelNotFoundError
from blobs.model import load_stored_model
from importer import CreateError, LocalBlobSink, ProgressEvent, create_model, request_from_modelfile
from modelfile import ParseError, parse

from .show import modelfile_text, parameters_text


class CLIError(Exception):
    pass


def human_bytes(n: int) -> str:
    """Ollama's format.HumanBytes (decimal units)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n} B"


def human_time_ago(t: datetime, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    seconds = max(0, int((now - t).total_seconds()))
    for unit, size in (("year", 365 * 86400), ("month", 30 * 86400), ("week", 7 * 86400), ("day", 86400),
                       ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = seconds // size
            return f"{'About a' if n == 1 and unit == 'hour' else n} {unit}{'s' if n > 1 else ''} ago"
    return "Less than a second ago" if seconds < 1 else f"{seconds} seconds ago"


def _print_progress(out: Callable[[str], None]) -> Callable[[ProgressEvent], None]:
    last: list[str] = [""]

    def show(ev: ProgressEvent) -> None:
        if ev.total:
            pct = int(100 * (ev.completed or 0) / ev.total)
            line = f"{ev.status} {pct}%"
            # Quantizing reports per tensor; print each whole ten percent once.
            if pct % 10 and pct != 100:
                return
        else:
            line = ev.status
        if line != last[0]:
            out(line)
            last[0] = line

    return show


def cmd_create(args: argparse.Namespace, store: BlobStore) -> None:
    modelfile_path = Path(args.file) if args.file else Path("Modelfile")
    if not modelfile_path.exists():
        raise CLIError(f"open {modelfile_path}: no such file or directory")
    try:
        commands = parse(modelfile_path.read_bytes())
    except ParseError as e:
        raise CLIError(str(e)) from None
    progress = _print_progress(print)
    progress(ProgressEvent("gathering model components"))
    sink = LocalBlobSink(store, on_copy=lambda path, digest: progress(ProgressEvent(f"copying file {digest} 100%")))
    warnings: list[str] = []
    req = request_from_modelfile(commands, args.model, modelfile_path.resolve().parent, sink, warnings)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.quantize:
        req.quantize = args.quantize
    if args.draft_quantize:
        req.draft_quantize = args.draft_quantize
    req.check()
    create_model(store, req, progress)


def cmd_list(args: argparse.Namespace, store: BlobStore) -> None:
    entries = sorted(store.list_models(), key=lambda e: e.modified_at, reverse=True)
    rows = [("NAME", "ID", "SIZE", "MODIFIED")]
    for e in entries:
        rows.append((e.name.display(), e.digest[:12], human_bytes(e.size), human_time_ago(e.modified_at)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def _section(title: str, rows: list[tuple[str, str]]) -> None:
    print(f"  {title}")
    for key, value in rows:
        print(f"    {key:<20}{value}")
    print()


def cmd_show(args: argparse.Namespace, store: BlobStore) -> None:
    model = load_stored_model(store, args.model)
    if args.modelfile:
        print(modelfile_text(model))
        return
    if args.parameters:
        print(parameters_text(model.params))
        return
    if args.template:
        print(model.template or "")
        return
    if args.system:
        print(model.system or "")
        return
    if args.license:
        print("\n".join(model.licenses))
        return
    c = model.config
    arch = c.get("model_family", "")
    rows = [("architecture", arch), ("parameters", c.get("model_type", ""))]
    if c.get("context_length"):
        rows.append(("context length", str(c["context_length"])))
    if c.get("embedding_length"):
        rows.append(("embedding length", str(c["embedding_length"])))
    rows.append(("quantization", c.get("file_type", "")))
    print()
    _section("Model", rows)
    if model.draft_path is not None:
        from engine.gguf import GGUFFile, format_parameter_count

        with GGUFFile(model.draft_path) as f:
            _section("Draft", [("architecture", f.architecture), ("parameters", format_parameter_count(f.parameter_count)),
                               ("quantization", f.file_type)])
    if model.params:
        _section("Parameters", [(line[:30].strip(), line[30:].strip()) for line in parameters_text(model.params).splitlines()])
    if model.system:
        _section("System", [(line, "") for line in model.system.splitlines()[:8]])
    if model.licenses:
        _section("License", [(line, "") for line in model.licenses[0].splitlines()[:2]])


def cmd_copy(args: argparse.Namespace, store: BlobStore) -> None:
    store.copy(args.source, args.destination)
    print(f"copied '{args.source}' to '{args.destination}'")


def cmd_rm(args: argparse.Namespace, store: BlobStore) -> None:
    for name in args.models:
        store.delete(name)
        print(f"deleted '{name}'")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tandem", description="An Ollama-compatible model server with speculative decoding")
    sub = p.add_subparsers(dest="command", required=True)

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
    except (CLIError, CreateError, BlobsError, ParseError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
