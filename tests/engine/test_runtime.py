"""engine.runtime / engine.text.stops: the request path around the decode loop (issue 3 items 4-6).

Stop strings as pure functions; then a tiny model through ``ModelRuntime``: facts, prompt handling,
prefix reuse counts, seeds, num_ctx truncation and context shift, logprobs; and the real engine
process through ``server.engine_process.client.EngineClient`` (load, stream, cancel, crash).
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from engine.contract.options import Options
from engine.contract.protocol import (
    ContextLengthError,
    EngineCrashedError,
    EngineError,
    GenerateRequest,
    GenerateResult,
    LoadSpec,
)
from engine.sampling.sampler import SamplingOptions, process
from engine.text.stops import StopMatcher, TextStream
from tests.engine.speculative.test_speculation import (
    GREEDY,
    PROMPT,
    generate,
    load_engine,
    spec_opts,
    write_model,
)


# ------------------------------------------------------------------------------------------------
# stop strings (pure)
# ------------------------------------------------------------------------------------------------
def feed(stops, parts):
    m = StopMatcher(stops)
    out, stopped = [], False
    for p in parts:
        text, stopped = m.push(p)
        out.append(text)
        if stopped:
            break
    if not stopped:
        out.append(m.flush())
    return out, stopped


def test_stop_matcher_passes_text_through_without_stops():
    assert feed([], ["a", "b"]) == (["a", "b", ""], False)
    assert feed(["", None or ""], ["a"]) == (["a", ""], False)


def test_stop_inside_one_piece_cuts_before_it():
    assert feed(["END"], ["abcENDxyz"]) == (["abc"], True)


def test_stop_split_across_pieces_is_held_back_then_dropped():
    out, stopped = feed(["\nUser:"], ["Hello", "\nUs", "er", ": hi"])
    assert stopped and out == ["Hello", "", "", ""]
    assert "".join(out) == "Hello"


def test_partial_match_is_released_when_ruled_out_or_at_the_end():
    out, stopped = feed(["\nUser:"], ["Hello\nU", "nit", " done\n"])
    assert not stopped
    assert out == ["Hello", "\nUnit", " done", "\n"]


def test_earliest_of_several_stops_wins_and_nothing_follows():
    m = StopMatcher(["cd", "b"])
    assert m.push("abcd") == ("a", True)
    assert m.push("more") == ("", True)
    assert m.flush() == ""


def test_overlapping_prefixes_hold_the_longest_candidate():
    m = StopMatcher(["aab"])
    assert m.push("xa") == ("x", False)
    assert m.push("a") == ("", False)  # 'aa' held
    assert m.push("a") == ("a", False)  # 'aaa': the first 'a' can no longer start 'aab'
    assert m.push("b") == ("", True)


def test_text_stream_counts_visible_tokens():
    pieces = {1: "Hel", 2: "lo ", 3: "Wo", 4: "rld", 5: "!"}

    class Dec:
        def push(self, t):
            return pieces[t]

        def flush(self):
            return ""

    s = TextStream(Dec(), ["o Wor"])
    assert s.push(1) == ("Hel", False)
    assert s.push(2) == ("l", False)  # 'o ' may start the stop
    assert s.push(3) == ("", False)
    text, stopped = s.push(4)
    assert stopped and text == ""
    assert s.visible_tokens() == 1  # token 2 ('lo ') is cut by the stop string
    assert s.finish() == ""
    free = TextStream(Dec(), [])
    assert [free.push(t)[0] for t in (1, 2, 5)] == ["Hel", "lo ", "!"]
    assert free.visible_tokens() == 3


# ------------------------------------------------------------------------------------------------
# the engine on a tiny model
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("runtime")
    return {"target": write_model(d, "t", 0), "random": write_model(d, "r", 3)}


@pytest.fixture(scope="module")
def engine(paths):
    return load_engine(paths["target"], paths["random"])


def test_facts_and_text(engine):
    f = engine.facts
    assert f.architecture == "llama" and f.context_length == 128 and f.vocab_size == 284
    assert f.device == "cpu" and f.weight_format == "f32" and f.draft_architecture == "llama"
    assert f.eos_token == "<|im_end|>" and f.bos_token == "<|im_start|>" and f.add_bos is False
    assert f.memory_bytes > engine.cache.nbytes()
    ids = engine.tokenize("def fib(n): return the")
    assert engine.detokenize(ids) == "def fib(n): return the"
    assert engine.tokenize("x", add_bos=True)[0] == engine.tokenizer.bos_id


def test_prompt_eval_count_includes_cached_tokens(engine):
    n = len(engine.tokenize(PROMPT))
    generate(engine, "something else entirely", temperature=0, num_predict=3, drafter="none")
    first = generate(engine, temperature=0, num_predict=3, drafter="none")
    again = generate(engine, temperature=0, num_predict=3, drafter="none")
    assert first.result.prompt_eval_count == again.result.prompt_eval_count == n
    assert again.result.prompt_cached == n - 1
    assert first.result.prompt_cached < n - 1
    assert first.tokens == again.tokens
    assert again.result.context == engine.tokenize(PROMPT) + again.tokens
    assert again.result.prompt_eval_duration_ns > 0 and again.result.eval_duration_ns > 0


def test_seeded_sampling_reproduces_with_and_without_speculation(engine):
    opts = dict(temperature=0.9, top_k=40, top_p=0.95, num_predict=24)
    for extra in ({"drafter": "none"}, spec_opts("model", 3)):
        a = generate(engine, **opts, **extra, seed=42)
        b = generate(engine, **opts, **extra, seed=42)
        c = generate(engine, **opts, **extra, seed=43)
        assert a.tokens == b.tokens and a.tokens != c.tokens
    # seed -1 draws a fresh seed per request.
    runs = {tuple(generate(engine, **opts, drafter="none", seed=-1).tokens) for _ in range(3)}
    assert len(runs) > 1


def test_raw_tokens_prefix_and_bos(engine):
    plain = generate(engine, **GREEDY, drafter="none")
    ids = engine.tokenize(PROMPT)
    cont = generate(engine, "", request={"raw_tokens": ids}, **GREEDY, drafter="none")
    assert cont.tokens == plain.tokens
    split = generate(engine, " the", request={"raw_tokens": engine.tokenize("def fib(n): return")},
                     **GREEDY, drafter="none")
    assert split.result.context[: split.result.prompt_eval_count] == engine.tokenize("def fib(n): return") + \
        engine.tokenize(" the")
    bos = generate(engine, PROMPT, request={"add_bos": True}, temperature=0, num_predict=2, drafter="none")
    assert bos.result.context[0] == engine.tokenizer.bos_id
    assert bos.result.prompt_eval_count == len(ids) + 1


def test_images_and_empty_prompts(engine):
    with pytest.raises(EngineError) as e:
        generate(engine, request={"images": [b"\x89PNG"]}, **GREEDY)
    assert e.value.status == 400
    empty = generate(engine, "", temperature=0, num_predict=3)
    assert empty.tokens == [] and empty.result.eval_count == 0


# -- num_ctx ---------------------------------------------------------------------------------------
def test_prompt_longer_than_num_ctx_errors_or_is_truncated(engine):
    long = " ".join(["def fib(n): return the"] * 6)
    ids = engine.tokenize(long)
    assert len(ids) > 32
    with pytest.raises(ContextLengthError) as e:
        generate(engine, long, request={"truncate": False}, temperature=0, num_predict=2, num_ctx=32)
    assert "the input length exceeds the context length" in str(e.value) and e.value.status == 400
    run = generate(engine, long, temperature=0, num_predict=2, num_ctx=32, num_keep=5)
    assert run.result.prompt_eval_count == 32
    assert run.result.context[:32] == ids[:5] + ids[len(ids) - 27:]


def test_a_request_without_num_ctx_gets_the_whole_loaded_context(paths):
    """The engine loaded with more than Options' default 4096 (the server's TANDEM_CONTEXT_LENGTH) serves a
    request that does not set num_ctx with all of it; an explicit num_ctx still caps it."""
    engine = load_engine(paths["target"], num_ctx=4200)
    ids = (engine.tokenize(" ".join(["def fib(n): return the"] * 800), add_bos=False) * 2)[:4150]
    run = engine.generate(GenerateRequest(prompt="", raw_tokens=ids, options=Options.from_map(
        {"temperature": 0, "num_predict": 1})))
    result = [item for item in run if isinstance(item, GenerateResult)][0]
    assert result.prompt_eval_count == 4150
    capped = engine.generate(GenerateRequest(prompt="", raw_tokens=ids, options=Options.from_map(
        {"temperature": 0, "num_predict": 1, "num_ctx": 4096})))
    assert [item for item in capped if isinstance(item, GenerateResult)][0].prompt_eval_count == 4096


def reference_shift(engine, prompt_ids, n, num_ctx, num_keep):
    """Plain greedy decoding that recomputes every step from scratch over Ollama's shifted window."""
    model, log, out = engine.target, list(prompt_ids), []
    greedy = SamplingOptions(temperature=0)
    while len(out) < n:
        if len(log) > num_ctx:
            keep = min(num_keep, num_ctx - 1)
            discard = (len(log) - 1 - keep) // 2
            log = log[:keep] + log[keep + discard:]
        logits = model.forward(log, model.new_cache(128), logits_for="last")
        x = int(process(logits, log, (), greedy).argmax()[0])
        log.append(x)
        out.append(x)
    return out


@pytest.mark.parametrize("extra", [{"drafter": "none"}, spec_opts("model", 4)])
def test_context_shift_matches_a_from_scratch_reference(paths, extra):
    engine = load_engine(paths["target"], paths["target"])
    ids = engine.tokenize(PROMPT)
    want = reference_shift(engine, ids, 40, num_ctx=24, num_keep=4)
    run = generate(engine, temperature=0, num_predict=40, num_ctx=24, num_keep=4, **extra)
    assert run.tokens == want
    assert run.result.eval_count == 40 and run.result.done_reason == "length"
    assert run.result.context == ids + want  # Ollama's context: the prompt and everything generated
    assert engine.cache.length <= 24


def test_full_context_without_shift_stops_with_length(engine):
    n = len(engine.tokenize(PROMPT))
    run = generate(engine, request={"shift": False}, temperature=0, num_predict=100, num_ctx=20,
                   **spec_opts("model", 4))
    assert run.result.done_reason == "length" and run.result.eval_count == 20 - n + 1
    fill = generate(engine, temperature=0, num_predict=-2, num_ctx=20, drafter="none")
    assert fill.result.done_reason == "length" and fill.result.eval_count == 20 - n + 1


# -- logprobs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [{"drafter": "none"}, spec_opts("model", 3)])
def test_logprobs_match_the_target_softmax(engine, extra):
    run = generate(engine, request={"logprobs": True, "top_logprobs": 3}, temperature=0.8, seed=5,
                   num_predict=12, **extra)
    lps = [lp for c in run.chunks for lp in (c.logprobs or [])]
    assert len(lps) == len(run.tokens) == 12
    ctx = run.result.context
    n_prompt = run.result.prompt_eval_count
    logits = engine.target.forward(ctx[:-1], engine.target.new_cache(128), logits_for="all")
    ref = torch.log_softmax(logits.double(), -1)
    for i, (tok, lp) in enumerate(zip(run.tokens, lps)):
        row = ref[n_prompt - 1 + i]
        assert lp.logprob == pytest.approx(float(row[tok]), abs=1e-4)
        assert lp.bytes == list(engine.tokenizer.token_to_piece(tok))
        assert len(lp.top_logprobs) == 3
        top = torch.topk(row, 3)
        assert [t[1] for t in lp.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert lp.top_logprobs[0][1] >= lp.logprob - 1e-6
    none = generate(engine, temperature=0, num_predict=3, drafter="none")
    assert all(c.logprobs is None for c in none.chunks)


# ------------------------------------------------------------------------------------------------
# the engine process
# ------------------------------------------------------------------------------------------------
def test_engine_client_load_stream_cancel_and_crash(paths):
    from server.engine_process.client import EngineClient

    client = EngineClient()
    try:
        facts = client.load(LoadSpec(model_path=str(paths["target"]), num_ctx=64, weight_format="f32",
                                     device="cpu", num_thread=1), timeout=120)
        assert facts.architecture == "llama" and facts.context_length == 64
        assert client.health()["loaded"] is True
        assert client.detokenize(client.tokenize(PROMPT)) == PROMPT

        def collect(req):
            chunks, result = [], None
            for item in client.generate(req):
                if isinstance(item, GenerateResult):
                    result = item
                else:
                    chunks.append(item)
            return [t for c in chunks for t in c.token_ids], result

        req = GenerateRequest(prompt=PROMPT, options=Options.from_map(dict(temperature=0, num_predict=6, drafter="ngram",
                                                                           draft_num_predict=3)))
        first, res = collect(req)
        assert len(first) == 6 and res.done_reason == "length" and res.eval_count == 6

        # Cancel mid-stream: the engine stops at the next round and still sends its final result.
        endless = GenerateRequest(prompt=PROMPT, options=Options.from_map(dict(temperature=0, num_predict=-1,
                                                                               drafter="none")))
        n_chunks, result = 0, None
        for item in client.generate(endless):
            if isinstance(item, GenerateResult):
                result = item
                break
            n_chunks += 1
            if n_chunks == 3:
                client.cancel()
        assert result is not None and result.done_reason == "stop" and result.eval_count >= 3

        # Closing the stream early also cancels and drains, and the next request is clean.
        stream = client.generate(endless)
        next(stream)
        stream.close()
        again, res = collect(req)
        assert again == first and res.prompt_cached > 0

        # A dead engine process is a clear error for the request in flight.
        stream = client.generate(endless)
        next(stream)
        os.kill(client.pid, signal.SIGKILL)
        with pytest.raises(EngineCrashedError):
            for _ in stream:
                pass
        assert not client.alive()
    finally:
        client.close()


def test_load_errors_and_close(paths, tmp_path):
    from tests.tiny_gguf import TinySpec, write_tiny_gguf

    other_vocab = write_tiny_gguf(tmp_path / "spm.gguf", TinySpec(tokenizer="llama"))
    with pytest.raises(EngineError) as e:
        load_engine(paths["target"], other_vocab)
    assert e.value.status == 400 and "vocabulary" in str(e.value)
    with pytest.raises(EngineError):
        load_engine(tmp_path / "missing.gguf")
    engine = load_engine(paths["target"])
    assert generate(engine, temperature=0, num_predict=2).result.eval_count == 2
    engine.close()
