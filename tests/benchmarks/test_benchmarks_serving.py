"""benchmarks.serving's report states the command it measured with, options that change what it measures included."""

from benchmarks.serving import command_line, parser


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
