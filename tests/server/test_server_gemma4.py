"""Gemma 4 with its assistant, end to end over real HTTP: a Modelfile ``FROM <gemma4 gguf>`` / ``DRAFT <assistant
gguf>`` is created, /api/show names the draft, and /api/chat streams an answer whose final chunk carries the
assistant's ``mtp`` speculation statistics (and equals the answer without speculation)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")

from blobs import BlobStore  # noqa: E402
from server.settings import Settings  # noqa: E402
from tests import hf_tiny_gemma4 as g4  # noqa: E402
from tests.server_thread import SPEC_FIELDS, ServerThread, ndjson  # noqa: E402

TEMPLATE = '''{{- range .Messages }}<|turn>{{ if eq .Role "assistant" }}model{{ else }}{{ .Role }}{{ end }}
{{ .Content }}<turn|>
{{ end }}<|turn>model
'''


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("gemma4")
    target = g4.make_gemma4("e2b", d, chat_template=g4.CHAT_TEMPLATE)
    assistant = g4.make_assistant(target, d)
    wrong = g4.make_assistant(target, d, target_width=96, name="wrong")
    # The old create form reads these local paths: the directory is on the operator's allow-list.
    with ServerThread(BlobStore(d / "models"), Settings(num_thread=1, create_paths=(d,))) as server:
        server.paths = {"target": target.path, "assistant": assistant.path, "wrong": wrong.path}
        server.dir = d
        yield server


@pytest.fixture
def http(srv: ServerThread):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


def _create(http: httpx.Client, srv: ServerThread, name: str, draft: Path) -> httpx.Response:
    modelfile = (f"FROM {srv.paths['target']}\nDRAFT {draft}\nTEMPLATE \"\"\"{TEMPLATE}\"\"\"\n"
                 "PARAMETER temperature 0\nPARAMETER num_predict 12\n")
    path = Path(srv.dir) / f"{name}.Modelfile"
    path.write_text(modelfile)
    return http.post("/api/create", json={"model": name, "modelfile": modelfile, "path": str(path), "stream": False})


def test_create_show_and_chat_with_the_assistant(http: httpx.Client, srv: ServerThread) -> None:
    r = _create(http, srv, "g4", srv.paths["assistant"])
    assert (r.status_code, r.json()) == (200, {"status": "success"})
    show = http.post("/api/show", json={"model": "g4"}).json()
    assert show["details"]["family"] == "gemma4"
    assert show["speculation"]["draft"]["family"] == "gemma4-assistant"
    assert show["speculation"]["effective"]["drafter"] == "mtp"  # what the engine will report

    msgs = [{"role": "user", "content": "the def return"}]
    with http.stream("POST", "/api/chat", json={"model": "g4", "messages": msgs}) as r:
        assert r.status_code == 200
        chunks = ndjson(r)
    *parts, final = chunks
    assert final["done"] and SPEC_FIELDS <= set(final)
    assert final["drafter"] == "mtp+suffix" and final["draft_n"] > 0 and final["eval_count"] == 12
    text = "".join(c["message"]["content"] for c in parts)
    plain = http.post("/api/chat", json={"model": "g4", "messages": msgs, "stream": False,
                                         "options": {"drafter": "none"}}).json()
    assert plain["drafter"] == "none" and plain["message"]["content"] == text


def test_create_refuses_an_assistant_for_another_width(http: httpx.Client, srv: ServerThread) -> None:
    r = _create(http, srv, "g4-wrong", srv.paths["wrong"])
    assert r.status_code == 400
    error = r.json()["error"]
    assert "embedding_length_out" in error and "96" in error and "64" in error


def test_an_assistant_cannot_be_the_model(http: httpx.Client, srv: ServerThread) -> None:
    path = Path(srv.dir) / "only.Modelfile"
    path.write_text(f"FROM {srv.paths['assistant']}\n")
    r = http.post("/api/create", json={"model": "only", "modelfile": path.read_text(), "path": str(path),
                                       "stream": False})
    assert r.status_code == 400 and "DRAFT" in r.json()["error"]


def test_chat_with_the_ggufs_own_jinja_template(http: httpx.Client, srv: ServerThread) -> None:
    """Without a TEMPLATE the GGUF's chat template renders the prompt, as transformers would."""
    from transformers.utils.chat_template_utils import render_jinja_template

    path = Path(srv.dir) / "jinja.Modelfile"
    path.write_text(f"FROM {srv.paths['target']}\nDRAFT {srv.paths['assistant']}\nPARAMETER num_predict 4\n")
    r = http.post("/api/create", json={"model": "g4-jinja", "modelfile": path.read_text(), "path": str(path),
                                       "stream": False})
    assert r.status_code == 200
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<|channel>thought\nx<channel|>Hello!"}, {"role": "user", "content": "More"}]
    shown = http.post("/api/chat", json={"model": "g4-jinja", "messages": msgs, "_debug_render_only": True}).json()
    want = render_jinja_template([msgs], chat_template=g4.CHAT_TEMPLATE, bos_token="<bos>", eos_token="<eos>",
                                 add_generation_prompt=True)[0][0]
    assert shown["_debug_info"]["rendered_template"] == want
    final = http.post("/api/chat", json={"model": "g4-jinja", "messages": msgs, "stream": False}).json()
    assert final["drafter"] == "mtp+suffix" and final["prompt_eval_count"] > 20
