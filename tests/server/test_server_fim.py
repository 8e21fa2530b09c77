"""Fill-in-the-middle (`suffix`) on /api/generate and /v1/completions: the vocabulary's FIM markers
(engine/contract/special_tokens.py), the `insert` capability, Ollama's refusal, and the real `ollama` and
`openai` clients against a server thread."""

from __future__ import annotations

import httpx
import ollama
import openai
import pytest

from blobs import BlobStore
from engine.contract.gguf import GGUFFile
from engine.contract.special_tokens import FimTokens, find_fim_tokens
from engine.text.tokenizer import Tokenizer
from importer import CreateRequest, create_model
from tests.server_thread import ServerThread, write_pair
from tests.tiny_gguf import TinySpec, write_tiny_gguf

QWEN_FIM = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
PREFIX = "def add(a, b):\n"
SUFFIX = "\n    return c\n"
RENDERED = f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("fim")
    target, draft = write_pair(d)
    fim_target, fim_draft = d / "fim.gguf", d / "fim-draft.gguf"
    # Q8_0, not f32: the engine runs it through the qdot kernels, whose rows round the same at any width, so a
    # greedy answer does not depend on what was drafted. With f32 weights (torch's GEMM, whose rounding follows the
    # number of rows) a near-tie flipped between two requests whose suffix drafts (from the server's earlier
    # answers) differed: CI once saw the /v1 answer and the raw one part at their third token.
    write_tiny_gguf(fim_target, TinySpec(arch="qwen2", seed=1, context_length=4096, extra_specials=QWEN_FIM,
                                         dtype="Q8_0"))
    write_tiny_gguf(fim_draft, TinySpec(arch="qwen2", n_layer=1, seed=2, context_length=4096,
                                        extra_specials=QWEN_FIM, dtype="Q8_0"))
    store = BlobStore(d / "models")
    # A fixed draft depth: an adaptive one follows the clock, and a random tiny model's near-tied logits can
    # then differ in the last bits between two requests verified at other widths (seen once in a CI run:
    # the /v1 answer and the raw one parted at their fifth token).
    params = {"temperature": 0.0, "num_predict": 6, "draft_schedule": "fixed"}
    for name, t, dr in (("tiny", target, draft), ("fim", fim_target, fim_draft)):
        tb, _ = store.add_file(t)
        db, _ = store.add_file(dr)
        create_model(store, CreateRequest(model=name, files={"t.gguf": tb}, draft_files={"d.gguf": db},
                                          parameters=params))
    with ServerThread(store) as server:
        server.fim_path = fim_target
        yield server


@pytest.fixture
def http(srv: ServerThread):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


def _tokenizer(path) -> Tokenizer:
    with GGUFFile(path) as f:
        return Tokenizer.from_gguf_metadata(f.metadata)


# --- finding the markers ------------------------------------------------------------------------


@pytest.mark.parametrize("names,want", [
    (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), FimTokens("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")),
    (("<fim_prefix>", "<fim_middle>", "<fim_suffix>"), FimTokens("<fim_prefix>", "<fim_suffix>", "<fim_middle>")),
    (("▁<PRE>", "▁<SUF>", "▁<MID>"), FimTokens("▁<PRE>", "▁<SUF>", "▁<MID>")),
    (("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"), FimTokens("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>")),
    (("<|fim_prefix|>", "<|fim_suffix|>"), None),  # no middle marker: no FIM
])
def test_find_fim_tokens_by_name(names: tuple[str, ...], want: FimTokens | None) -> None:
    tokens = ["a", "b", *names]
    assert find_fim_tokens(tokens, [1, 1] + [3] * len(names)) == want


def test_find_fim_tokens_metadata_ids_win_and_ordinary_tokens_do_not_count() -> None:
    tokens = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "[P]", "[S]", "[M]"]
    md = {"tokenizer.ggml.fim_pre_token_id": 3, "tokenizer.ggml.fim_suf_token_id": 4,
          "tokenizer.ggml.fim_mid_token_id": 5}
    assert find_fim_tokens(tokens, [3] * 6, md) == FimTokens("[P]", "[S]", "[M]")
    # A marker stored as an ordinary token would be split when the prompt is tokenized.
    assert find_fim_tokens(tokens, [1, 3, 3, 3, 3, 3]) is None


def test_fim_stop_tokens_end_the_middle(srv: ServerThread) -> None:
    """llama.cpp's EOG set for FIM vocabularies: <|fim_pad|>, <|repo_name|>, <|file_sep|>, <|endoftext|>."""
    tok = _tokenizer(srv.fim_path)
    for name in ("<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|endoftext|>"):
        assert tok.token_id(name) in tok.eot_ids
    ids = tok.encode(RENDERED)
    assert ids[0] == tok.token_id("<|fim_prefix|>") and ids[-1] == tok.token_id("<|fim_middle|>")


# --- the server -----------------------------------------------------------------------------------


def test_insert_capability_and_render(http: httpx.Client) -> None:
    assert http.post("/api/show", json={"model": "fim"}).json()["capabilities"] == ["completion", "insert"]
    assert http.post("/api/show", json={"model": "tiny"}).json()["capabilities"] == ["completion"]
    r = http.post("/api/generate", json={"model": "fim", "prompt": PREFIX, "suffix": SUFFIX,
                                         "_debug_render_only": True})
    body = r.json()
    assert r.status_code == 200 and body["_debug_info"] == {"rendered_template": RENDERED}
    assert body["done"] is False and body["response"] == ""
    # The request's system prompt and the chat template play no part in an infill.
    r = http.post("/api/generate", json={"model": "fim", "prompt": PREFIX, "suffix": SUFFIX, "system": "S",
                                         "_debug_render_only": True})
    assert r.json()["_debug_info"]["rendered_template"] == RENDERED
    # Without a suffix the chat template applies as before.
    r = http.post("/api/generate", json={"model": "fim", "prompt": PREFIX, "_debug_render_only": True})
    assert r.json()["_debug_info"]["rendered_template"].startswith("<|im_start|>user\n")


def test_template_with_suffix_wins_over_the_vocabulary(http: httpx.Client) -> None:
    tpl = "{{ if .Suffix }}<PRE> {{ .Prompt }} <SUF>{{ .Suffix }} <MID>{{ else }}{{ .Prompt }}{{ end }}"
    r = http.post("/api/create", json={"model": "fim-tpl", "from": "fim", "template": tpl, "stream": False})
    assert r.status_code == 200
    r = http.post("/api/generate", json={"model": "fim-tpl", "prompt": "a", "suffix": "b", "_debug_render_only": True})
    assert r.json()["_debug_info"]["rendered_template"] == "<PRE> a <SUF>b <MID>"
    # A request template without .Suffix: the vocabulary's markers.
    r = http.post("/api/generate", json={"model": "fim", "prompt": "a", "suffix": "b", "template": "{{ .Prompt }}",
                                         "_debug_render_only": True})
    assert r.json()["_debug_info"]["rendered_template"] == "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>"


def test_refused_without_markers_or_template(http: httpx.Client, srv: ServerThread) -> None:
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "a", "suffix": "b"})
    assert (r.status_code, r.json()) == (400, {"error": '"tiny" does not support insert'})
    # As Ollama: the model's capability decides, whatever the request's raw or template says.
    for extra in ({"raw": True}, {"template": "{{ .Prompt }}<SUF>{{ .Suffix }}"}):
        r = http.post("/api/generate", json={"model": "tiny", "prompt": "a", "suffix": "b", **extra})
        assert (r.status_code, r.json()) == (400, {"error": '"tiny" does not support insert'}), extra
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=srv.url).generate(model="tiny", prompt="a", suffix="b")
    assert e.value.status_code == 400 and e.value.error == '"tiny" does not support insert'
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as oe:
        client.completions.create(model="tiny", prompt="a", suffix="b", max_tokens=3)
    assert '"tiny" does not support insert' in str(oe.value)


def test_ollama_generate_with_suffix(srv: ServerThread, http: httpx.Client) -> None:
    client = ollama.Client(host=srv.url, timeout=120)
    r = client.generate(model="fim", prompt=PREFIX, suffix=SUFFIX)
    tok = _tokenizer(srv.fim_path)
    want_prompt = tok.encode(RENDERED)
    assert r.done and r.eval_count > 0 and r.prompt_eval_count == len(want_prompt)
    assert r.context[:len(want_prompt)] == want_prompt  # the markers were tokenized whole
    # The same text as the rendered layout sent raw (greedy, speculation lossless), and speculation ran.
    raw = http.post("/api/generate", json={"model": "fim", "prompt": RENDERED, "raw": True, "stream": False}).json()
    assert r.response == raw["response"] and r.eval_count == raw["eval_count"]
    assert raw["drafter"] == "model+suffix" and raw["draft_rounds"] > 0
    streamed = "".join(p.response for p in client.generate(model="fim", prompt=PREFIX, suffix=SUFFIX, stream=True))
    assert streamed == r.response


def test_openai_completions_with_suffix(srv: ServerThread, http: httpx.Client) -> None:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    c = client.completions.create(model="fim", prompt=PREFIX, suffix=SUFFIX, max_tokens=5)
    raw = http.post("/api/generate", json={"model": "fim", "prompt": RENDERED, "raw": True, "stream": False,
                                           "options": {"num_predict": 5}}).json()
    assert c.choices[0].text == raw["response"]
    assert c.usage.prompt_tokens == raw["prompt_eval_count"] and c.usage.completion_tokens == raw["eval_count"]
    chunks = client.completions.create(model="fim", prompt=PREFIX, suffix=SUFFIX, max_tokens=5, stream=True)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.choices[0].text


# --- a real code model ------------------------------------------------------------------------------

FUNC_PREFIX = 'def sum_of_squares(values):\n    """Return the sum of the squares of the numbers in values."""\n'
FUNC_SUFFIX = "\n    return total\n"


@pytest.mark.realmodel
def test_qwen_coder_fills_a_function_body(tmp_path) -> None:
    """Qwen2.5-Coder-1.5B (0.5B as its DRAFT) writes the body between a signature and `return total`
    through the real `ollama` client: the spliced function compiles and computes what its docstring says."""
    from tests.realmodels import qwen_gguf

    target, draft = qwen_gguf("1.5b"), qwen_gguf("0.5b")
    if target is None or draft is None:
        pytest.skip("Qwen2.5-Coder 1.5B/0.5B GGUF packages not installed")
    store = BlobStore(tmp_path / "models")
    tb, _ = store.add_file(target)
    db, _ = store.add_file(draft)
    create_model(store, CreateRequest(model="coder", files={"t.gguf": tb}, draft_files={"d.gguf": db},
                                      parameters={"temperature": 0.0}))
    with ServerThread(store) as srv:
        client = ollama.Client(host=srv.url, timeout=600)
        assert "insert" in client.show("coder").capabilities
        r = client.generate(model="coder", prompt=FUNC_PREFIX, suffix=FUNC_SUFFIX, options={"num_predict": 96})
        with httpx.Client(base_url=srv.url, timeout=600) as http:
            again = http.post("/api/generate", json={"model": "coder", "prompt": FUNC_PREFIX, "suffix": FUNC_SUFFIX,
                                                     "stream": False, "options": {"num_predict": 96}}).json()
    middle = r.response
    assert r.done_reason == "stop", middle  # ended at an end-of-generation token, not the length cap
    source = FUNC_PREFIX + middle + FUNC_SUFFIX
    namespace: dict = {}
    exec(compile(source, "<fim>", "exec"), namespace)  # noqa: S102 - the model's own output, checked
    assert namespace["sum_of_squares"]([1, 2, 3]) == 14, source
    assert again["drafter"] == "model+suffix" and again["draft_n_accepted"] > 0  # speculation stayed on
    assert again["response"] == middle
