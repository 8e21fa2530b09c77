"""benchmarks.agent_replay end to end on a tiny GGUF (a smoke run: the sessions replay, every turn of every
configuration is reported and the retried question drafts only tokens of the first answer; the speeds mean nothing)."""

from __future__ import annotations

import json

from benchmarks import agent_replay as bench
from tests.tiny_gguf import TinySpec, write_tiny_gguf


def test_agent_replay_smoke(tmp_path, capsys):
    target = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="qwen2", seed=1, context_length=4096))
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    assert bench.main(["--model", str(target), "--rounds", "1", "--tokens", "12", "--sessions", "retry,interleaved",
                       "--configs", "plain,default", "--num-ctx", "2048", "--json", str(out),
                       "--markdown", str(md)]) == 0
    report = json.loads(out.read_text())
    rows = {(r["session"], r["turn"], r["config"]): r for r in report["rows"]}
    assert len(rows) == (3 + 4) * 2
    assert rows[("retry", 1, "plain")]["drafter"] == "none" and rows[("retry", 1, "default")]["drafter"] == "suffix"
    # the retry's drafts are the first answer, every one right (how many the adaptive depth drafts follows the clock)
    assert rows[("retry", 2, "default")]["retry"] and rows[("retry", 2, "default")]["acceptance"] in (1.0, None)
    assert set(report["summary"]) == {"default"}
    written = md.read_text()
    assert written.startswith("# Agent sessions replayed") and "agent_replay --model" in written
    table = capsys.readouterr().out.strip()
    assert table and written.rstrip().endswith(table)  # the table printed is the one written, under its header
