"""The ADAPTER layer of a create: a LoRA adapter checked against the model it adapts, stored as llama.cpp's GGUF.

Two sources, as Ollama takes them:

* a GGUF LoRA (llama.cpp's ``convert_lora_to_gguf.py`` layout, ``engine.contract.adapter``): stored as it is;
* a PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``): converted here into that layout,
  the way llama.cpp's converter does it: each ``<module>.lora_A/B.weight`` named after its base weight with the
  importer's HF -> GGUF name map for the base architecture (``<gguf name>.lora_a`` [rank, in], ``.lora_b``
  [out, rank]), llama's q/k ``lora_B`` rows permuted as the base's q/k rows are, alpha in ``adapter.lora.alpha``.

Either way the adapter must fit the target (every adapted tensor exists, is a linear weight, and the shapes
agree); otherwise the create is a 400 that names the tensor. Only one adapter per create, as Ollama.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any, Mapping

from blobs import MEDIA_TYPE_ADAPTER, BlobStore, Layer
from engine.contract.adapter import LORA_A, LORA_B, AdapterError, read_lora
from engine.contract.gguf import GGUFError, GGUFFile

from .architectures import BY_ARCH, SKIPPED_PREFIXES
from .hf.plan import TensorPlan, prepare, text_name
from .request import CreateError, Progress, ProgressEvent
from .uploads import sort_weights
from .hf.safetensors import HFSource, TensorReader, folder_paths, read_header

ROLE = "ADAPTER"
# GGUF architecture -> gguf's tensor-name map, for the architectures whose names the generic planner maps
_NAME_MAPS = {spec.arch: spec.name_map for spec in BY_ARCH.values() if spec.name_map is not None}
CONFIG_FILE = "adapter_config.json"
# base_model.model.<module>.lora_A.weight; older PEFT also keeps the adapter's name (lora_A.default.weight).
_PEFT_RE = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.[^.]+)?\.weight$")


def _fail(message: str) -> CreateError:
    return CreateError(f"{ROLE}: {message}")


def adapter_layer(store: BlobStore, files: Mapping[str, str], base: Path, progress: Progress) -> Layer:
    """The adapter layer for the uploaded ``files`` (name -> digest) over the target GGUF ``base``."""
    ggufs, safetensors = sort_weights(store, files, ROLE)
    if ggufs and safetensors:
        raise _fail("both GGUF and safetensors files were given; give one adapter")
    if len(set(ggufs)) > 1:
        raise CreateError("only one adapter is currently supported")  # Ollama's words
    progress(ProgressEvent("parsing adapter"))
    if ggufs:
        _check(store.blob_path(ggufs[0]), base)
        return Layer(MEDIA_TYPE_ADAPTER, ggufs[0], store.blob_path(ggufs[0]).stat().st_size)
    if not safetensors:
        raise _fail(f"no GGUF or safetensors adapter among the files ({', '.join(sorted(files))})")
    progress(ProgressEvent("converting adapter"))
    # Written outside the store and added through add_file once it checks out, as a converted model is.
    with tempfile.TemporaryDirectory(prefix="tandem-adapter-") as tmp_dir:
        tmp = Path(tmp_dir) / "adapter.gguf"
        convert_peft(folder_paths({n: store.blob_path(d) for n, d in files.items()}), base, tmp)
        _check(tmp, base)
        digest, size = store.add_file(tmp)
    return Layer(MEDIA_TYPE_ADAPTER, digest, size)


def _check(adapter: Path, base: Path) -> None:
    try:
        with GGUFFile(adapter) as a, GGUFFile(base) as b:
            read_lora(a, b)
    except (AdapterError, GGUFError) as e:
        raise _fail(str(e)) from None


def _lora_alpha(files: Mapping[str, Path]) -> float:
    """The alpha under which llama.cpp's scale rule (alpha / rank) gives the scale PEFT applies."""
    if CONFIG_FILE not in files:
        raise _fail(f"{CONFIG_FILE} is missing; a safetensors adapter is a PEFT folder with its {CONFIG_FILE}")
    try:
        cfg: Any = json.loads(files[CONFIG_FILE].read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(f"{CONFIG_FILE} is not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise _fail(f"{CONFIG_FILE} is not a JSON object")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise _fail(f"peft_type {cfg['peft_type']!r} is not supported; only LORA is")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if not isinstance(r, int) or r <= 0 or not isinstance(alpha, (int, float)):
        raise _fail(f"{CONFIG_FILE} needs a positive integer r and a numeric lora_alpha (r={r!r}, lora_alpha={alpha!r})")
    for key in ("rank_pattern", "alpha_pattern"):
        if cfg.get(key):
            raise _fail(f"{CONFIG_FILE} sets {key}; per-module ranks or alphas are not supported (one alpha per adapter)")
    if cfg.get("use_dora"):
        raise _fail("DoRA adapters (use_dora) are not supported; only plain LoRA")
    # rsLoRA scales by alpha / sqrt(r): the alpha that gives that under alpha / r.
    return float(alpha) * (math.sqrt(r) if cfg.get("use_rslora") else 1.0)


def convert_peft(files: Mapping[str, Path], base: Path, out: Path) -> None:
    """Write the PEFT LoRA folder ``files`` as a GGUF adapter for the target GGUF ``base`` at ``out``."""
    import gguf

    alpha = _lora_alpha(files)
    with GGUFFile(base) as b:
        meta = dict(b.metadata)
    arch = meta.get("general.architecture")
    if arch not in _NAME_MAPS:
        raise _fail(f"PEFT adapters convert for {', '.join(sorted(_NAME_MAPS))} models, not {arch}; convert this "
                    "one with llama.cpp's convert_lora_to_gguf.py and give the GGUF")
    tmap = gguf.TensorNameMap(_NAME_MAPS[arch], int(meta[f"{arch}.block_count"]))
    tensors = {}
    for fname in sorted(f for f in files if f.endswith(".safetensors")):
        tensors.update(read_header(files[fname], fname, ROLE))
    plans = [_plan(name, entry.shape, tmap, arch, meta) for name, entry in sorted(tensors.items())]
    if not plans:
        raise _fail("the safetensors hold no LoRA tensors")
    source = HFSource(ROLE, {}, tensors, dict(files))
    w = gguf.GGUFWriter(str(out), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    with TensorReader(source) as reader:
        for plan in plans:
            w.add_tensor(plan.name, prepare(reader.get(plan.source), plan))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _plan(name: str, shape: tuple[int, ...], tmap: Any, arch: str, meta: Mapping[str, Any]) -> TensorPlan:
    """One PEFT tensor as its GGUF adapter tensor (kept F32: adapters are small and this keeps them exact)."""
    m = _PEFT_RE.match(name)
    if m is None:
        what = "an embedding LoRA" if "lora_embedding" in name else \
            "a full weight (modules_to_save)" if "modules_to_save" in name else "not a LoRA tensor"
        raise _fail(f"tensor {name!r} is {what}; only lora_A/lora_B of linear layers are supported")
    text = text_name(m.group(1) + ".weight", SKIPPED_PREFIXES)
    gname = tmap.get_name(text, try_suffixes=(".weight",)) if text else None
    if gname is None:
        raise _fail(f"tensor {name!r} adapts {m.group(1)}, which has no counterpart in tandem's {arch} model")
    permute = 0
    if BY_ARCH[arch].permute_qk and m.group(2) == "B":  # the base's q/k rows are permuted for RoPE: so are B's
        if gname.endswith("attn_q.weight"):
            permute = int(meta[f"{arch}.attention.head_count"])
        elif gname.endswith("attn_k.weight"):
            permute = int(meta.get(f"{arch}.attention.head_count_kv") or meta[f"{arch}.attention.head_count"])
        if shape[0] % (2 * max(permute, 1)):
            permute = 0  # rows that are no whole heads: left as they are, for the fit check to name
    suffix = LORA_A if m.group(2) == "A" else LORA_B
    return TensorPlan(name, gname + suffix, tuple(shape), "F32", permute_heads=permute)
