"""The engine client routes each message to its stream and wakes that stream's consumer alone: under eight clients
every token used to wake all eight consumer threads, on the cores the engine computes with."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

import server.engine_process.client as client_module


@pytest.fixture
def echo_client(monkeypatch):
    monkeypatch.setattr(client_module, "ENGINE_MAIN_MODULE", "tests.server.engine_process.echo_engine")
    client = client_module.EngineClient(timeout=30)
    yield client
    client.close()


def test_each_stream_gets_its_own_messages_and_is_woken_only_for_them(echo_client, monkeypatch):
    looks: Counter = Counter()  # how often each stream's consumer looked at its inbox
    pop = client_module._Inbox.pop

    def counted(inbox):
        looks[id(inbox)] += 1
        return pop(inbox)

    monkeypatch.setattr(client_module._Inbox, "pop", counted)
    streams, per_stream = 8, 60
    results: dict[int, list] = {}

    def consume(i: int) -> None:
        results[i] = list(echo_client.generate(per_stream))  # the echo engine takes the count as its request

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(results[i] == list(range(per_stream)) + [per_stream] for i in range(streams))
    assert len(looks) == streams
    # a look per message, one more per wake that found it empty: far below the 8 x 61 looks of a shared wake-up
    assert max(looks.values()) <= 2 * (per_stream + 1)
