"""benchmarks.pair_in_batch runs end to end on a tiny pair and reports each client count."""

from __future__ import annotations

from benchmarks import pair_in_batch
from tests.engine.speculative.test_speculation import write_model


def test_pair_in_batch_reports_each_client_count(tmp_path):
    target, draft = write_model(tmp_path, "t", seed=0), write_model(tmp_path, "d", seed=0, noise=0.3)
    out = pair_in_batch.main([str(target), str(draft), "--slots", "2", "--clients", "1,2", "--reps", "1",
                              "--tokens", "4", "--requests", "2", "--threads", "1", "--num-ctx", "128"])
    rows = [line.split("|")[1:3] for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert [(c.strip(), label.strip()) for c, label in rows] == [("1", "plain"), ("1", "pair"), ("2", "plain"),
                                                                 ("2", "pair")]


def test_code_prompts_and_fixed_depths_are_reported_beside_plain_and_the_adaptive_pair(tmp_path):
    target, draft = write_model(tmp_path, "t", seed=0), write_model(tmp_path, "d", seed=0, noise=0.3)
    out = pair_in_batch.main([str(target), str(draft), "--slots", "2", "--clients", "2", "--reps", "2",
                              "--tokens", "6", "--threads", "1", "--num-ctx", "128", "--prompts", "code",
                              "--depths", "1,2"])
    assert "the code prompts" in out
    rows = {line.split("|")[2].strip(): line.split("|") for line in out.splitlines() if line.startswith("| 2 |")}
    assert list(rows) == ["plain", "pair", "pair n=1", "pair n=2"]
    assert float(rows["plain"][5]) == 1.0  # plain over itself
    # a fixed depth drafts every round: tokens drafted in both reps; plain never drafts
    assert all(int(d) > 0 for d in rows["pair n=2"][6].split(","))
    assert rows["plain"][6].strip() == "0, 0"


def test_warm_up_reps_run_every_configuration_first_and_are_not_reported(tmp_path, monkeypatch):
    target, draft = write_model(tmp_path, "t", seed=0), write_model(tmp_path, "d", seed=0, noise=0.3)
    calls = []
    real = pair_in_batch.aggregate

    def counted(runtime, clients, options, *args):
        calls.append((clients, options.get("drafter")))
        return real(runtime, clients, options, *args)

    monkeypatch.setattr(pair_in_batch, "aggregate", counted)
    out = pair_in_batch.main([str(target), str(draft), "--slots", "2", "--clients", "1", "--reps", "1",
                              "--warmup", "2", "--tokens", "3", "--threads", "1", "--num-ctx", "128"])
    # two warm-up reps and the measured one, plain and the pair each, every other rep in reverse; the measured
    # rep in the order it had without warm-up
    assert [d for _, d in calls] == ["none", "model", "model", "none", "none", "model"]
    rows = {line.split("|")[2].strip(): line.split("|") for line in out.splitlines() if line.startswith("| 1 |")}
    assert rows["plain"][4].strip() == "1.00"  # one rep reported: one ratio
    assert "2 warm-up rep(s) not reported" in out
