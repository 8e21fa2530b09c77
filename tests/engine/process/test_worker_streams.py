"""The engine process holds no thread per request (issue 49): the native engine writes each generation's chunks to
the pipe from its step loop, on the compute thread, while the worker's loop keeps answering calls."""

from __future__ import annotations

import multiprocessing as mp
import threading

from engine.contract.options import Options
from engine.contract.protocol import GenerateRequest, GenerateResult, LoadSpec, TokenChunk
from engine.process import worker
from tests.engine.speculative.test_speculation import PROMPT, write_model


def test_concurrent_generations_hold_no_thread_of_their_own(tmp_path):
    path = write_model(tmp_path, "llama", seed=0)
    here, there = mp.Pipe()
    t = threading.Thread(target=worker.engine_main, args=(there, threading.Event()), daemon=True)
    t.start()
    try:
        here.send(("load", LoadSpec(model_path=str(path), num_ctx=128, weight_format="f32", device="cpu",
                                    num_parallel=3)))
        assert here.recv()[0] == "ok"
        threads_before = {th.ident for th in threading.enumerate()}
        prompts = [PROMPT, "Once upon a time", "1, 2, 3, 4,", "hello world hello"]  # four on three slots
        for rid, prompt in enumerate(prompts):
            here.send(("generate", rid, GenerateRequest(prompt=prompt, options=Options.from_map(
                {"temperature": 0, "num_predict": 40, "drafter": "none"}))))
        here.send(("tokenize", "hello", False))  # answered while the four generate
        grown: set[int] = set()
        text = {rid: [] for rid in range(len(prompts))}
        done: dict[int, GenerateResult] = {}
        answered = None
        while len(done) < len(prompts) or answered is None:
            assert here.poll(60)
            msg = here.recv()
            grown |= {th.ident for th in threading.enumerate()} - threads_before
            if msg[0] == "chunk":
                assert isinstance(msg[2], TokenChunk)
                text[msg[1]].append(msg[2].text)
            elif msg[0] == "done":
                done[msg[1]] = msg[2]
            elif msg[0] == "ok":
                answered = msg[1]
            else:
                raise AssertionError(msg)
        assert not grown, [th.name for th in threading.enumerate() if th.ident in grown]
        assert answered and all(isinstance(i, int) for i in answered)
        assert all(0 < r.eval_count <= 40 for r in done.values()) and all(text[rid] for rid in text)
    finally:
        here.send(("exit",))
        t.join(30)
