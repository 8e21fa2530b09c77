"""`tandem bench` (server/cli/bench/): the speed sweep and the quality harness end to end against a server
with tiny models, and their parts (grid, statistics, pairing, the sandbox, HumanEval plumbing), plus
the engine property the quality measurement relies on: logprobs under speculation are the target's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from blobs import BlobStore
from importer import CreateRequest, create_model
from server.cli.bench import analysis, grid, quality, sandbox, stats
from tests.server_thread import ServerThread
from tests.engine.speculative.test_speculation import write_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny llama target whose greedy output varies (256-token context) and a drafter close to it
    (its output head perturbed): some drafts pass the strict test, and at temperature > 0 the relaxed
    rule accepts others the strict test rejects."""
    d = tmp_path_factory.mktemp("bench-models")
    return write_model(d, "target", 0), write_model(d, "draft", 0, noise=0.5)


@pytest.fixture(scope="module")
def srv(pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("bench")
    store = BlobStore(d / "models")
    t, _ = store.add_file(pair[0])
    dr, _ = store.add_file(pair[1])
    create_model(store, CreateRequest(model="tiny", files={"target.gguf": t}, draft_files={"draft.gguf": dr},
                                      parameters={"temperature": 0.0, "num_predict": 8}))
    with ServerThread(store) as server:
        yield server


def bench_cli(*args: str, srv: ServerThread, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TANDEM_HOST": srv.url}
    return subprocess.run([sys.executable, "-m", "server.cli", "bench", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


# --- the speed sweep, end to end ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def speed_run(srv: ServerThread, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("speed")
    r = bench_cli("tiny", "--num-predict", "8", "--runs", "2", "--warmup", "1", "--prompt-names", "code,repetitive",
                  "--temperature", "0,0.6", "--n-max", "1,2", "--relaxed", "2,5", "--relaxed-n-max", "2",
                  "--json", str(out / "report.json"), "--plots", str(out / "plots"),
                  "--markdown", str(out / "table.md"), srv=srv)
    assert r.returncode == 0, r.stderr
    return r, json.loads((out / "report.json").read_text()), out


SETTINGS = ["plain", "strict-n1", "strict-n2", "relaxed2-n2", "relaxed5-n2", "adaptive", "ngram-n4", "ngram-adaptive"]


def test_speed_report_structure(speed_run) -> None:
    _, rep, _ = speed_run
    assert rep["model"] == "tiny" and rep["drafter"] == "model"
    assert [s["name"] for s in rep["settings"]] == SETTINGS
    assert {s["name"]: s["lossless"] for s in rep["settings"]}["relaxed5-n2"] is False
    cfg = rep["config"]
    assert cfg["runs"] == 2 and cfg["warmup"] == 1 and cfg["temperatures"] == [0.0, 0.6] and cfg["num_predict"] == 8
    assert [p["name"] for p in cfg["prompts"]] == ["code", "repetitive"]
    # Every measured block (run, prompt, temperature) holds every setting exactly once, warm-up left out.
    ms = rep["measurements"]
    assert len(ms) == 2 * 2 * 2 * len(SETTINGS)
    blocks: dict[tuple, list[dict]] = {}
    for m in ms:
        blocks.setdefault((m["run"], m["prompt"], m["temperature"]), []).append(m)
    assert len(blocks) == 8
    for block in blocks.values():
        assert sorted(m["setting"] for m in block) == sorted(SETTINGS)
        assert sorted(m["order"] for m in block) == list(range(len(SETTINGS)))
    # The order rotates from block to block: plain does not always run first.
    assert len({next(m["order"] for m in b if m["setting"] == "plain") for b in blocks.values()}) > 1
    for m in ms:
        assert m["eval_count"] > 0 and m["tok_s"] == pytest.approx(m["eval_count"] / (m["eval_duration_ns"] / 1e9))
        expected = {"plain": "none", "ngram-n4": "ngram", "ngram-adaptive": "ngram"}.get(m["setting"], "model+suffix")
        assert m["drafter"] == expected
        if m["setting"].endswith("-n2"):
            assert len(m["acceptance_by_position"]) <= 2
    assert len(rep["results"]) == 2 * 2 * len(SETTINGS)
    assert {(o["temperature"], o["setting"]) for o in rep["overall"]} == {(t, s) for t in (0.0, 0.6) for s in SETTINGS}
    strict = next(c for c in rep["results"] if c["setting"] == "strict-n2" and c["temperature"] == 0.0)
    assert 0 <= strict["acceptance_rate"] <= 1 and strict["mean_accepted_length"] >= 1
    assert len(strict["acceptance_by_position"]) == 2


def test_ratios_come_from_paired_runs(speed_run) -> None:
    _, rep, _ = speed_run
    tok = {(m["run"], m["prompt"], m["temperature"], m["setting"]): m["tok_s"] for m in rep["measurements"]}
    for c in rep["results"]:
        per_run = [tok[(run, c["prompt"], c["temperature"], c["setting"])] /
                   tok[(run, c["prompt"], c["temperature"], "plain")] for run in (0, 1)]
        assert c["ratio_per_run"] == pytest.approx(per_run)
        assert c["ratio"] == pytest.approx(stats.median(per_run))
        assert c["ratio_min"] == pytest.approx(min(per_run)) and c["ratio_max"] == pytest.approx(max(per_run))
        assert c["tok_s"] == pytest.approx(stats.median([tok[(run, c["prompt"], c["temperature"], c["setting"])]
                                                         for run in (0, 1)]))
    for p in rep["pairs"]:
        assert p["ratio"] == pytest.approx(tok[(p["run"], p["prompt"], p["temperature"], p["setting"])] /
                                           tok[(p["run"], p["prompt"], p["temperature"], "plain")])
    # Overall: per run, the geometric mean over prompts of that run's paired ratios; then the median.
    for o in rep["overall"]:
        per_run = [stats.geomean([tok[(run, p, o["temperature"], o["setting"])] / tok[(run, p, o["temperature"], "plain")]
                                  for p in ("code", "repetitive")]) for run in (0, 1)]
        assert o["ratio_per_run"] == pytest.approx(per_run)
        assert o["ratio"] == pytest.approx(stats.median(per_run))


def test_best_setting_is_reported_with_the_noise_rule(speed_run) -> None:
    r, rep, out = speed_run
    assert [b["temperature"] for b in rep["best"]] == [0.0, 0.6]
    for b in rep["best"]:
        ranked = sorted((o for o in rep["overall"] if o["temperature"] == b["temperature"]),
                        key=lambda o: o["ratio"], reverse=True)
        assert b["setting"] == ranked[0]["setting"] and b["runner_up"] == ranked[1]["setting"]
        assert b["wins"] + b["losses"] + b["ties"] == 4  # 2 runs x 2 prompts, paired
        assert b["sign_test_p"] == pytest.approx(stats.sign_test(b["wins"], b["losses"]))
        assert b["within_noise"] == (b["sign_test_p"] >= 0.05)
        assert b["within_noise"]  # 4 blocks can never reach p < 0.05 (4-0 gives 0.125)
        assert f"Best setting at temperature {b['temperature']:g}: {b['setting']}" in r.stdout
    assert "within noise" in r.stdout and "sign test" in r.stdout
    assert "Speed at temperature 0" in r.stdout and "strict-n2" in r.stdout
    md = (out / "table.md").read_text()
    assert "| code | 0 | plain |" in md and "Best setting at temperature 0" in md


def test_plots_are_png_files(speed_run) -> None:
    _, rep, _ = speed_run
    names = sorted(Path(p).name for p in rep["plots"])
    assert names == ["acceptance_by_position.png", "speed_vs_n_max.png", "speed_vs_relaxed_top_n.png"]
    for p in rep["plots"]:
        data = Path(p).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_bench_errors(srv: ServerThread, tmp_path: Path) -> None:
    r = bench_cli("no-such-model", "--quiet", srv=srv)
    assert r.returncode == 1 and "Error: model 'no-such-model' not found" in r.stderr
    r = bench_cli("tiny", "--n-max", "1,x", srv=srv)
    assert r.returncode == 1 and "--n-max takes comma-separated integers" in r.stderr
    bad = tmp_path / "grid.json"
    bad.write_text('{"n_max": [1], "bogus": 2}')
    r = bench_cli("tiny", "--grid", str(bad), srv=srv)
    assert r.returncode == 1 and "unknown grid keys: bogus" in r.stderr


def test_grid_file_and_prompts_file(srv: ServerThread, tmp_path: Path) -> None:
    (tmp_path / "grid.json").write_text(json.dumps({"settings": [
        {"name": "deep-pmin", "options": {"n_max": 3, "draft_schedule": "fixed", "draft_p_min": 0.5}},
        {"name": "lookup", "options": {"drafter": "ngram", "draft_num_predict": 2, "draft_schedule": "fixed"}}]}))
    (tmp_path / "prompts.json").write_text(json.dumps([{"name": "mine", "prompt": "def add(a, b):", "kind": "code"}]))
    r = bench_cli("tiny", "--grid", str(tmp_path / "grid.json"), "--prompts", str(tmp_path / "prompts.json"),
                  "--num-predict", "4", "--runs", "1", "--warmup", "0", "--temperature", "0", "--quiet",
                  "--json", str(tmp_path / "r.json"), srv=srv)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert [s["name"] for s in rep["settings"]] == ["plain", "deep-pmin", "lookup"]
    assert [s["kind"] for s in rep["settings"]] == ["plain", "strict", "ngram"]
    assert {m["setting"]: m["drafter"] for m in rep["measurements"]} == {"plain": "none", "deep-pmin": "model+suffix",
                                                                          "lookup": "ngram"}
    assert rep["best"][0]["within_noise"]  # one block: nothing can be told apart


# --- the quality harness --------------------------------------------------------------------------------


def test_quality_with_a_model_that_cannot_pass(srv: ServerThread, tmp_path: Path) -> None:
    r = bench_cli("tiny", "--quality", "--limit", "2", "--quality-num-predict", "12", "--num-predict", "12",
                  "--temperature", "0,1", "--min-p", "0", "--relaxed", "20", "--relaxed-n-max", "2", "--timeout", "5",
                  "--json", str(tmp_path / "q.json"), "--plots", str(tmp_path / "plots"), srv=srv)
    assert r.returncode == 0, r.stderr
    q = json.loads((tmp_path / "q.json").read_text())["quality"]
    assert [s["name"] for s in q["settings"]] == ["strict-n2", "relaxed20-n2"] and q["reference"] == "strict-n2"
    he = q["humaneval"]
    assert he["n_problems"] == 2 and len(he["problems"]) == 2 * 2 * 2  # problems x temperatures x settings
    assert {p["task_id"] for p in he["problems"]} == {"HumanEval/0", "HumanEval/1"}
    assert all(not p["passed"] and p["status"] in ("failed", "timeout") for p in he["problems"])
    lo, hi = stats.wilson(0, 2)
    assert len(he["summary"]) == 4
    for s in he["summary"]:
        assert s["passed"] == 0 and s["n"] == 2 and s["pass_at_1"] == 0.0
        assert (s["ci_low"], s["ci_high"]) == pytest.approx((lo, hi))
        if s["setting"] == "relaxed20-n2":
            assert s["verdict"] == "no measurable loss"
            assert s["vs_strict"] == {"both": 0, "strict_only": 0, "setting_only": 0, "neither": 2, "mcnemar_p": 1.0}
    assert q["prose"]["n_prompts"] == 6
    prose = {(s["temperature"], s["setting"]): s for s in q["prose"]["summary"]}
    for s in prose.values():
        assert 0 < s["tokens"] <= 6 * 12 and s["mean_nll"] > 0  # sampling may end a text early
    # At temperature 0 every emitted token is the target's greedy one, relaxed or not: the relaxed rule
    # ranks a draft among the candidates that survive the filters, and greedy keeps only one.
    assert prose[(0.0, "strict-n2")]["differs_from_greedy"] == prose[(0.0, "relaxed20-n2")]["differs_from_greedy"] == 0
    assert prose[(0.0, "relaxed20-n2")]["mean_nll"] == pytest.approx(prose[(0.0, "strict-n2")]["mean_nll"], abs=1e-4)
    # Sampling at temperature 1 emits non-greedy tokens, and the measurement sees them.
    assert prose[(1.0, "strict-n2")]["differs_from_greedy"] > 0 and prose[(1.0, "relaxed20-n2")]["differs_from_greedy"] > 0
    r1 = prose[(1.0, "relaxed20-n2")]
    assert r1["delta_nll_vs_strict"] == pytest.approx(r1["mean_nll"] - prose[(1.0, "strict-n2")]["mean_nll"])
    assert "HumanEval pass@1" in r.stdout and "no measurable loss" in r.stdout
    assert "relaxed_top_n equals strict at temperature 0" in r.stdout
    assert (tmp_path / "plots" / "quality_pass_at_1.png").read_bytes()[:4] == b"\x89PNG"


def test_canonical_solutions_pass_in_the_sandbox() -> None:
    problems = {p["task_id"]: p for p in quality.load_problems()}
    assert len(problems) == 164
    for tid in ("HumanEval/0", "HumanEval/2", "HumanEval/32", "HumanEval/162"):
        p = problems[tid]
        res = sandbox.run_program(quality.program(p, p["canonical_solution"]), timeout=20)
        assert res.passed, (tid, res)
        wrong = sandbox.run_program(quality.program(p, "    return None\n"), timeout=20)
        assert wrong.status == "failed" and "Error" in wrong.detail  # AssertionError or TypeError


def test_sandbox_kills_an_endless_loop() -> None:
    t0 = time.monotonic()
    res = sandbox.run_program("while True:\n    pass\n", timeout=2)
    assert res.status == "timeout" and not res.passed
    res2 = sandbox.run_program("import time\nwhile True:\n    time.sleep(0.05)\n", timeout=1)
    assert res2.status == "timeout" and "wall clock" in res2.detail
    assert time.monotonic() - t0 < 15


def test_sandbox_memory_bomb_fails_cleanly() -> None:
    res = sandbox.run_program("x = bytearray(8 * 1024 ** 3)\n", timeout=10, memory_bytes=512 << 20)
    assert res.status == "failed" and res.detail == "MemoryError" and res.seconds < 10
    res = sandbox.run_program("x = [0] * (10 ** 10)\n", timeout=10, memory_bytes=512 << 20)
    assert res.status == "failed" and "MemoryError" in res.detail


def test_sandbox_isolation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_TEST_SECRET", "hunter2")
    code = ("import os, sys\nassert 'TANDEM_TEST_SECRET' not in os.environ\nassert sys.flags.isolated\n"
            "assert os.getcwd().split('/')[-1].startswith('tandem-sandbox-')\n")
    assert sandbox.run_program(code).passed
    assert sandbox.run_program("import os\nos.system('true')\n").status == "failed"
    assert "network access is disabled" in sandbox.run_program("import socket\nsocket.socket()\n").detail
    assert sandbox.run_program("import subprocess\nsubprocess.run(['true'])\n").status == "failed"


def test_sanitize_keeps_the_function_and_drops_usage() -> None:
    text = ("    return a + b\n\n\ndef helper(x):\n    return x\n\n\nif __name__ == '__main__':\n"
            "    print(add(1, 2))\n")
    assert quality.sanitize(text) == "    return a + b\n\n\ndef helper(x):\n    return x\n\n\n"
    assert quality.sanitize("    return 1\n```\nThis function returns 1.") == "    return 1\n"
    assert quality.sanitize("    return 1\nprint(f(2))\n") == "    return 1\n"


def test_quality_settings_pick_a_strict_reference() -> None:
    g = grid.build_grid(n_max=(1, 2, 4), relaxed_top=(2, 5), relaxed_n_max=(2, 4))
    assert [s.name for s in quality.quality_settings(g)] == ["strict-n4", "relaxed2-n2", "relaxed5-n2",
                                                             "relaxed2-n4", "relaxed5-n4"]
    g = grid.build_grid(n_max=(1,), relaxed_top=(5,), relaxed_n_max=(3,))
    assert [s.name for s in quality.quality_settings(g)] == ["strict-n3", "relaxed5-n3"]


def test_token_stats_counts_ties_as_greedy() -> None:
    lps = [
        {"logprob": -0.1, "bytes": [97], "top_logprobs": [{"logprob": -0.1, "bytes": [97]}]},
        {"logprob": -2.0, "bytes": [98], "top_logprobs": [{"logprob": -0.5, "bytes": [99]}]},
        {"logprob": -0.7, "bytes": [100], "top_logprobs": [{"logprob": -0.7, "bytes": [101]}]},  # a tie
    ]
    nll, n, differs = quality.token_stats(lps)
    assert nll == pytest.approx(2.8) and n == 3 and differs == 1


# --- statistics and grid --------------------------------------------------------------------------------


def test_wilson_interval_known_values() -> None:
    assert stats.wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert stats.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert stats.wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert stats.wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert stats.wilson(0, 0) == (0.0, 1.0)


def test_sign_test_and_quantiles() -> None:
    assert stats.sign_test(6, 0) == pytest.approx(0.03125)
    assert stats.sign_test(5, 1) == pytest.approx(0.21875)
    assert stats.sign_test(3, 3) == 1.0 and stats.sign_test(0, 0) == 1.0
    assert stats.quantile([1, 2, 3, 4], 0.25) == pytest.approx(1.75)  # numpy's linear rule
    assert stats.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "q1": 1.5, "q3": 2.5, "min": 1.0, "max": 3.0, "n": 3}
    assert stats.geomean([1.0, 4.0]) == pytest.approx(2.0)


def _m(run, prompt, setting, tok_s):
    return {"run": run, "prompt": prompt, "temperature": 0.0, "setting": setting, "tok_s": tok_s, "eval_count": 10,
            "draft_n": 0, "draft_n_accepted": 0, "mean_accepted_length": 1.0, "acceptance_by_position": [],
            "mean_depth": 0.0, "drafter": "none"}


def test_noise_rule_on_synthetic_measurements() -> None:
    settings = [grid.PLAIN, grid.strict(2), grid.relaxed(5, 2)]
    # strict-n2 beats relaxed5-n2 in all 6 blocks (3 runs x 2 prompts): a real difference.
    ms = [m for run in range(3) for p in ("a", "b") for m in
          (_m(run, p, "plain", 10.0), _m(run, p, "strict-n2", 13.0 + run), _m(run, p, "relaxed5-n2", 12.0 + run))]
    b = analysis.analyse(ms, settings, [0.0])["best"][0]
    assert b["setting"] == "strict-n2" and b["runner_up"] == "relaxed5-n2" and b["lossless"]
    assert (b["wins"], b["losses"], b["sign_test_p"], b["within_noise"]) == (6, 0, pytest.approx(0.03125), False)
    # Alternating winners: within noise, whatever the medians say.
    ms = [m for run in range(3) for p in ("a", "b") for m in
          (_m(run, p, "plain", 10.0), _m(run, p, "strict-n2", 12.0 + (run % 2)), _m(run, p, "relaxed5-n2", 12.5))]
    b = analysis.analyse(ms, settings, [0.0])["best"][0]
    assert b["within_noise"] and b["sign_test_p"] > 0.05
    # A lossy winner also names the best lossless setting; plain can win when speculation only costs.
    ms = [m for run in range(2) for p in ("a",) for m in
          (_m(run, p, "plain", 10.0), _m(run, p, "strict-n2", 9.0), _m(run, p, "relaxed5-n2", 11.0))]
    b = analysis.analyse(ms, settings, [0.0])["best"][0]
    assert b["setting"] == "relaxed5-n2" and not b["lossless"] and b["best_lossless"]["setting"] == "plain"


def test_grid_names_and_files(tmp_path: Path) -> None:
    names = [s.name for s in grid.build_grid()]
    assert names == ["plain", "strict-n1", "strict-n2", "strict-n4", "relaxed1-n2", "relaxed2-n2", "relaxed5-n2",
                     "relaxed20-n2", "relaxed1-n4", "relaxed2-n4", "relaxed5-n4", "relaxed20-n4", "adaptive",
                     "ngram-n4", "ngram-adaptive"]
    s = grid.relaxed(5, 4)
    assert s.options == {"drafter": "auto", "draft_num_predict": 4, "draft_schedule": "fixed", "relaxed_top_n": 5}
    assert not s.lossless and grid.strict(2).lossless
    (tmp_path / "g.json").write_text(json.dumps({"n_max": [3], "relaxed": [], "adaptive": False, "ngram": False}))
    assert [s.name for s in grid.load_grid(tmp_path / "g.json")] == ["plain", "strict-n3"]
    (tmp_path / "l.json").write_text(json.dumps([{"name": "x", "options": {"relaxed_top_n": 3, "n_max": 2}}]))
    loaded = grid.load_grid(tmp_path / "l.json")
    assert [(s.name, s.kind, s.n_max) for s in loaded] == [("plain", "plain", 0), ("x", "relaxed", 2)]
    with pytest.raises(grid.GridError):
        grid.parse_int_list("0,1", "--n-max")


# --- the engine: logprobs under speculation are the target's ------------------------------------------


def test_logprobs_under_relaxed_speculation_are_the_targets(pair: tuple[Path, Path]) -> None:
    """What the prose measurement relies on: with a lossy rule accepting drafts the target would not
    have picked, each emitted token's logprob is still the target's log-probability of it given the
    emitted prefix, and top_logprobs[0] is the target's argmax there."""
    from engine.contract.options import Options
    from engine.contract.protocol import GenerateRequest, GenerateResult, LoadSpec
    from engine.runtime import ModelRuntime

    target, draft = pair
    torch.set_num_threads(1)
    engine = ModelRuntime.load(LoadSpec(model_path=str(target), draft_path=str(draft), num_ctx=256, device="cpu",
                                  weight_format="f32", draft_weight_format="f32"))
    opts = {"temperature": 1.0, "seed": 7, "num_predict": 40, "drafter": "model", "draft_num_predict": 3,
            "draft_schedule": "fixed", "relaxed_top_n": 20, "draft_trace": True}
    lps, result = [], None
    req = GenerateRequest(prompt="def add(a, b):", options=Options.from_map(opts), logprobs=True, top_logprobs=1)
    for item in engine.generate(req):
        if isinstance(item, GenerateResult):
            result = item
        else:
            lps += item.logprobs or []
    assert result is not None and result.speculation.trace
    # The relaxed rule accepted drafts the strict test rejected (rank acceptance): lossy tokens.
    assert any(d["decision"] == "accept-rank" for d in result.speculation.trace)
    ctx, n_prompt = result.context, result.prompt_eval_count
    tokens = ctx[n_prompt:]
    assert len(lps) == len(tokens) == result.eval_count
    ref = torch.log_softmax(engine.target.forward(ctx[:-1], engine.target.new_cache(256), logits_for="all").double(), -1)
    not_greedy = 0
    for i, (tok, lp) in enumerate(zip(tokens, lps)):
        row = ref[n_prompt - 1 + i]
        assert lp.logprob == pytest.approx(float(row[tok]), abs=1e-4)
        best = int(torch.argmax(row))
        assert lp.top_logprobs[0][2] == list(engine.tokenizer.token_to_piece(best))
        assert lp.top_logprobs[0][1] == pytest.approx(float(row[best]), abs=1e-4)
        not_greedy += tok != best
    assert not_greedy > 0  # non-greedy tokens were emitted, so the top-1 check above meant something


def test_engine_bench_spec_uses_the_shared_prompts(pair: tuple[Path, Path], tmp_path: Path) -> None:
    from benchmarks import speculation as bench_spec
    from server.cli.bench import prompt_sets

    assert bench_spec.PROMPTS is prompt_sets.PROMPTS and bench_spec.TEMPERATURES is prompt_sets.TEMPERATURES
    target, draft = pair
    assert bench_spec.main(["--model", str(target), "--draft", str(draft), "--tokens", "4", "--runs", "1",
                            "--warmup", "0", "--prompts", "code", "--temps", "0,0.6", "--configs",
                            "plain,strict-n2,strict-n4,match-n4", "--threads", "1", "--paired", "--json", str(tmp_path / "s.json"),
                            "--markdown", str(tmp_path / "s.md")]) == 0
    report = json.loads((tmp_path / "s.json").read_text())
    # The written table names the host and the command that produced it.
    md = (tmp_path / "s.md").read_text()
    assert md.startswith("# Speculation, one interleaved run") and "1 threads, torch" in md
    assert "`python -m benchmarks.speculation --model" in md and "--configs plain,strict-n2,strict-n4,match-n4" in md
    rows = report["results"]
    assert [r["config"] for r in rows] == ["plain", "strict-n2", "strict-n4"] + ["plain", "strict-n2", "strict-n4", "match-n4"]
    # --paired: plain also ran right before each other configuration (its cell holds those runs too),
    # and each configuration reports the median of its ratios to those adjacent runs.
    assert [r["runs"] for r in rows] == [3, 1, 1, 4, 1, 1, 1]
    assert all((r["paired_ratio"] is None) == (r["config"] == "plain") for r in rows)
    assert "| × plain (paired) |" in md
    # The rule comparison pairs match-n4 with strict-n4 and scores both rules on strict's drafts.
    [mvs] = report["match_vs_strict"]
    assert mvs["temperature"] == "0.6" and mvs["paired_positions"] > 0
    assert mvs["paired_strict"] >= mvs["paired_match"]


def test_a_paired_loss_is_a_loss_though_the_intervals_overlap() -> None:
    """What the 1.5B with its trained MTP head measured (docs/bench/mtp-head-qwen15b-epyc-zen3-dec05.md): 164
    HumanEval problems, strict 118 passed, relaxed5-n2 109, 13 lost and 4 gained on the same problems. The
    intervals overlap, the paired test does not (p = 0.049): that is a loss, not "no measurable loss"."""
    settings = [grid.Setting("strict-n2", {}, kind="strict", n_max=2), grid.Setting("relaxed5-n2", {}, kind="relaxed",
                                                                                  n_max=2)]
    strict_pass = [True] * 118 + [False] * 46
    relaxed_pass = [True] * 105 + [False] * 13 + [True] * 4 + [False] * 42
    rows = [{"setting": name, "temperature": 0.6, "task_id": f"HumanEval/{i}", "passed": p, "status": "ok"}
            for name, passed in (("strict-n2", strict_pass), ("relaxed5-n2", relaxed_pass)) for i, p in enumerate(passed)]
    strict_row, relaxed_row = quality.summarize_humaneval(rows, settings, [0.6])
    assert stats.overlap((relaxed_row["ci_low"], relaxed_row["ci_high"]), (strict_row["ci_low"], strict_row["ci_high"]))
    assert relaxed_row["vs_strict"]["mcnemar_p"] == pytest.approx(0.049, abs=1e-3)
    assert relaxed_row["verdict"] == "measurable loss"
    balanced = [{"setting": "relaxed5-n2", "temperature": 0.6, "task_id": f"HumanEval/{i}", "passed": p, "status": "ok"}
                for i, p in enumerate([True] * 113 + [False] * 5 + [True] * 3 + [False] * 43)]
    strict_rows = [r for r in rows if r["setting"] == "strict-n2"]
    assert quality.summarize_humaneval(strict_rows + balanced, settings, [0.6])[1]["verdict"] == "no measurable loss"
