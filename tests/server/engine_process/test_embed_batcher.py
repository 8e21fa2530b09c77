"""Embedding requests made together go to the engine as one call, and each still gets its own answer."""

from __future__ import annotations

import threading

import pytest

from server.engine_process.embed_batcher import EmbedBatcher
from engine.contract.protocol import ContextLengthError, EmbedRequest, EmbedResult, EngineCrashedError


class FakeEngine:
    """Embeds text t as [len(t)]; the first call waits until ``release`` so that others queue behind it."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.release = threading.Event()
        self.fail: BaseException | None = None

    def __call__(self, req: EmbedRequest) -> EmbedResult:
        self.calls.append(list(req.inputs))
        if len(self.calls) == 1:
            self.release.wait(10)
        if self.fail is not None:
            raise self.fail
        if not req.truncate and any(len(t) > 5 for t in req.inputs):
            raise ContextLengthError("the input length exceeds the context length")
        return EmbedResult(embeddings=[[float(len(t))] for t in req.inputs], token_counts=[len(t) for t in req.inputs])


def run_together(batcher: EmbedBatcher, engine: FakeEngine, reqs: list[EmbedRequest]) -> list:
    out: list = [None] * len(reqs)

    def one(i: int) -> None:
        try:
            out[i] = batcher.embed(reqs[i])
        except BaseException as e:  # noqa: BLE001 - compared below
            out[i] = e

    first = threading.Thread(target=one, args=(0,))
    first.start()
    while not engine.calls:  # the first call is in the engine: the rest queue behind it
        pass
    rest = [threading.Thread(target=one, args=(i,)) for i in range(1, len(reqs))]
    for t in rest:
        t.start()
    while len(batcher._waiting) < len(reqs) - 1:
        pass
    engine.release.set()
    for t in [first, *rest]:
        t.join(10)
    return out


def test_requests_that_arrive_together_share_one_call_and_get_their_own_vectors():
    engine = FakeEngine()
    batcher = EmbedBatcher(engine)
    reqs = [EmbedRequest(inputs=["a"]), EmbedRequest(inputs=["bb", "ccc"]), EmbedRequest(inputs=["dddd"]),
            EmbedRequest(inputs=["e"], truncate=False)]
    out = run_together(batcher, engine, reqs)
    assert [r.embeddings for r in out] == [[[1.0]], [[2.0], [3.0]], [[4.0]], [[1.0]]]
    assert [r.token_counts for r in out] == [[1], [2, 3], [4], [1]]
    # the first alone; the two that agree on truncate together; the one that does not, on its own
    assert engine.calls == [["a"], ["bb", "ccc", "dddd"], ["e"]]


def test_an_error_of_one_request_is_its_own():
    engine = FakeEngine()
    batcher = EmbedBatcher(engine)
    reqs = [EmbedRequest(inputs=["a"]), EmbedRequest(inputs=["b"], truncate=False),
            EmbedRequest(inputs=["much too long"], truncate=False), EmbedRequest(inputs=["c"], truncate=False)]
    out = run_together(batcher, engine, reqs)
    assert isinstance(out[2], ContextLengthError)
    assert out[1].embeddings == [[1.0]] and out[3].embeddings == [[1.0]]


def test_a_crashed_engine_fails_every_request_of_the_call_without_retrying_each():
    engine = FakeEngine()
    batcher = EmbedBatcher(engine)
    engine.fail = EngineCrashedError("engine process exited")
    out = run_together(batcher, engine, [EmbedRequest(inputs=[t]) for t in "abc"])
    assert all(isinstance(o, EngineCrashedError) for o in out)
    assert len(engine.calls) == 2  # the first alone, the other two together: no call per request after it


def test_a_lone_request_is_one_call():
    engine = FakeEngine()
    engine.release.set()
    batcher = EmbedBatcher(engine)
    assert batcher.embed(EmbedRequest(inputs=["xy"])).embeddings == [[2.0]]
    with pytest.raises(ContextLengthError):
        batcher.embed(EmbedRequest(inputs=["too long"], truncate=False))
    assert len(engine.calls) == 2


def test_a_caller_is_answered_after_its_own_round_while_others_keep_arriving():
    """Each engine call brings a new request; the first caller returns once its own call is done, the next
    round led by a request that waited (no caller serves everyone else's requests after its own)."""
    log: list[str] = []
    threads: list[threading.Thread] = []
    batcher: EmbedBatcher

    def run(req: EmbedRequest) -> EmbedResult:
        log.append(f"call {req.inputs} by {'the first caller' if threading.current_thread() is main else 'another'}")
        if len(threads) < 3:  # a request arrives while this call runs
            t = threading.Thread(target=lambda n=len(threads): batcher.embed(EmbedRequest(inputs=[f"r{n}"])))
            threads.append(t)
            t.start()
            while len(batcher._waiting) < 1:
                pass
        return EmbedResult(embeddings=[[0.0] for _ in req.inputs], token_counts=[1 for _ in req.inputs])

    main = threading.current_thread()
    batcher = EmbedBatcher(run)
    batcher.embed(EmbedRequest(inputs=["first"]))
    for t in threads:
        t.join(10)
    assert log == ["call ['first'] by the first caller", "call ['r0'] by another", "call ['r1'] by another",
                   "call ['r2'] by another"]
