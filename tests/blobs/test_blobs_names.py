from pathlib import PurePosixPath

import pytest

from blobs import InvalidDigestError, InvalidNameError, ModelName, parse_digest
from blobs.names import BlobsError

HEX = "a" * 64


@pytest.mark.parametrize(
    "s, parts",
    [
        ("llama3", ("registry.ollama.ai", "library", "llama3", "latest")),
        ("llama3.2:1b", ("registry.ollama.ai", "library", "llama3.2", "1b")),
        ("Llama3:Latest", ("registry.ollama.ai", "library", "Llama3", "Latest")),
        ("user/model", ("registry.ollama.ai", "user", "model", "latest")),
        ("user/model:v1.0-beta_2", ("registry.ollama.ai", "user", "model", "v1.0-beta_2")),
        ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
         ("hf.co", "bartowski", "Llama-3.2-1B-Instruct-GGUF", "Q4_K_M")),
        ("example.com/ns/model:tag", ("example.com", "ns", "model", "tag")),
        # a ':' before the last '/' is a host port, not a tag
        ("localhost:5000/ns/model", ("localhost:5000", "ns", "model", "latest")),
        ("localhost:5000/ns/model:7b", ("localhost:5000", "ns", "model", "7b")),
        ("https://hf.co/org/repo:Q8_0", ("hf.co", "org", "repo", "Q8_0")),
        ("http://example.com/ns/model", ("example.com", "ns", "model", "latest")),
        ("_x/_y:_z", ("registry.ollama.ai", "_x", "_y", "_z")),
        ("h" * 350 + "/n/m", ("h" * 350, "n", "m", "latest")),
        ("n" * 80 + "/" + "m" * 80 + ":" + "t" * 80, ("registry.ollama.ai", "n" * 80, "m" * 80, "t" * 80)),
    ],
)
def test_parse_valid(s, parts):
    assert ModelName.parse(s).parts() == parts


@pytest.mark.parametrize(
    "s",
    [
        "",
        ":",
        "model:",
        ":tag",
        "/model",
        "ns/",
        "a/b/c/d",  # too many parts: host would contain '/'
        "host//model",
        "ns.dots/model",  # namespaces can't contain '.'
        "-model",
        ".model",
        "model:-tag",
        "model:.tag",
        "model:tag:extra",
        "mo del",
        "model!",
        "modèle",  # non-ASCII
        "m" * 81,
        "n" * 81 + "/m",
        "m:" + "t" * 81,
        "h" * 351 + "/n/m",
        "model@sha256-" + HEX,
        "ns/model:tag/x",
    ],
)
def test_parse_invalid(s):
    with pytest.raises(InvalidNameError) as ei:
        ModelName.parse(s)
    assert str(ei.value) == "invalid model name"
    assert isinstance(ei.value, BlobsError) and isinstance(ei.value, ValueError)


def test_constructor_validates_so_paths_cannot_escape():
    for bad in [("..", "library", "m", "latest"), ("h", "..", "m", "t"), ("h", "n", "../x", "t"), ("h", "n", "m", "")]:
        with pytest.raises(InvalidNameError):
            ModelName(*bad)


@pytest.mark.parametrize(
    "s, shown",
    [
        ("llama3", "llama3:latest"),
        ("llama3:8b", "llama3:8b"),
        ("user/model", "user/model:latest"),
        ("hf.co/org/repo:Q4_K_M", "hf.co/org/repo:Q4_K_M"),
        ("hf.co/library/repo", "hf.co/library/repo:latest"),
        # defaults are compared case-insensitively, like DisplayShortest's EqualFold
        ("Registry.Ollama.AI/Library/Mistral", "Mistral:latest"),
        ("registry.ollama.ai/other/m:t", "other/m:t"),
    ],
)
def test_display(s, shown):
    assert ModelName.parse(s).display() == shown


def test_str_and_manifest_relpath():
    n = ModelName.parse("hf.co/org/repo:Q4_K_M")
    assert str(n) == "hf.co/org/repo:Q4_K_M"
    assert str(ModelName.parse("llama3")) == "registry.ollama.ai/library/llama3:latest"
    assert n.manifest_relpath() == PurePosixPath("manifests/hf.co/org/repo/Q4_K_M")
    assert ModelName.parse("localhost:5000/a/b").manifest_relpath() == PurePosixPath(
        "manifests/localhost:5000/a/b/latest"
    )


def test_equality_and_fold():
    a, b = ModelName.parse("Llama3"), ModelName.parse("llama3:LATEST")
    assert a != b  # case is preserved ...
    assert a.equal_fold(b) and a.fold_key() == b.fold_key()  # ... but compares equal folded
    assert ModelName.parse(a) is a
    # a name written in full and its short form are one dict key (the store's caches key by name)
    full = ModelName.parse("registry.ollama.ai/library/x:latest")
    assert ModelName.parse("x") == full and {ModelName.parse("x"): 1}[full] == 1
    assert ModelName.parse("x:v2") not in {full: 1}


def test_parse_digest():
    assert parse_digest("sha256:" + HEX) == "sha256:" + HEX
    assert parse_digest("sha256-" + HEX.upper()) == "sha256:" + HEX
    for bad in ["", "sha256:" + HEX[:-1], "sha256:" + HEX + "0", "sha512:" + HEX, HEX, "sha256:" + "g" * 64,
                "sha256_" + HEX, " sha256:" + HEX, None]:
        with pytest.raises(InvalidDigestError) as ei:
            parse_digest(bad)
        assert str(ei.value) == "invalid digest format"
