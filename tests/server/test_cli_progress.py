"""`tandem pull` / `tandem push` progress: a bar per blob redrawn in place on a terminal, as `ollama pull` draws it,
and each whole ten percent once when piped."""

from __future__ import annotations

import io

from server.cli.progress import TransferProgress

DIGEST = "sha256:" + "6a0746a1ec1a" + "0" * 52
EVENTS = [{"status": "pulling manifest"}] + [
    {"status": "pulling 6a0746a1ec1a", "digest": DIGEST, "total": 2_000_000_000, "completed": c}
    for c in (0, 150_000_000, 200_000_000, 1_000_000_000, 2_000_000_000)] + [
    {"status": "verifying sha256 digest"}, {"status": "writing manifest"}, {"status": "success"}]


def _drawn(tty: bool) -> str:
    out = io.StringIO()
    progress = TransferProgress(out, tty=tty)
    for event in EVENTS:
        progress(event)
    progress.close()
    return out.getvalue()


def test_a_terminal_gets_one_bar_per_blob_redrawn_in_place():
    text = _drawn(tty=True)
    lines = text.split("\n")
    assert lines[0] == "pulling manifest"
    bar = lines[1].split("\r")[-1]  # the last drawing of the bar
    assert bar.startswith("pulling 6a0746a1ec1a: 100% ▕" + "█" * 24 + "▏ 2.0 GB/2.0 GB")
    assert lines[1].count("\r") == 5 and "  10% ▕██▏" not in lines[1]
    assert " 50% ▕" + "█" * 12 + " " * 12 + "▏ 1.0 GB/2.0 GB" in lines[1]
    assert lines[2:] == ["verifying sha256 digest", "writing manifest", "success", ""]


def test_a_pipe_gets_each_whole_ten_percent_once():
    assert _drawn(tty=False).splitlines() == ["pulling manifest", "pulling 6a0746a1ec1a 0%", "pulling 6a0746a1ec1a 10%",
                                              "pulling 6a0746a1ec1a 50%", "pulling 6a0746a1ec1a 100%",
                                              "verifying sha256 digest", "writing manifest", "success"]
