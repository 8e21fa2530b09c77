"""Several sequences at once (engine.batching, issues 34 and 49): one forward over every sequence's rows, each
attending to its own cache; concurrent requests get what they would get alone; the step loop survives
sequences that join, leave, fail or are cancelled."""

from __future__ import annotations

import threading
import time
import traceback
from typing import Sequence

import pytest
import torch

import tests.hf_tiny as hf_tiny
import tests.hf_tiny_qwen35 as hf_tiny_qwen35
from engine.batching.policy import PROMPT_CHUNK_ROWS, SHARED_PREFIX_MIN, SHARED_PROMPT_CHUNK
from engine.batching.step_loop import BatchedModel, StepLoop
from engine.batching.slots import SequenceSlot, SlotPool
from engine.cache.kv import KVCache
from engine.models.loader import load_model
from engine.contract.options import Options
from engine.contract.protocol import EngineError, GenerateRequest, LoadSpec, TokenChunk
from engine.runtime import ModelRuntime
from engine.speculative.ngram import NgramDrafter
from tests.engine.speculative.test_speculation import PROMPT, generate, write_model
from tests.tiny_gguf import TinySpec, write_tiny_gguf

PROMPTS = [PROMPT, "Once upon a time", "1, 2, 3, 4,", "hello world hello", "import os\nimport", "the cat"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("batching")
    return {
        "llama": write_model(d, "llama", 0),
        "random": write_model(d, "random", 3),
        "gemma": write_model(d, "gemma", 2, arch="gemma3", n_layer=3,
                             extra_metadata={"gemma3.attention.sliding_window_pattern": 2,
                                             "gemma3.attention.sliding_window": 4}),
        "moe": hf_tiny.make_pair("qwen3moe", d).path,
        "qwen2-q8": write_tiny_gguf(d / "q8.gguf", TinySpec(arch="qwen2", dtype="Q8_0", tied_output=False, seed=3)),
        "qwen35": hf_tiny_qwen35.make_pair(d, n_layer=4).path,
    }


class Call:
    def __init__(self, tokens, cache, logits_for="all", return_hidden=False):
        self.tokens, self.cache, self.logits_for, self.return_hidden = tokens, cache, logits_for, return_hidden


@pytest.mark.parametrize("arch", ["llama", "gemma", "moe", "qwen2-q8"])
def test_one_forward_over_several_sequences_is_each_ones_forward(models, arch):
    """Ragged sequences (a prefill, a decode step, a verification of 4, after prefixes of other lengths), in one
    forward and each alone: the same logits and caches. gemma3's sliding window and qwen3moe's routing included;
    qwen2 in qdot runs the native stack's multi-sequence pass (decoder.cpp forward_batch)."""
    native = arch == "qwen2-q8"
    model = load_model(models[arch], fmt="qdot" if native else "f32")
    if native and model.fused_stack() is None:
        pytest.skip("the native decoder stack is not built here")
    try:
        vocab = model.config.vocab_size
        g = torch.Generator().manual_seed(0)
        prefixes = [[], torch.randint(0, vocab, (6,), generator=g).tolist(),
                    torch.randint(0, vocab, (9,), generator=g).tolist()]
        news = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (7, 1, 4)]
        modes = ["last", "all", "all"]
        alone, batched = [], []
        for pre, new, mode in zip(prefixes, news, modes):
            for out in (alone, batched):
                cache = model.new_cache(64)
                if pre:
                    model.forward(pre, cache, logits_for="none")
                out.append(cache)
        want = [model.forward(new, c, logits_for=m) for new, c, m in zip(news, alone, modes)]
        got = model.forward_batch([Call(new, c, m) for new, c, m in zip(news, batched, modes)])
        for w, o, ca, cb in zip(want, got, alone, batched):
            assert o.shape == w.shape
            torch.testing.assert_close(o, w, rtol=1e-4, atol=1e-4)
            assert ca.length == cb.length and ca.tokens == cb.tokens
        # the caches hold what each alone would: the next step agrees too
        nxt = [model.forward([3], c, logits_for="last") for c in alone]
        got = model.forward_batch([Call([3], c, "last") for c in batched])
        for w, o in zip(nxt, got):
            torch.testing.assert_close(o, w, rtol=1e-4, atol=1e-4)
    finally:
        model.close()


def engine(path, draft=None, n=4, num_ctx=128) -> ModelRuntime:
    return ModelRuntime.load(LoadSpec(model_path=str(path), draft_path=str(draft) if draft else None, num_ctx=num_ctx,
                                      weight_format="f32", draft_weight_format="f32", device="cpu",
                                      num_parallel=n))


def concurrently(fn, n):
    out, errors = [None] * n, []

    def run(i):
        try:
            out[i] = fn(i)
        except BaseException:  # noqa: BLE001 - reported below, with where it was raised
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return out


MIXED = [dict(drafter="none"), dict(drafter="model", draft_num_predict=3), dict(drafter="ngram", draft_num_predict=4),
         {}, dict(format="json"), dict(drafter="model", draft_num_predict=2, draft_schedule="fixed")]


def test_concurrent_greedy_requests_get_what_they_get_alone(models):
    """Plain, draft model, n-gram, the defaults (adaptive, copy), a JSON-constrained request: six at once on four
    slots (two wait for a slot, queued in the runtime, and join as others leave), each the tokens it gets alone."""
    eng = engine(models["llama"], models["random"])
    assert eng.num_parallel == 4 and eng.facts.num_parallel == 4

    def run(i):
        opts = dict(MIXED[i])
        fmt = opts.pop("format", None)
        return generate(eng, PROMPTS[i], temperature=0, num_predict=24, request={"format": fmt} if fmt else None,
                        **opts).tokens

    alone = [run(i) for i in range(len(MIXED))]
    assert concurrently(run, len(MIXED)) == alone  # the two beyond the slots wait for a free one, in order
    assert eng.batch_loop.rows > eng.batch_loop.steps  # forwards did carry several sequences' rows


def test_a_seed_gives_the_same_sample_in_a_batch_as_alone(models):
    """Each sequence samples with its own seeded generators from its own rows: batching changes nothing. (Fixed
    depths: an adaptive depth follows the clock, and a different depth draws a different number of uniforms.)"""
    eng = engine(models["llama"], models["random"])
    # draft_suffix false: drafts from earlier outputs depend on what the store holds when the request runs (the
    # alone runs fill it), and a different draft draws a different number of uniforms, as a different depth does
    fixed = [dict(drafter="none"), dict(drafter="model", draft_num_predict=3, draft_schedule="fixed", draft_suffix=False),
             dict(drafter="ngram", draft_num_predict=4, draft_schedule="fixed")]

    def run(i):
        return generate(eng, PROMPTS[i], temperature=0.9, seed=100 + i, num_predict=20, **fixed[i % 3]).tokens

    alone = [run(i) for i in range(4)]
    assert concurrently(run, 4) == alone


def test_a_hybrid_model_serves_several_sequences(models):
    """qwen35's recurrent layers keep one sequence's state per forward: its sequences share the step loop
    and run one after another within it, each with its own cache and snapshots."""
    eng = engine(models["qwen35"], n=3)
    run = lambda i: generate(eng, PROMPTS[i], temperature=0, num_predict=12, drafter="ngram",  # noqa: E731
                             draft_num_predict=3).tokens
    alone = [run(i) for i in range(3)]
    assert concurrently(run, 3) == alone


def test_cancelling_one_sequence_leaves_the_others_untouched(models):
    eng = engine(models["llama"], models["random"])
    alone = generate(eng, PROMPTS[1], temperature=0, num_predict=30, drafter="model").tokens
    stop = threading.Event()

    def run(i):
        if i == 0:
            n = [0]

            def should_stop():
                n[0] += 1
                return n[0] > 3
            return generate(eng, PROMPTS[0], temperature=0, num_predict=100, should_stop=should_stop)
        return generate(eng, PROMPTS[1], temperature=0, num_predict=30, drafter="model").tokens

    cancelled, other = concurrently(run, 2)
    stop.set()
    assert cancelled.result.done_reason == "stop" and cancelled.result.eval_count < 100
    assert other == alone
    # the cancelled slot is clean: its next request reuses its cache and gets the plain answer
    again = generate(eng, PROMPTS[0], temperature=0, num_predict=10, drafter="none")
    assert again.tokens == generate(engine(models["llama"], n=1), PROMPTS[0], temperature=0, num_predict=10,
                                    drafter="none").tokens


def test_a_slot_is_chosen_for_its_prefix_and_all_busy_is_refused():
    class Cache:
        def __init__(self, tokens):
            self.tokens = tokens

        def common_prefix(self, tokens):
            n = 0
            while n < min(len(tokens), len(self.tokens)) and tokens[n] == self.tokens[n]:
                n += 1
            return n

    pool = SlotPool([SequenceSlot(0, Cache([1, 2, 3]), {}), SequenceSlot(1, Cache([7, 8, 9, 10]), {})])
    a = pool.acquire([7, 8, 9, 11])
    assert a.index == 1
    b = pool.acquire([7, 8])
    assert b.index == 0  # the only one free
    with pytest.raises(EngineError) as e:
        pool.acquire([1])
    assert e.value.status == 503 and pool.free() == 0
    pool.release(a)
    assert pool.free() == 1 and pool.acquire([5]).index == 1


def kv_slot(i: int, tokens: Sequence[int] = ()) -> SequenceSlot:
    """Slot ``i`` over a real one-layer KV cache that holds ``tokens`` (zero keys and values: only the slot rule's
    bookkeeping is looked at)."""
    cache = KVCache(1, 1, 2, 64)
    cache.k.zero_(), cache.v.zero_()
    cache.commit(tokens)
    return SequenceSlot(i, cache, {})


def test_a_new_conversation_forks_a_shared_prefix_into_a_free_slot_instead_of_evicting_another():
    """Ollama's slot rule over real KV caches: a request reuses a slot in place only when its prompt continues that
    slot's cache or is the prompt it holds; one that shares only an opening (a system prompt, the chat template's
    first tokens) with a conversation takes an empty or the least recently used slot, and share_prefix copies the
    shared part there. (The longest prefix alone had a second conversation evict the first for 13 template tokens
    while a slot stood empty: tests/benchmarks/test_benchmarks_serving.py's warm-up then failed one run in ten.)"""
    system, chat_a = list(range(1, SHARED_PREFIX_MIN + 5)), [120, 121, 122, 123]  # copied when >= SHARED_PREFIX_MIN
    pool = SlotPool([kv_slot(0, system + chat_a), kv_slot(1)])
    pool.slots[0].used_at = 5  # conversation A spoke last
    pool._clock = 5

    b = pool.acquire(system + [40, 41])  # a new conversation with A's system prompt
    assert b.index == 1  # the empty slot, not A's
    assert pool.share_prefix(b, system + [40, 41]) == len(system)  # the system prompt copied from A's slot
    assert b.cache.tokens == system and pool.slots[0].cache.tokens == system + chat_a
    b.cache.commit([40, 41, 42])
    pool.release(b)

    a = pool.acquire(system + chat_a + [24, 25])  # A's next turn continues its own cache
    assert a.index == 0
    pool.release(a)
    assert pool.acquire(system + [40]).index == 1  # B's prompt again: the slot holding it
    pool.release(pool.slots[1])

    # every free slot holds another conversation: the least recently used gives way
    assert pool.acquire([1, 2, 3, 99]).index == 0


def test_a_next_turn_that_drops_the_last_answers_reasoning_stays_in_its_own_slot():
    """A thinking model's template leaves the reasoning out of the history, so its next turn departs from the
    slot's cache inside what that slot generated: the prompt keeps the last prompt whole, and the slot is the same
    conversation's (its prompt reused in place, only the answer's positions go), not a reason to fork into the empty
    slot and leave a stale copy behind. A new conversation sharing only the system prompt still forks."""
    system, user_1 = list(range(1, SHARED_PREFIX_MIN + 5)), [120, 121, 122]
    reasoning, answer = [200, 201, 202, 203], [300, 301]
    pool = SlotPool([kv_slot(0), kv_slot(1)])
    first = pool.acquire(system + user_1)
    first.cache.commit(system + user_1 + reasoning + answer)
    pool.release(first)

    turn_2 = system + user_1 + answer + [130, 131]  # the template rendered the answer without its reasoning
    again = pool.acquire(turn_2)
    assert again is first and pool.share_prefix(again, turn_2) == 0
    kept = again.cache.reuse_prefix(turn_2)  # what the runtime does next: the last prompt stays, the answer goes
    assert kept == len(system + user_1)
    again.cache.commit(turn_2[kept:])
    pool.release(again)

    other = pool.acquire(system + [40, 41])  # another conversation, the same system prompt: the empty slot
    assert other is not first and pool.share_prefix(other, system + [40, 41]) == len(system)


def run_sequences(loop: StepLoop, *bodies) -> None:
    """Start ``bodies`` as sequences of ``loop`` at once and step it until every one has ended."""
    for body in bodies:
        loop.start(body)
    while loop.busy:
        loop.step()


def test_a_failing_batch_fails_only_the_sequence_whose_rows_fail_it_and_the_loop_goes_on():
    runs = []

    def run_batch(model, calls):
        runs.append([c.tokens for c in calls])
        if any(c.tokens == [13] for c in calls):
            raise RuntimeError("kernel failure")
        return [sum(c.tokens) for c in calls]

    loop = StepLoop(run_batch)
    target = BatchedModel(object(), loop, draft=False)
    results: dict[int, object] = {}

    def seq(i, tokens_seq):
        def body():
            out = []
            for tokens in tokens_seq:
                try:
                    out.append(target.forward(tokens, None))
                except RuntimeError as e:
                    out.append(str(e))
                    break
            results[i] = out
        return body

    run_sequences(loop, seq(0, [[1], [2], [3]]), seq(1, [[4], [13], [5]]), seq(2, [[6, 7]]))
    assert results[1] == [4, "kernel failure"]
    assert results[0] == [1, 2, 3] and results[2] == [13]  # the failure stayed in its own step
    # the first step carried all three sequences' rows; the second failed and was run again one at a time
    assert sorted(runs[0]) == [[1], [4], [6, 7]] and sorted(runs[1]) == [[2], [13]]
    assert sorted(runs[2:4]) == [[[2]], [[13]]] and runs[4] == [[3]]
    assert not loop.busy and loop.active == 0


def test_draft_forwards_run_before_the_verifications_that_wait():
    """One sequence drafts two tokens while another waits at its plain step: the drafts run first, and the
    plain step shares a forward with the drafting sequence's verification."""
    order = []

    def run_batch(model, calls):
        order.append((model, len(calls)))
        return [None] * len(calls)

    loop = StepLoop(run_batch)
    target, draft = BatchedModel("target", loop, draft=False), BatchedModel("draft", loop, draft=True)

    def drafting():
        draft.forward([1], None)
        draft.forward([2], None)
        target.forward([1, 2, 3], None)

    run_sequences(loop, drafting, lambda: target.forward([9], None))
    assert order == [("draft", 1), ("draft", 1), ("target", 2)]
    assert loop.steps == 1 and loop.rows == 4


def test_a_sequence_started_between_steps_shares_the_next_step_and_a_forward_outside_runs_alone():
    """A sequence joins at a step boundary: its first forward goes in the same step as the running sequences'
    next ones. Its Python runs on the loop's thread between forwards, never beside a forward: a copy of another
    slot's cache made there (share_prefix) sees no half-written step. A forward called outside any sequence
    (a draft model used directly) runs at once, alone."""
    widths: list[int] = []
    loop = StepLoop(run_batch=lambda model, calls: widths.append(len(calls)) or [None] * len(calls))
    target = BatchedModel(object(), loop, draft=False)

    def running():
        for _ in range(4):
            target.forward([1], None)

    loop.start(running)
    loop.step()
    loop.step()
    seen_active = []
    loop.start(lambda: (seen_active.append(loop.active), target.forward([2], None), target.forward([3], None)))
    while loop.busy:
        loop.step()
    assert seen_active == [2]
    assert widths == [1, 1, 2, 2]  # the running sequence alone twice, then both in each step
    assert target.forward([5], None) is None and widths[-1] == 1 and len(widths) == 5


def test_a_long_prompt_arriving_is_evaluated_in_chunks_beside_the_running_streams(models):
    """A ~200-token prompt joins two running streams: it is evaluated 64 tokens a step, so no step of the running
    streams carries more than 64 of its rows, and every output is what it is alone."""
    eng = engine(models["llama"], n=3, num_ctx=256)
    long_prompt = " ".join(["word"] * 42)  # a token a byte
    assert 192 < len(eng.tokenize(long_prompt)) < 240, len(eng.tokenize(long_prompt))
    rows: list[list[int]] = []
    run_batch = eng.batch_loop.run_batch

    def recording(model, calls):
        rows.append([len(c.tokens) for c in calls])
        return run_batch(model, calls)

    def run(i):
        if i == 2:
            # it arrives once both streams run (alone, a prompt takes its whole chunk: the next test)
            deadline = time.monotonic() + 60
            while (eng.batch_loop.active < 2 or eng.batch_loop.steps < 2) and time.monotonic() < deadline:
                time.sleep(0.001)
            return generate(eng, long_prompt, temperature=0, num_predict=8, drafter="none").tokens
        return generate(eng, PROMPTS[i], temperature=0, num_predict=60, drafter="none").tokens

    alone = [generate(eng, long_prompt if i == 2 else PROMPTS[i], temperature=0, num_predict=8 if i == 2 else 60,
                      drafter="none").tokens for i in range(3)]
    eng = engine(models["llama"], n=3, num_ctx=256)  # a fresh one: the long prompt is not cached in any slot
    run_batch = eng.batch_loop.run_batch
    eng.batch_loop.run_batch = recording
    assert concurrently(run, 3) == alone
    shared = [r for r in rows if len(r) > 1]
    assert shared and max(max(r) for r in shared) <= SHARED_PROMPT_CHUNK
    assert sum(1 for r in rows if SHARED_PROMPT_CHUNK in r) >= 3  # the long prompt went in chunks, beside the others


def test_a_prompt_alone_is_evaluated_in_whole_chunks(models):
    """With no other sequence in flight a prompt takes the whole chunk it asks for (num_batch, at most
    PROMPT_CHUNK_ROWS a forward): nobody's stream waits on it, and wider chunks run the prompt faster."""
    eng = engine(models["llama"], n=3, num_ctx=512)
    rows: list[list[int]] = []
    run_batch = eng.batch_loop.run_batch

    def recording(model, calls):
        rows.append([len(c.tokens) for c in calls])
        return run_batch(model, calls)

    eng.batch_loop.run_batch = recording
    prompt = " ".join(["word"] * 60)  # ~300 tokens, a token a byte
    n = len(eng.tokenize(prompt))
    assert PROMPT_CHUNK_ROWS < n < 2 * PROMPT_CHUNK_ROWS, n
    generate(eng, prompt, temperature=0, num_predict=1, drafter="none")
    assert rows == [[PROMPT_CHUNK_ROWS], [n - PROMPT_CHUNK_ROWS]]
    rows.clear()
    other = " ".join(["thing"] * 50)  # nothing in common with the first: evaluated whole
    m = len(eng.tokenize(other))
    generate(eng, other, temperature=0, num_predict=1, drafter="none", num_batch=100)
    assert rows == [[100]] * (m // 100) + ([[m % 100]] if m % 100 else [])


def test_a_prompt_another_sequence_evaluated_is_copied_not_evaluated_again(models):
    """A system prompt every client sends: the second request, on another slot while the first streams, adopts the
    first's cached positions (prompt_cached counts them) and still generates exactly what it does alone."""
    system = "You are a careful assistant. Answer briefly and cite nothing. " * 3
    eng = engine(models["llama"], n=2, num_ctx=512)
    alone = engine(models["llama"], n=1, num_ctx=512)
    second = system + "The second question"
    want = generate(alone, second, temperature=0, num_predict=12)
    started, release = threading.Event(), threading.Event()

    def first() -> None:
        # the first request keeps stepping (a sequence that pauses holds up the batch) until released; `started`
        # once its first token is out, so its prompt is in its slot (not merely being evaluated) when the second comes
        req = GenerateRequest(prompt=system + "The first question", options=Options.from_map({
            "temperature": 0, "num_predict": 300}))
        for item in eng.generate(req, should_stop=release.is_set):
            if isinstance(item, TokenChunk) and item.token_ids:
                started.set()

    t = threading.Thread(target=first)
    t.start()
    assert started.wait(60)
    try:
        got = generate(eng, second, temperature=0, num_predict=12)
    finally:
        release.set()
        t.join(60)
    n_system = len(eng.tokenize(system))
    assert eng.slots.adopted >= n_system - 1  # copied from the first request's slot, not its own old cache
    assert got.result.prompt_cached >= n_system - 1 and want.result.prompt_cached == 0
    assert got.tokens == want.tokens


def test_sampled_output_keeps_the_target_distribution_in_a_batch(tmp_path):
    """test_speculation's perturbed drafter, 500 seeded samples of the first three tokens drawn by four sequences
    at once (each step one forward over all of their rows): the chi-square test against the target's exact
    distribution, as alone."""
    from tests.engine.speculative import test_speculation as ts

    small = dict(n_layer=1, n_embd=32, n_head=2, n_head_kv=1)
    eng = engine(write_model(tmp_path, "t", 0, **small), write_model(tmp_path, "d", 0, noise=0.3, **small), n=4,
                 num_ctx=64)
    exact = ts.exact_first_tokens(eng, ts.DIST_PROMPT, ts.DIST_OPTS, 3)
    samples = concurrently(lambda i: [generate(eng, ts.DIST_PROMPT, **ts.DIST_OPTS, seed=s)
                                      for s in range(i, ts.DIST_RUNS, 4)], 4)
    pvalue, acceptance = ts.samples_pvalue([run for chunk in samples for run in chunk], exact)
    assert eng.batch_loop.rows > eng.batch_loop.steps  # the forwards did carry several sequences' rows
    assert 0.05 < acceptance < 0.95 and pvalue > 1e-3


def test_every_slot_prices_its_draft_models_catch_ups_by_one_record_and_its_own_backlog(models):
    """A catch-up measured in one slot prices the others' (their drafters are copies of one draft model), and each
    slot's controller reads how far its own drafter is behind: a prompt read lazily, beside other sequences, is."""
    eng = engine(models["llama"], models["random"], n=2)
    first, second = eng.slots.slots
    ctl = [eng.controller(s.drafters["model"], "adaptive", 0, s.controllers) for s in (first, second)]
    assert ctl[0] is not ctl[1] and ctl[0].catchup_times is ctl[1].catchup_times
    drafter = second.drafters["model"]
    assert drafter.lazy_prompt
    drafter.begin(list(range(3, 40)))  # a 37-token prompt, not read yet
    assert ctl[1].backlog() == 36 and ctl[0].backlog() == 0  # the last token is the first proposal's own step
    eng.controller(NgramDrafter(), "adaptive", 0, second.controllers)
    ngram = [c for key, c in second.controllers.items() if key.startswith("ngram/")]
    assert ngram and all(c.backlog is None for c in ngram)  # only a draft model catches up
