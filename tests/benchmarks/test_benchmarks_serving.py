"""benchmarks.serving's report states the command it measured with, options that change what it measures included."""

from benchmarks.serving import (command_line, create, main, parser, run_level, start_server, stop_server, stream_raw,
                                traced_level)
from tests.tiny_gguf import TinySpec, write_tiny_gguf


def test_command_line_states_every_option_that_changes_the_measurement() -> None:
    ap = parser()
    args = ap.parse_args(["--model", "/root/.cache/tandem/target.gguf", "--draft", "/x/draft.gguf", "--levels", "1,8",
                          "--rounds", "2", "--widths", "none", "--prefill-tokens", "0", "--no-anchor",
                          "--markdown", "/tmp/out.md"])
    assert command_line(ap, args) == (
        "python -m benchmarks.serving --model target.gguf --draft draft.gguf --levels 1,8 --tokens 64 --rounds 2"
        " --parallel 8 --widths none --prefill-tokens 0 --no-anchor")


def test_command_line_of_defaults_names_what_every_level_measured() -> None:
    ap = parser()
    args = ap.parse_args(["--model", "m.gguf", "--vllm-url", "http://10.0.0.2:8000", "--llama-server", "/opt/ls"])
    assert command_line(ap, args) == ("python -m benchmarks.serving --model m.gguf --levels 1,2,4,8 --tokens 64"
                                      " --rounds 2 --parallel 8 --llama-server ls --vllm-url ...")


def test_a_traced_level_reports_where_the_engine_spent_its_time(tmp_path):
    """A real server with TANDEM_STEP_TRACE: the engine process traces its step loop, and a level's result says what
    share of its wall time the forwards took and how many rows a step carried (two clients: up to two a step)."""
    model = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="llama", n_layer=2, seed=1))
    traces = tmp_path / "steps"
    proc, url = start_server(tmp_path, 2, {"TANDEM_STEP_TRACE": str(traces)})
    try:
        create(url, "m", f"FROM {model}\nPARAMETER drafter none\n")
        run_level(url, "m", 1, 2, stream_raw)  # the load, outside the window
        result = traced_level(url, "m", traces, lambda: run_level(url, "m", 2, 8, stream_raw))
    finally:
        stop_server(proc)
    assert result["tokens"] == 16
    assert 0 < result["in_forwards"] <= 1
    assert 1 <= result["rows_per_step"] <= 2 + 64  # decode rows, and a prompt chunk beside them at most
    assert list(traces.glob("steps-*.tsv"))


def test_every_engine_reads_the_prompts_before_the_rounds_so_each_level_measures_decoding(tmp_path):
    """Both targets asking the pair's engine (drafting and not) find every level's prompts already read: a step then
    carries at most a row per client (the prompts' last tokens, then one decode row each), for both alike. Without
    the warm-up the first of them to reach a level's new prompts evaluated them beside its decode rows, and the
    other reused them: the pair drafting nothing measured 0.84-0.93x itself not drafting."""
    model = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="llama", n_layer=2, seed=1))
    draft = write_tiny_gguf(tmp_path / "d.gguf", TinySpec(arch="llama", n_layer=1, seed=2))
    md = tmp_path / "r.md"
    assert main(["--model", str(model), "--draft", str(draft), "--levels", "1,2", "--tokens", "4", "--rounds", "1",
                 "--parallel", "2", "--widths", "none", "--prefill-tokens", "0", "--no-anchor",
                 "--markdown", str(md)]) == 0
    rows = [line.split("|") for line in md.read_text().splitlines() if line.startswith("| tandem |")]
    assert len(rows) == 6  # plain, the pair, the pair not drafting; one and two clients
    for row in rows:
        clients, in_forwards, rows_per_step = int(row[3]), row[11].strip(), float(row[12])
        assert in_forwards.endswith("%") and 0 < int(in_forwards[:-1]) <= 100
        assert rows_per_step <= clients + 4 * (row[2].strip() == "draft")  # the pair may verify drafts
