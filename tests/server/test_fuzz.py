"""Issue 15's fuzz test: a few hundred generated bad requests against every endpoint of a real server
(tiny model, real engine process), seeded so a failure replays exactly.

What counts as handled: no 5xx except where Ollama itself answers 500 (`OLLAMA_500S`), no Python
exception text in the answer (no traceback, no `ValueError:`-style class-name prefix), errors in
Ollama's `{"error": ...}` shape (OpenAI's under /v1), and afterwards a normal generate still works.
Nothing here reaches the network (pull gets invalid names or names without a host, and the server's
`TANDEM_REGISTRY` is a closed loopback port) or reads a server path (create gets no Modelfile FROM paths), and
nothing deletes the model the checks use.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx
import pytest

from server.settings import RegistrySettings, Settings
from tests.server_thread import ServerThread, free_port, make_store

SEED = 15
CASES = 360
BUDGET_S = 30.0  # the whole run; 2-15 s here (the first engine load dominates)

#: Where Ollama answers 500 for a client's mistake, so tandem does too: a wrong option type on
#: generate/chat (`option "x" must be of type ...`, from Options.FromMap inside the handler).
OLLAMA_500S = [
    (("/api/generate", "/api/chat"), re.compile(r'^option "[^"]*" must be (of type \w+|of an array of strings)$')),
    # a pull whose registry does not answer (here: none listens), `stream: false`
    (("/api/pull",), re.compile(r'^pull model manifest: Get "http://127\.0\.0\.1:\d+/v2/[^"]+": connection refused$')),
]

#: Python exception text: a traceback or an exception class name used as a message prefix.
LEAK = re.compile(r"Traceback|\b[A-Z]\w*(Error|Exception|Warning|Interrupt|Exit)\b:|\bErrno\b")


@dataclass
class Case:
    method: str
    path: str
    body: bytes | None = None
    what: str = ""


# --- value generators --------------------------------------------------------------------------


def _nested(rng: random.Random) -> str:
    depth = rng.choice([50, 129, 500, 2000, 100_000 // 10])
    return "[" * depth + "]" * depth if rng.random() < 0.5 else "[" * depth


BAD_SCALARS_JSON = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e308", str(10**30), str(-10**30),
                    str(2**63), str(-2**63 - 1), "0.5", "-1", "0", "true", "false", "null", '""', '"abc"',
                    '"\\ud800"', '"x\\udfffy"', '"\\u0000"', "[]", "{}", '["a", 1]', "[[[[]]]]", '{"a": {"b": []}}',
                    "1" * 5000]


def bad_value(rng: random.Random) -> str:
    """A JSON text for a field value that is wrong for most fields (or not JSON at all)."""
    r = rng.random()
    if r < 0.08:
        return _nested(rng)
    if r < 0.12:
        return rng.choice(["tru", "nul", "'single'", "0x10", "+1", ".5", "01", "--1", "\"unterminated"])
    return rng.choice(BAD_SCALARS_JSON)


BAD_NAMES = ["", " ", "nope", "nope:latest", "../../etc/passwd", "a/b/c/d/e", ":::", "x" * 400, "tiny:" + "t" * 200,
             "UPPER/Case:Tag", "hf.co/", "hf.co/org", "\\ud800", "name with spaces", "a\u0000b", "~user/x", "tiny@sha256:00",
             "registry.ollama.ai/library/nope", "example.com/ns/model:tag", "-", ".", "..", "tiny/../../x"]

OPTION_NAMES = ["num_predict", "num_ctx", "temperature", "top_k", "top_p", "min_p", "stop", "seed", "num_keep",
                "repeat_penalty", "draft_num_predict", "n_max", "relaxed_top_n", "draft_p_min", "draft_n_min",
                "drafter", "draft_schedule", "draft_acceptance", "draft_trace", "use_mmap", "main_gpu", "num_thread",
                "num_batch", "num_gpu", "typical_p", "unknown_option"]

# Values a request could validly carry but which would make the run slow (a long generation): never sent.
SLOW = {("num_predict", v) for v in ("1e308", str(10**30), str(2**63), "-1", "0.5")}


def bad_options(rng: random.Random) -> str:
    if rng.random() < 0.15:
        return bad_value(rng)
    items = []
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(OPTION_NAMES)
        value = bad_value(rng)
        while (name, value) in SLOW or (name == "num_predict" and value in ("true", "false", "null", "0")):
            value = rng.choice(['"abc"', "[]", "{}", "NaN", "true"])
        items.append(f"{json.dumps(name)}: {value}")
    items.append('"num_predict": 2')  # a request that gets through is short
    return "{" + ", ".join(items) + "}"


def obj(fields: dict[str, str]) -> bytes:
    """A JSON object from already-encoded values (so invalid JSON can be embedded)."""
    return ("{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in fields.items()) + "}").encode("utf-8", "surrogatepass")


def malformed(rng: random.Random, good: bytes) -> bytes:
    kind = rng.randrange(8)
    if kind == 0:
        return good[: rng.randrange(1, max(2, len(good)))]  # truncated
    if kind == 1:
        return b""
    if kind == 2:
        return rng.choice([b"[]", b"1", b'"s"', b"null", b"true", b"[{}]"])  # not an object
    if kind == 3:
        return good + b"garbage"
    if kind == 4:
        return b"\xff\xfe" + good  # not UTF-8
    if kind == 5:
        return good.replace(b":", b"=", 1)
    if kind == 6:
        return _nested(rng).encode()
    return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))


def model_value(rng: random.Random, p_tiny: float = 0.05) -> str:
    if rng.random() < p_tiny:
        return '"tiny"'  # the one model there is: the request gets as far as its other fields allow
    if rng.random() < 0.3:
        return rng.choice(['"tiny"', "1", "null", "[]", '{"a": 1}', "true", "NaN"])
    return json.dumps(rng.choice(BAD_NAMES), ensure_ascii=True).replace("\\\\ud800", "\\ud800")


# --- endpoint generators -----------------------------------------------------------------------


def gen_generate(rng: random.Random) -> Case:
    fields = {"model": model_value(rng, 0.5), "prompt": rng.choice(['"hi"', bad_value(rng)]), "stream": "false"}
    extra = rng.choice(["options", "context", "format", "keep_alive", "images", "raw", "system", "template",
                        "top_logprobs", "think", "suffix", "stream"])
    fields[extra] = bad_options(rng) if extra == "options" else bad_value(rng)
    if extra == "context":
        fields[extra] = rng.choice(["[-1]", "[99999999]", f"[{2**70}]", '["a"]', "[1.5]", "[NaN]", bad_value(rng)])
    fields.setdefault("options", '{"num_predict": 2}')
    body = obj(fields)
    return Case("POST", "/api/generate", malformed(rng, body) if rng.random() < 0.25 else body, extra)


def gen_chat(rng: random.Random) -> Case:
    msg = rng.choice(['{"role": "user", "content": "hi"}', '{"role": 1, "content": "hi"}', '{"content": null}',
                      '{"role": "user", "content": "\\ud800"}', '{"role": "user", "content": ["x"]}',
                      '{"role": "user", "content": "hi", "images": ["!!"]}', '"just a string"', bad_value(rng)])
    fields = {"model": model_value(rng, 0.5), "messages": rng.choice([f"[{msg}]", msg, bad_value(rng)]),
              "stream": "false"}
    extra = rng.choice(["options", "format", "tools", "keep_alive", "think", "top_logprobs"])
    fields[extra] = bad_options(rng) if extra == "options" else bad_value(rng)
    fields.setdefault("options", '{"num_predict": 2}')
    body = obj(fields)
    return Case("POST", "/api/chat", malformed(rng, body) if rng.random() < 0.25 else body, extra)


def gen_create(rng: random.Random) -> Case:
    fields = {"model": rng.choice([json.dumps(f"fuzz{rng.randrange(1000)}"), model_value(rng)]), "stream": "false"}
    kind = rng.choice(["parameters", "files", "from", "template", "modelfile", "messages", "license", "quantize"])
    if kind == "parameters":
        fields["from"] = '"tiny"'
        fields["parameters"] = bad_options(rng)
    elif kind == "files":
        fields["files"] = rng.choice(['{"a.gguf": "sha256:00"}', '{"a.gguf": "sha256:' + "0" * 64 + '"}',
                                      '{"../x": "sha256:' + "1" * 64 + '"}', "[]", bad_value(rng)])
    elif kind == "from":
        fields["from"] = rng.choice([json.dumps(n) for n in BAD_NAMES if not n.startswith("hf.co")] + [bad_value(rng)])
    elif kind == "template":
        fields["from"] = '"tiny"'
        fields["template"] = rng.choice(['"{{ .Prompt "', '"{{ end }}"', '"{{ range }}"', bad_value(rng)])
    elif kind == "modelfile":
        fields["modelfile"] = rng.choice(['"PARAMETER num_ctx abc"', '"FROM"', '"NOTACOMMAND x"', '"FROM tiny\\nPARAMETER stop"',
                                          '"FROM nope-model"', '"FROM tiny\\nPARAMETER relaxed_top_n -1"', bad_value(rng)])
    elif kind == "messages":
        fields["from"] = '"tiny"'
        fields["messages"] = rng.choice(['[{"role": 1}]', '"x"', "[1]", bad_value(rng)])
    elif kind == "license":
        fields["from"] = '"tiny"'
        fields["license"] = rng.choice(["[1, 2]", "{}", bad_value(rng)])
    else:
        fields["from"] = '"tiny"'
        fields["quantize"] = rng.choice(['"q1_x"', "5", bad_value(rng)])
    body = obj(fields)
    return Case("POST", "/api/create", malformed(rng, body) if rng.random() < 0.2 else body, kind)


def gen_blobs(rng: random.Random) -> Case:
    data = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
    digest = rng.choice(["sha256:123", "md5:" + "0" * 64, "sha256-" + "g" * 64, "sha256:" + "0" * 64,
                         "sha256:" + hashlib.sha256(data).hexdigest().upper(), "%2e%2e%2fetc", "sha256:" + "a" * 65,
                         "..", "sha256:" + hashlib.sha256(data + b"x").hexdigest()])
    method = rng.choice(["POST", "POST", "HEAD"])
    return Case(method, f"/api/blobs/{digest}", data if method == "POST" else None, "blob")


def gen_name_endpoint(path: str, method: str, keys: tuple[str, ...]) -> Callable[[random.Random], Case]:
    def gen(rng: random.Random) -> Case:
        fields = {k: model_value(rng) for k in keys if rng.random() < 0.85}
        if path == "/api/delete" and fields.get("model") == '"tiny"':
            fields["model"] = '"nope"'  # never delete the model the checks use
        if path == "/api/copy" and fields.get("destination") == '"tiny"':
            fields["destination"] = '"nope"'
        if path == "/api/pull":
            fields = {"model": json.dumps(rng.choice([n for n in BAD_NAMES if n not in ("hf.co/org",) and
                                                      not n.startswith("example.com")])), "stream": "false"}
        if path == "/api/show" and rng.random() < 0.3:
            fields["options"] = bad_options(rng)
        body = obj(fields)
        return Case(method, path, malformed(rng, body) if rng.random() < 0.3 else body, "name")
    return gen


def gen_get(path: str) -> Callable[[random.Random], Case]:
    def gen(rng: random.Random) -> Case:
        method = rng.choice(["GET", "GET", "HEAD", "POST", "PUT", "DELETE"])
        return Case(method, path, obj({"x": bad_value(rng)}) if method != "GET" and method != "HEAD" else None, "get")
    return gen


def gen_openai_chat(rng: random.Random) -> Case:
    fields = {"model": model_value(rng, 0.5), "messages": rng.choice(['[{"role": "user", "content": "hi"}]', '[{"role": "x"}]',
                                                                   '[{"role": "user", "content": "\\udfff"}]', bad_value(rng)])}
    extra = rng.choice(["max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "stream",
                        "response_format", "tools", "frequency_penalty", "stream_options", "n"])
    fields[extra] = bad_value(rng)
    if extra in ("max_tokens", "max_completion_tokens") and fields[extra] in ("1e308", str(10**30), str(2**63), "0.5"):
        fields[extra] = rng.choice(["0", "-1", '"many"'])
    fields.setdefault("max_tokens", "2")
    body = obj(fields)
    return Case("POST", "/v1/chat/completions", malformed(rng, body) if rng.random() < 0.25 else body, extra)


def gen_openai_completions(rng: random.Random) -> Case:
    fields = {"model": model_value(rng, 0.5), "prompt": rng.choice(['"hi"', '["a", "b"]', "[1, 2]", bad_value(rng)])}
    extra = rng.choice(["max_tokens", "temperature", "suffix", "echo", "logprobs", "stop", "seed"])
    fields[extra] = bad_value(rng)
    if extra == "max_tokens" and fields[extra] in ("1e308", str(10**30), str(2**63), "0.5"):
        fields[extra] = rng.choice(["0", "-5"])
    fields.setdefault("max_tokens", "2")
    body = obj(fields)
    return Case("POST", "/v1/completions", malformed(rng, body) if rng.random() < 0.25 else body, extra)


def gen_openai_model(rng: random.Random) -> Case:
    name = rng.choice(["nope", "..%2f..%2fetc", "a:b:c", "%ud800", "x" * 300, "tiny", ""])
    return Case("GET", f"/v1/models/{name}" if rng.random() < 0.8 else "/v1/models", None, "model")


GENERATORS: list[Callable[[random.Random], Case]] = [
    gen_generate, gen_generate, gen_chat, gen_chat, gen_create, gen_blobs,
    gen_name_endpoint("/api/show", "POST", ("model", "verbose")),
    gen_name_endpoint("/api/copy", "POST", ("source", "destination")),
    gen_name_endpoint("/api/delete", "DELETE", ("model",)),
    gen_name_endpoint("/api/pull", "POST", ("model",)),
    gen_get("/api/ps"), gen_get("/api/tags"), gen_get("/api/version"), gen_get("/v1/models"),
    gen_openai_chat, gen_openai_chat, gen_openai_completions, gen_openai_model,
]


def cases(seed: int = SEED, n: int = CASES) -> list[Case]:
    rng = random.Random(seed)
    out = [gen(rng) for gen in GENERATORS]  # every endpoint at least once
    while len(out) < n:
        out.append(rng.choice(GENERATORS)(rng))
    return out


# --- judging -----------------------------------------------------------------------------------


def error_text(path: str, body: Any) -> str | None:
    if not isinstance(body, dict) or "error" not in body:
        return None
    err = body["error"]
    return err.get("message") if path.startswith("/v1/") and isinstance(err, dict) else err


def judge(case: Case, r: httpx.Response) -> str | None:
    """None when handled; else what is wrong."""
    text = r.text
    if LEAK.search(text):
        return f"exception text: {text[:200]!r}"
    if r.status_code >= 500:
        try:
            message = error_text(case.path, r.json())
        except ValueError:
            message = None
        allowed = any(case.path in paths and message is not None and pattern.match(message)
                      for paths, pattern in OLLAMA_500S)
        if not allowed:
            return f"{r.status_code}: {text[:200]!r}"
    if r.status_code >= 400 and case.method != "HEAD" and r.status_code not in (404, 405) or (
            r.status_code == 404 and text.startswith("{")):
        try:
            message = error_text(case.path, r.json())
        except ValueError:
            return f"{r.status_code} not JSON: {text[:200]!r}"
        if not isinstance(message, str) or not message:
            return f"{r.status_code} without an error message: {text[:200]!r}"
    return None


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    registry = RegistrySettings(url=f"http://127.0.0.1:{free_port()}")  # closed: library names pull from nowhere
    with ServerThread(make_store(tmp_path_factory.mktemp("fuzz")), Settings(num_thread=1, registry=registry)) as server:
        yield server


def test_cases_are_deterministic() -> None:
    assert [(c.method, c.path, c.body) for c in cases()] == [(c.method, c.path, c.body) for c in cases()]
    def route(path: str) -> str:
        if path.startswith("/api/blobs/"):
            return "/api/blobs/{digest}"
        return "/v1/models/{model}" if path.startswith("/v1/models/") else path

    assert {route(c.path) for c in cases()} == {
        "/api/generate", "/api/chat", "/api/create", "/api/blobs/{digest}", "/api/show", "/api/copy", "/api/delete",
        "/api/pull", "/api/ps", "/api/tags", "/api/version", "/v1/chat/completions", "/v1/completions", "/v1/models",
        "/v1/models/{model}"}


def test_fuzz(srv: ServerThread, capsys: pytest.CaptureFixture) -> None:
    all_cases = cases()
    wrong: list[str] = []
    statuses: dict[int, int] = {}
    t0 = time.monotonic()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for i, case in enumerate(all_cases):
            assert time.monotonic() - t0 < BUDGET_S, f"fuzz run over budget at case {i}"
            try:
                r = c.request(case.method, case.path, content=case.body,
                              headers={"content-type": "application/json"} if case.body is not None else None)
            except httpx.TransportError as e:
                wrong.append(f"#{i} {case.method} {case.path} ({case.what}): no answer ({type(e).__name__})")
                continue
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            problem = judge(case, r)
            if problem:
                wrong.append(f"#{i} {case.method} {case.path} ({case.what}): {problem}  body={case.body[:120]!r}"
                             if case.body else f"#{i} {case.method} {case.path}: {problem}")
        # healthy afterwards: a normal generate succeeds
        r = c.post("/api/generate", json={"model": "tiny", "prompt": "hello", "stream": False,
                                          "options": {"num_predict": 4}})
        assert r.status_code == 200 and r.json()["done"] is True, r.text
    elapsed = time.monotonic() - t0
    with capsys.disabled():
        print(f"\nfuzz: tried {len(all_cases)}, handled {len(all_cases) - len(wrong)}, wrong {len(wrong)} "
              f"in {elapsed:.1f}s; statuses {dict(sorted(statuses.items()))}")
    assert not wrong, "\n".join(wrong[:40])
