"""python -m benchmarks.embed_load: concurrent single-text /api/embed clients against tandem serve, with the model's slots at 1 (requests one after
another, as before) and auto (requests served together, merged into engine calls)."""
import json, os, shutil, subprocess, sys, tempfile, threading, time, urllib.request
from pathlib import Path
from benchmarks.serving import free_port
from tests.realmodels import minilm_folder

def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())

def serve(parallel):
    home = Path(tempfile.mkdtemp()); port = free_port()
    env = dict(os.environ, TANDEM_HOST=f"127.0.0.1:{port}", TANDEM_MODELS=str(home / "m"), TANDEM_NUM_PARALLEL=str(parallel),
               TANDEM_KEEP_ALIVE="-1", TANDEM_CREATE_PATHS=str(minilm_folder()))
    p = subprocess.Popen([sys.executable, "-m", "server.cli", "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try: urllib.request.urlopen(url + "/api/version", timeout=1); break
        except OSError: time.sleep(0.2)
    post(url + "/api/create", {"model": "mini", "modelfile": f"FROM {minilm_folder()}\n", "stream": False})
    return p, url

def level(url, clients, per_client=8):
    texts = [f"The {i}th sentence of a document being indexed for retrieval, about topic {i % 7}." for i in range(clients * per_client)]
    def client(c):
        for t in texts[c::clients]:
            post(url + "/api/embed", {"model": "mini", "input": t})
    th = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter(); [t.start() for t in th]; [t.join() for t in th]
    return len(texts) / (time.perf_counter() - t0)

if __name__ == "__main__":
    servers = {name: serve(p) for name, p in (("slots 1", 1), ("auto", 0))}
    try:
        for name, (p, url) in servers.items():
            level(url, 2, 2)  # warm
        for rnd in range(2):
            for c in (1, 4, 16):
                row = {name: level(url, c) for name, (p, url) in servers.items()}
                print(f"round {rnd+1} clients {c}: " + ", ".join(f"{k} {v:.1f}/s" for k, v in row.items()) + f" ({row['auto']/row['slots 1']:.2f}x)", flush=True)
    finally:
        for p, _ in servers.values(): p.terminate()
