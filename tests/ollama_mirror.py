"""A local mirror of the Ollama library for Ollama's integration suite (docs/ollama-integration.md): starts Debian's
docker-registry, creates each NAME from a local source (a GGUF, a folder) in a scratch store and pushes it there
under that library name, then serves until interrupted. Point ``tandem serve`` at it with ``TANDEM_REGISTRY`` and the
suite's ``PullIfMissing`` pulls every model it names from the mirror, offline.

    python -m tests.ollama_mirror --folder /tmp/mirror [--port 5000] [--license TEXT] [--parameter K=V] llama3.2:1b=/path/model.gguf \
        all-minilm=/path/dir
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path

from blobs import BlobStore
from importer.registry import push_model
from server.cli.commands import main as tandem
from tests.registry_server import REGISTRY, Registry, free_port


def create_and_push(registry_url: str, pairs: list[tuple[str, str]], scratch: Path, license_text: str = "",
                    parameters: tuple[str, ...] = ()) -> None:
    os.environ["TANDEM_MODELS"] = str(scratch / "models")
    os.environ["TANDEM_HOST"] = f"127.0.0.1:{free_port()}"  # no server there: the CLI creates in the local store
    store = BlobStore(scratch / "models")
    for name, source in pairs:
        modelfile = scratch / f"{name.replace(':', '_').replace('/', '_')}.Modelfile"
        modelfile.write_text(f"FROM {Path(source).resolve()}\n"
                             + (f'LICENSE """{license_text}"""\n' if license_text else "")
                             + "".join(f"PARAMETER {p.replace('=', ' ', 1)}\n" for p in parameters))
        if tandem(["create", name, "-f", str(modelfile)]) != 0:
            raise SystemExit(f"could not create {name} from {source}")
        push_model(store, name, lambda event: None, registry=registry_url)
        print(f"pushed {name} ({store.entry(name).digest[:12]})", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.ollama_mirror", description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", required=True, help="the registry's storage and log")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--license", default="", help="a LICENSE for every model, as the library's models carry one")
    ap.add_argument("--parameter", action="append", default=[], metavar="KEY=VALUE",
                    help="a PARAMETER for every model (e.g. stop=<|im_end|>), as the library's models carry some")
    ap.add_argument("models", nargs="+", metavar="NAME=SOURCE")
    args = ap.parse_args(argv)
    if REGISTRY is None:
        print("docker-registry is not installed (apt-get install docker-registry)", file=sys.stderr)
        return 1
    pairs = [tuple(m.split("=", 1)) for m in args.models]
    registry = Registry(Path(args.folder), port=args.port or None)
    try:
        with tempfile.TemporaryDirectory(prefix="tandem-mirror-") as scratch:
            create_and_push(registry.url, pairs, Path(scratch), args.license, tuple(args.parameter))
        print(f"TANDEM_REGISTRY={registry.url}", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        registry.stop()
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    raise SystemExit(main())
