"""benchmarks.depth_sim: the adaptive controller driven through simulated requests on a measured host profile."""

from __future__ import annotations

from benchmarks import depth_sim


def test_simulated_controller_gains_where_drafts_are_accepted_and_stays_near_plain_where_not(tmp_path, capsys):
    host = depth_sim.HOSTS["busy-avx2"]
    ratios = depth_sim.simulate(host, ["rewrite", "useless", "code"], seeds=6, tokens=96)
    assert ratios["rewrite"] > 1.1 and ratios["code"] > 1.05
    assert ratios["useless"] > 0.9  # a drafter the text rejects costs the start-of-request probes, no more
    assert depth_sim.best_fixed(host, depth_sim.TEXTS["useless"]) == (0, 1.0)
    md = tmp_path / "sim.md"
    assert depth_sim.main(["--seeds", "2", "--order", "prose,code", "--markdown", str(md)]) == 0
    table = md.read_text()
    assert table in capsys.readouterr().out
    assert "| prose |" in table and "| code |" in table
