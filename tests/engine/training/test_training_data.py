"""What a drafter's training reads (engine.training.data): many files' worth of text, not a few files' length."""

from __future__ import annotations

from engine.training.data import files_under, gather_tokens


def words(text: str) -> list[int]:
    return [hash(w) % 1000 for w in text.split()]


def test_one_long_file_does_not_fill_the_budget(tmp_path):
    """A long file gives at most ``per_file`` tokens (its beginning) and the budget goes on to the next files."""
    (tmp_path / "long.txt").write_text("long " * 5000)
    for i in range(4):
        (tmp_path / f"short{i}.txt").write_text(f"short{i} " * 30)
    tokens = gather_tokens(files_under([tmp_path]), words, n_tokens=1000, per_file=50)
    counts = {w: tokens.count(words(w)[0]) for w in ["long", *(f"short{i}" for i in range(4))]}
    assert counts == {"long": 50, "short0": 30, "short1": 30, "short2": 30, "short3": 30}
    assert len(gather_tokens(files_under([tmp_path]), words, n_tokens=100, per_file=50)) == 100  # the budget
    assert gather_tokens(files_under([tmp_path]), words, n_tokens=1000, per_file=50) == tokens  # seeded: the same


def test_a_package_description_is_read_without_its_header_fields(tmp_path):
    meta = tmp_path / "pkg-1.0.dist-info" / "METADATA"
    meta.parent.mkdir()
    meta.write_text("Metadata-Version: 2.1\nName: pkg\nClassifier: Topic :: Foo\n\n# pkg\n\nA library that does things.\n")
    (tmp_path / "notes.txt").write_text("Metadata-Version: kept\n\nin a file of another name\n")
    text = " ".join(str(t) for t in gather_tokens([meta], lambda s: [s], 10))
    assert "A library that does things." in text and "Classifier" not in text and "Name: pkg" not in text
    kept = gather_tokens([tmp_path / "notes.txt"], lambda s: [s], 10)
    assert "Metadata-Version: kept" in kept[0]


def test_the_command_line_trains_with_the_trainers_default_window():
    """`tandem train-drafter` (which never imports torch) states the trainer's window default, not another."""
    import argparse

    from engine.training.fit import FitConfig
    from server.cli.train_drafter import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args(["m", "--as", "n"]).window == FitConfig.window
