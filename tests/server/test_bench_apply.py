"""`tandem bench --apply [--as NEW] [--allow-lossy]`: the winning setting written into the model through the
server's /api/create, with its provenance (the tandem tuning layer) in /api/show and `tandem show`; the
claim follows `cp` and is dropped for a parameter a later create sets by hand.

Which setting wins a sweep of a tiny model is noise, so most tests force the winner by wrapping
``analysis.best`` (the sweep, the choice and the create through the server all run for real); one runs
the CLI unforced and checks that the model holds whatever it reported applying.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from blobs import MEDIA_TYPE_MODEL, MEDIA_TYPE_TUNING
from server.cli.client import APIError, Client
from server.cli.bench import analysis
from server.cli.commands import _local_show, main
from tests.server_thread import ServerThread, make_store

REPO = Path(__file__).resolve().parents[2]
# plain, strict-n2 and relaxed5-n2 (lossy): one prompt, one run, four tokens
FAST = ["--prompt-names", "code", "--num-predict", "4", "--runs", "1", "--warmup", "0", "--n-max", "2",
        "--relaxed", "5", "--relaxed-n-max", "2", "--no-adaptive", "--no-ngram", "--quiet"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    with ServerThread(make_store(tmp_path_factory.mktemp("bench-apply"), name="tiny")) as server:
        yield server


@pytest.fixture
def cli(srv: ServerThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """`tandem ...` in this process against the server (an empty local store, so nothing is read from it)."""
    monkeypatch.setenv("TANDEM_HOST", srv.url)
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "local"))
    monkeypatch.delenv("OLLAMA_HOST", raising=False)

    def run(*argv: str) -> tuple[int, str, str]:
        rc = main(list(argv))
        out = capsys.readouterr()
        return rc, out.out, out.err
    return run


@pytest.fixture
def api(srv: ServerThread):
    with Client(srv.url) as c:
        yield c


def fresh(api: Client, name: str) -> str:
    api.copy("tiny", name)
    return name


def force(monkeypatch: pytest.MonkeyPatch, setting: str, ratio: float, safe: tuple[str, float] | None = None) -> None:
    """Make ``setting`` the measured best at every temperature (and ``safe`` its best lossless one)."""
    real = analysis.best

    def best(*args: Any, **kw: Any) -> list[dict[str, Any]]:
        out = real(*args, **kw)
        for entry in out:
            entry.update(setting=setting, ratio=ratio, lossless=safe is None, within_noise=True,
                         runner_up="strict-n2" if setting == "plain" else "plain",
                         runner_up_ratio=0.9 if setting == "plain" else 1.0)
            entry.pop("best_lossless", None)
            if safe:
                entry["best_lossless"] = {"setting": safe[0], "ratio": safe[1]}
        return out
    monkeypatch.setattr(analysis, "best", best)


def params(api: Client, name: str) -> dict[str, str]:
    return {line[:30].strip(): line[30:].strip() for line in api.show(name)["parameters"].splitlines()}


def digest(api: Client, name: str) -> str:
    return next(m["digest"] for m in api.tags()["models"] if m["name"] == f"{name}:latest")


def test_apply_writes_the_setting_and_its_provenance(cli, api, srv, monkeypatch, tmp_path) -> None:
    name = fresh(api, "tiny-apply")
    force(monkeypatch, "strict-n2", 1.42)
    # Two temperatures, one of them the model's own (its PARAMETER temperature 0): that one is applied.
    rc, out, err = cli("bench", name, *FAST, "--temperature", "0,0.6", "--apply", "--json", str(tmp_path / "r.json"))
    assert rc == 0, err
    assert "applied strict-n2 to tiny-apply: drafter auto, draft_num_predict 2, draft_schedule fixed, " \
           "relaxed_top_n 0 (1.42x plain at temperature 0, within noise of the runner-up)" in out
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["applied"] == {"model": name, "temperature": 0.0, "parameters": {
        "drafter": "auto", "draft_num_predict": 2, "draft_schedule": "fixed", "relaxed_top_n": 0}}
    p = params(api, name)
    assert (p["draft_num_predict"], p["draft_schedule"], p["drafter"], p["relaxed_top_n"]) == \
           ("2", '"fixed"', '"auto"', "0")
    assert (p["temperature"], p["num_predict"]) == ("0", "8")  # the model's own parameters are kept
    # Only speculation knobs are written: not the sweep's temperature, seed or num_predict.
    assert set(p) == {"temperature", "num_predict", "drafter", "draft_num_predict", "draft_schedule", "relaxed_top_n"}
    tuning = api.show(name)["speculation"]["tuning"]
    assert set(tuning) == {"drafter", "draft_num_predict", "draft_schedule", "relaxed_top_n"}
    claim = tuning["draft_num_predict"]
    assert claim["source"] == "tandem bench" and claim["setting"] == "strict-n2" and claim["ratio"] == 1.42
    assert claim["value"] == 2 and claim["temperature"] == 0.0 and claim["prompts"] == ["code"]
    assert claim["lossless"] is True and claim["within_noise"] is True and claim["runs"] == 1
    assert claim["measured_at"] == rep["created_at"] and "cpu" not in claim  # the server names no CPU
    # The layer is tandem's own media type, beside Ollama's params layer.
    assert srv.store.read_manifest(name).layer(MEDIA_TYPE_TUNING) is not None

    date = rep["created_at"][:10]
    rc, out, _ = cli("show", name)
    assert rc == 0
    line = next(x for x in out.splitlines() if x.strip().startswith("draft_num_predict"))
    assert line.endswith(f"(tandem bench: 1.42x plain (strict-n2) on code at temperature 0, within noise of the "
                         f"runner-up, {date})")
    assert "tandem bench" not in next(x for x in out.splitlines() if x.strip().startswith("temperature"))
    # The local store's show reads the same layer.
    assert _local_show(srv.store, name)["speculation"]["tuning"]["draft_schedule"]["setting"] == "strict-n2"

    # `tandem cp` carries the claim; a later create that sets a parameter by hand drops that one claim.
    rc, _, err = cli("cp", name, "tiny-apply-copy")
    assert rc == 0, err
    assert api.show("tiny-apply-copy")["speculation"]["tuning"] == tuning
    for _ in api.create({"model": "tiny-apply-copy", "from": "tiny-apply-copy", "parameters": {"draft_num_predict": 3}}):
        pass
    after = api.show("tiny-apply-copy")["speculation"]["tuning"]
    assert set(after) == {"drafter", "draft_schedule", "relaxed_top_n"}
    rc, out, _ = cli("show", "tiny-apply-copy")
    line = next(x for x in out.splitlines() if x.strip().startswith("draft_num_predict"))
    assert line.split() == ["draft_num_predict", "3"]
    # Setting the rest by hand, even to the same values, leaves nothing claimed: no tuning layer at all.
    for _ in api.create({"model": "tiny-apply-copy", "from": "tiny-apply-copy", "parameters": {
            "drafter": "auto", "draft_schedule": "fixed", "relaxed_top_n": 0}}):
        pass
    assert api.show("tiny-apply-copy")["speculation"]["tuning"] == {}
    assert srv.store.read_manifest("tiny-apply-copy").layer(MEDIA_TYPE_TUNING) is None
    assert api.show(name)["speculation"]["tuning"] == tuning  # the original is untouched


def test_apply_as_new_leaves_the_model_unchanged(cli, api, monkeypatch) -> None:
    name = fresh(api, "tiny-as")
    before = digest(api, name)
    force(monkeypatch, "strict-n2", 1.3)
    rc, out, err = cli("bench", name, *FAST, "--temperature", "0", "--apply", "--as", "tiny-tuned")
    assert rc == 0, err
    assert "applied strict-n2 to tiny-tuned" in out
    assert digest(api, name) == before and api.show(name)["speculation"]["tuning"] == {}
    assert "draft_num_predict" not in params(api, name)
    assert params(api, "tiny-tuned")["draft_num_predict"] == "2"
    assert api.show("tiny-tuned")["speculation"]["tuning"]["draft_num_predict"]["ratio"] == 1.3


def test_a_lossy_winner_needs_allow_lossy(cli, api, monkeypatch) -> None:
    name = fresh(api, "tiny-lossy")
    force(monkeypatch, "relaxed5-n2", 1.6, safe=("strict-n2", 1.2))
    rc, out, err = cli("bench", name, *FAST, "--temperature", "0", "--apply")
    assert rc == 0, err
    assert "the fastest setting, relaxed5-n2 (1.60x plain), is lossy" in out
    assert "applied strict-n2 to tiny-lossy" in out and "(1.20x plain at temperature 0)" in out
    p = params(api, name)
    assert p["relaxed_top_n"] == "0" and p["draft_num_predict"] == "2"
    claim = api.show(name)["speculation"]["tuning"]["relaxed_top_n"]
    assert claim["setting"] == "strict-n2" and claim["lossless"] is True and "within_noise" not in claim

    rc, out, err = cli("bench", name, *FAST, "--temperature", "0", "--apply", "--allow-lossy")
    assert rc == 0, err
    assert "applied relaxed5-n2 to tiny-lossy" in out
    assert params(api, name)["relaxed_top_n"] == "5"
    claim = api.show(name)["speculation"]["tuning"]["relaxed_top_n"]
    assert claim["setting"] == "relaxed5-n2" and claim["lossless"] is False and claim["ratio"] == 1.6
    rc, out, _ = cli("show", name)
    assert "1.60x plain (relaxed5-n2) on code at temperature 0, lossy" in out


def test_plain_winning(cli, api, srv, monkeypatch) -> None:
    # The pair speculates by default (a DRAFT layer, drafter auto): plain winning means drafter none.
    name = fresh(api, "tiny-plain")
    force(monkeypatch, "plain", 1.0)
    rc, out, err = cli("bench", name, *FAST, "--temperature", "0", "--apply")
    assert rc == 0, err
    assert "applied plain decoding to tiny-plain: drafter none" in out
    assert params(api, name)["drafter"] == '"none"'
    rc, out, _ = cli("show", name)
    assert "(tandem bench: plain decoding fastest (next: strict-n2 at 0.90x) on code at temperature 0" in out
    # A model that does not speculate by default (no DRAFT, and drafting from earlier outputs turned off) is left
    # as it is.
    target = srv.store.read_manifest("tiny").layer(MEDIA_TYPE_MODEL).digest
    for _ in api.create({"model": "solo", "files": {"t.gguf": target},
                         "parameters": {"temperature": 0, "draft_suffix": False}}):
        pass
    before = digest(api, "solo")
    rc, out, err = cli("bench", "solo", "--prompt-names", "code", "--num-predict", "4", "--runs", "1", "--warmup", "0",
                       "--quiet", "--temperature", "0", "--apply")
    assert rc == 0, err
    assert "plain decoding was fastest at temperature 0 and solo does not speculate by default: nothing to apply" in out
    assert digest(api, "solo") == before


def test_apply_refuses_before_measuring(cli, api) -> None:
    name = fresh(api, "tiny-refuse")
    rc, _, err = cli("bench", name, *FAST, "--temperature", "0.6,1", "--apply")
    assert rc == 1
    assert ("--apply writes the best setting of one temperature, and 0.6, 1 were asked for, none of them the "
            "model's own (0, its temperature PARAMETER); pass a single --temperature (e.g. --temperature 0)") in err
    assert api.show(name)["speculation"]["tuning"] == {}
    rc, _, err = cli("bench", name, "--as", "x")
    assert rc == 1 and "--as and --allow-lossy only go with --apply" in err
    rc, _, err = cli("bench", name, "--quality", "--apply")
    assert rc == 1 and "--apply goes with the speed sweep, not --quality" in err


def test_create_rejects_a_claim_without_its_parameter(api) -> None:
    with pytest.raises(APIError, match="tuning describes parameter 'draft_num_predict', which parameters does not set"):
        for _ in api.create({"model": "bad", "from": "tiny", "parameters": {"relaxed_top_n": 0},
                             "tuning": {"draft_num_predict": {"source": "me"}}}):
            pass
    # The server stamps the value: a claim cannot describe another value than the one stored.
    for _ in api.create({"model": "claimed", "from": "tiny", "parameters": {"draft_num_predict": 3},
                         "tuning": {"draft_num_predict": {"source": "me", "value": 99}}}):
        pass
    assert api.show("claimed")["speculation"]["tuning"] == {"draft_num_predict": {"source": "me", "value": 3}}
    # Set by hand under its alias (a Modelfile's PARAMETER n_max), the parameter loses its claim too.
    for _ in api.create({"model": "claimed", "from": "claimed", "parameters": {"n_max": 4}}):
        pass
    assert api.show("claimed")["speculation"]["tuning"] == {}


def test_unforced_apply_through_the_cli(srv: ServerThread, api: Client, tmp_path: Path) -> None:
    """The command as a user runs it: whatever wins, the model then holds what the report says was applied."""
    name = fresh(api, "tiny-real")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TANDEM_HOST": srv.url}
    r = subprocess.run([sys.executable, "-m", "server.cli", "bench", name, *FAST, "--apply",
                        "--json", str(tmp_path / "r.json")], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    applied = rep["applied"]["parameters"]
    assert rep["applied"]["temperature"] == 0.0 and applied  # the pair speculates by default: something is written
    best = next(b for b in rep["best"] if b["temperature"] == 0.0)
    expected = best["setting"] if best["lossless"] else best["best_lossless"]["setting"]
    tuning = api.show(name)["speculation"]["tuning"]
    assert set(tuning) == set(applied) and {c["setting"] for c in tuning.values()} == {expected}
    p = params(api, name)
    for key, value in applied.items():
        assert p[key] == (f'"{value}"' if isinstance(value, str) else str(value))
