"""The importer's architecture registry (importer/architectures/) is the one place an architecture is registered.

* every architecture it converts is one the engine runs (engine.contract.capabilities), and every Hugging Face
  class and model type maps to it once;
* every module in importer/architectures/ is registered;
* the generic modules (the rest of importer/) hold no architecture-name branches: no comparison against, and no
  ``startswith`` / ``endswith`` test for, an architecture's GGUF name, Hugging Face class or model type. What
  there is to know about one architecture is a field of its spec.
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest

import importer.architectures as registry
from engine.contract.capabilities import DRAFTER_ARCHITECTURES, SUPPORTED_ARCHITECTURES
from importer.architectures.spec import ArchitectureSpec
from importer.hf_config import read_params
from importer.request import CreateError

IMPORTER = Path(registry.__file__).resolve().parent.parent
# Modules of importer/architectures/ that are no architecture: the spec type.
NOT_ARCHITECTURES = {"spec"}

# Literals the generic modules may compare against, each for a reason that is not an architecture branch.
ALLOWED = {
    # the GGUF tokenizer model "llama" (SentencePiece-style scores, no merges), a name space of its own
    ("hf_tokenizer.py", "llama"),
    # Ollama's quantization rule for the Gated DeltaNet families, keyed on any GGUF's architecture (qwen3next
    # included, which tandem never converts): a GGUF given as it is gets it too
    ("quantize.py", "qwen35"),
    ("quantize.py", "qwen35moe"),
}


def test_every_architecture_is_one_the_engine_runs() -> None:
    runs = SUPPORTED_ARCHITECTURES | DRAFTER_ARCHITECTURES
    assert registry.SPECS, "no architecture registered"
    for spec in registry.SPECS:
        assert isinstance(spec, ArchitectureSpec)
        assert spec.arch in runs, f"importer/architectures registers {spec.arch}, which the engine does not run"
        assert spec.hf_classes, f"{spec.arch} accepts no Hugging Face class"
        assert set(spec.model_types.values()) <= set(spec.hf_classes), spec.arch
    for hf_class, arch in registry.ARCHITECTURES.items():
        assert arch in runs, f"{hf_class} converts to {arch}, which the engine does not run"
    classes = [c for spec in registry.SPECS for c in spec.hf_classes]
    assert len(classes) == len(set(classes)), "a Hugging Face class is registered twice"


def test_every_module_is_registered() -> None:
    modules = {info.name for info in pkgutil.iter_modules(registry.__path__)} - NOT_ARCHITECTURES
    registered = {m.__name__.rsplit(".", 1)[-1] for m in registry.MODULES}
    assert modules == registered, f"modules {sorted(modules - registered)} are not in MODULES"
    for module in registry.MODULES:
        assert module.SPECS and all(isinstance(s, ArchitectureSpec) for s in module.SPECS), module.__name__
    assert {s.arch for m in registry.MODULES for s in m.SPECS} == set(registry.BY_ARCH)


@pytest.mark.parametrize("spec", [s for s in registry.SPECS if s.convert_folder is None], ids=lambda s: s.arch)
def test_each_decoder_class_reads_as_its_architecture(spec: ArchitectureSpec) -> None:
    """A config.json naming the class (or only its model type) reaches the spec's own reading; an unknown one
    is refused with every class listed."""
    bad = {"hidden_act": "no-such-activation", "hidden_activation": "no-such-activation"}
    config = {**bad, "text_config": bad}  # a multimodal class reads its text model's config
    for hf_class in spec.hf_classes:
        with pytest.raises(CreateError) as e:
            read_params({"architectures": [hf_class], **config}, "FROM")
        assert f"activation 'no-such-activation' is not supported for {spec.arch} " in str(e.value)
    for model_type in spec.model_types:
        with pytest.raises(CreateError) as e:
            read_params({"model_type": model_type, **config}, "FROM")
        assert f"activation 'no-such-activation' is not supported for {spec.arch} " in str(e.value)


def test_an_unregistered_class_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(CreateError) as e:
        read_params({"architectures": ["MambaForCausalLM"]}, "FROM")
    assert ", ".join(registry.ARCHITECTURES) in str(e.value)


def _names() -> set[str]:
    names = set()
    for spec in registry.SPECS:
        names |= {spec.arch, *spec.hf_classes, *spec.model_types}
    return names


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for elt in node.elts for s in _strings(elt)]
    return []


def architecture_branches(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, literal) of each comparison against an architecture name, and of each ``startswith`` / ``endswith``
    with a literal that begins one (``arch.startswith("gemma")``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        literals: list[str] = []
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                literals += [s for s in _strings(operand) if s in names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith")):
            for arg in node.args:
                literals += [s for s in _strings(arg)
                             if s and any(n.startswith(s) or n.endswith(s) for n in names) and s.isidentifier()]
        found += [(node.lineno, s) for s in literals]
    return found


def generic_modules() -> list[Path]:
    return sorted(p for p in IMPORTER.rglob("*.py") if "architectures" not in p.relative_to(IMPORTER).parts)


def test_the_generic_modules_hold_no_architecture_branches() -> None:
    names = _names()
    offenders = [f"{path.relative_to(IMPORTER)}:{line}: {literal!r}" for path in generic_modules()
                 for line, literal in architecture_branches(path.read_text(encoding="utf-8"), names)
                 if (str(path.relative_to(IMPORTER)), literal) not in ALLOWED]
    assert not offenders, "architecture branches outside importer/architectures/:\n" + "\n".join(offenders)
    found = {(str(path.relative_to(IMPORTER)), literal) for path in generic_modules()
             for _, literal in architecture_branches(path.read_text(encoding="utf-8"), names)}
    assert ALLOWED <= found, f"stale exemptions: {sorted(ALLOWED - found)}"


def test_the_scan_finds_a_branch() -> None:
    """The scan above fails on the branches it is there to catch."""
    names = _names()
    src = ('if p.arch == "gemma3": pass\nif arch in ("qwen3", "qwen3moe"): pass\n'
           'x = arch.startswith("gemma")\ny = hf_arch == "Qwen3_5ForCausalLM"\nz = name == "token_embd.weight"\n')
    assert [s for _, s in architecture_branches(src, names)] == ["gemma3", "qwen3", "qwen3moe", "gemma",
                                                                 "Qwen3_5ForCausalLM"]
