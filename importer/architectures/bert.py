"""A sentence-transformers BERT folder (``BertModel`` config.json, safetensors, ``modules.json``,
``1_Pooling/config.json``, ``tokenizer.json`` or ``vocab.txt``) converted into a ``bert`` GGUF, laid out as
llama.cpp's converter (and Ollama's ``convert_bert.go``) lay it out:

* tensors renamed (``embeddings.word_embeddings`` -> ``token_embd``, ``encoder.layer.N.attention.self.query``
  -> ``blk.N.attn_q``, ...); the position ids and the unused ``pooler`` dense layer are dropped;
* ``bert.pooling_type`` from the Pooling module's config (mean 1, cls 2, last 3; a folder without
  modules.json gets mean pooling, which is what sentence-transformers gives a plain BertModel), and
  ``bert.normalize_embeddings`` when the pipeline has a Normalize module;
* the WordPiece vocabulary in llama.cpp's "phantom space" spelling (``▁word`` starts a word, ``##ing``
  becomes ``ing``, ``[CLS]``-style tokens stay), ``[CLS]`` as BOS and ``[SEP]`` as separator, and whether the
  model lowercases and strips accents (``tokenizer.ggml.do_lower_case`` / ``strip_accents``: llama.cpp always
  does both; a cased model needs them said).

Every tensor is checked against config.json before the output is opened; tensors are written one at a time.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import gguf
import numpy as np

from ..hf.errors import CreateError
from ..hf.plan import GGML, NP, TensorPlan, file_type, out_type, prepare
from ..hf.safetensors import FLOAT_DTYPES, HFSource, TensorReader, open_source
from .spec import ArchitectureSpec

ProgressFn = Callable[[int, int], None]

ARCH = "bert"
_POOLING = {"pooling_mode_mean_tokens": 1, "pooling_mode_cls_token": 2, "pooling_mode_lasttoken": 3}
_UNSUPPORTED_POOLING = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                        "pooling_mode_weightedmean_tokens")
_SKIPPED = ("embeddings.position_ids", "pooler.")
_TOP = {"embeddings.word_embeddings": "token_embd", "embeddings.position_embeddings": "position_embd",
        "embeddings.token_type_embeddings": "token_types", "embeddings.LayerNorm": "token_embd_norm"}
_BLOCK = {"attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
          "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
          "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
_LAYER_RE = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta)$")
_TOP_RE = re.compile(r"^(embeddings\.\w+)\.(weight|bias|gamma|beta)$")
_SUFFIX = {"weight": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}  # old LayerNorm spelling


@dataclass(frozen=True)
class BertParams:
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    vocab_size: int
    context_length: int
    norm_eps: float
    n_token_types: int
    pooling: int
    normalize: bool


def _fail(role: str, message: str) -> CreateError:
    return CreateError(f"{role}: {message}")


def _read_json(files: Mapping[str, Path], name: str, role: str) -> Any:
    try:
        return json.loads(files[name].read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(role, f"{name} is not valid JSON ({e})") from None


def _int(cfg: Mapping[str, Any], key: str, role: str, default: Any = None) -> int:
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise _fail(role, f"config.json: {key} must be a positive integer, not {value!r}")
    return value


def _pooling(files: Mapping[str, Path], role: str) -> tuple[int, bool]:
    """(llama.cpp pooling type, normalise) from modules.json and the Pooling module's config."""
    if "modules.json" not in files:
        return 1, False
    modules = _read_json(files, "modules.json", role)
    if not isinstance(modules, list):
        raise _fail(role, "modules.json is not a list of modules")
    pooling, normalize = 1, False
    for m in modules:
        kind = m.get("type") if isinstance(m, dict) else None
        if kind == "sentence_transformers.models.Normalize":
            normalize = True
        elif kind == "sentence_transformers.models.Pooling":
            name = f"{str(m.get('path') or '').strip('/')}/config.json".lstrip("/")
            if name not in files:
                raise _fail(role, f"modules.json names a Pooling module whose {name} was not uploaded")
            pc = _read_json(files, name, role)
            if not isinstance(pc, dict):
                raise _fail(role, f"{name} is not a JSON object")
            bad = [k for k in _UNSUPPORTED_POOLING if pc.get(k)]
            if bad:
                raise _fail(role, f"{name}: {bad[0]} is not supported (tandem pools by mean, cls or last token)")
            chosen = [v for k, v in _POOLING.items() if pc.get(k)]
            if len(chosen) != 1:
                raise _fail(role, f"{name}: exactly one of {', '.join(_POOLING)} must be true")
            pooling = chosen[0]
        elif kind not in ("sentence_transformers.models.Transformer", None):
            raise _fail(role, f"modules.json: module {kind} is not supported (tandem runs Transformer, Pooling "
                              "and Normalize)")
    return pooling, normalize


def read_params(source: HFSource, role: str) -> BertParams:
    cfg = source.config
    act = cfg.get("hidden_act", "gelu")
    if act != "gelu":
        raise _fail(role, f"config.json: hidden_act {act!r} is not supported (bert runs gelu)")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise _fail(role, f"config.json: position_embedding_type {cfg['position_embedding_type']!r} is not "
                          "supported (bert runs absolute)")
    pooling, normalize = _pooling(source.files, role)
    p = BertParams(n_layer=_int(cfg, "num_hidden_layers", role), n_embd=_int(cfg, "hidden_size", role),
                   n_ff=_int(cfg, "intermediate_size", role), n_head=_int(cfg, "num_attention_heads", role),
                   vocab_size=_int(cfg, "vocab_size", role),
                   context_length=_int(cfg, "max_position_embeddings", role),
                   norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
                   n_token_types=_int(cfg, "type_vocab_size", role, 2), pooling=pooling, normalize=normalize)
    if p.n_embd % p.n_head:
        raise _fail(role, f"config.json: hidden_size {p.n_embd} is not a multiple of num_attention_heads {p.n_head}")
    return p


def _gguf_name(name: str) -> str | None:
    if name.startswith("bert."):
        name = name[len("bert."):]
    if m := _LAYER_RE.match(name):
        part = _BLOCK.get(m.group(2))
        return f"blk.{m.group(1)}.{part}.{_SUFFIX[m.group(3)]}" if part else None
    if m := _TOP_RE.match(name):
        part = _TOP.get(m.group(1))
        return f"{part}.{_SUFFIX[m.group(2)]}" if part else None
    return None


def _shapes(p: BertParams) -> dict[str, tuple[int, ...]]:
    D, F = p.n_embd, p.n_ff
    out: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (p.vocab_size, D), "position_embd.weight": (p.context_length, D),
        "token_types.weight": (p.n_token_types, D), "token_embd_norm.weight": (D,), "token_embd_norm.bias": (D,)}
    per = {"attn_q": (D, D), "attn_k": (D, D), "attn_v": (D, D), "attn_output": (D, D), "attn_output_norm": (D,),
           "ffn_up": (F, D), "ffn_down": (D, F), "layer_output_norm": (D,)}
    for i in range(p.n_layer):
        for part, shape in per.items():
            out[f"blk.{i}.{part}.weight"] = shape
            out[f"blk.{i}.{part}.bias"] = (shape[0],)
    return out


def plan_tensors(source: HFSource, p: BertParams) -> list[TensorPlan]:
    role, shapes = source.role, _shapes(p)
    plans: list[TensorPlan] = []
    for src, entry in source.tensors.items():
        bare = src[len("bert."):] if src.startswith("bert.") else src
        if bare.startswith(_SKIPPED):
            continue
        gname = _gguf_name(src)
        if gname is None or gname not in shapes:
            raise _fail(role, f"tensor {src} has no counterpart in tandem's bert model")
        if entry.dtype not in FLOAT_DTYPES:
            raise _fail(role, f"tensor {src} is {entry.dtype}: import unquantized F32/F16/BF16 weights")
        if tuple(entry.shape) != shapes[gname]:
            raise _fail(role, f"tensor {src} has shape {list(entry.shape)}, but config.json implies "
                              f"{list(shapes[gname])}")
        plans.append(TensorPlan(src, gname, tuple(entry.shape), out_type(entry.dtype, entry.shape, gname)))
    missing = sorted(set(shapes) - {t.name for t in plans})
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise _fail(role, f"the safetensors lack {missing[0]}{more}, which config.json's model needs")
    return sorted(plans, key=lambda t: (t.name.startswith("blk."), int(t.name.split(".")[1]) if
                                        t.name.startswith("blk.") else 0, t.name))


# ------------------------------------------------------------------------------------------------
# vocabulary
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WordPieceVocab:
    tokens: list[str]  # phantom-space spelling
    types: list[int]
    special: dict[str, int]  # bos (= [CLS]), sep, pad, unk, mask
    lowercase: bool
    strip_accents: bool


def _phantom(tok: str) -> str:
    if tok.startswith("[") and tok.endswith("]"):
        return tok
    return tok[2:] if tok.startswith("##") else "\u2581" + tok


def read_vocab(files: Mapping[str, Path], vocab_size: int, role: str) -> WordPieceVocab:
    pieces: dict[int, str] = {}
    special_ids: set[int] = set()
    lowercase: bool | None = None
    strip: bool | None = None
    if "tokenizer.json" in files:
        tj = _read_json(files, "tokenizer.json", role)
        model = tj.get("model") if isinstance(tj, dict) else None
        if not isinstance(model, dict) or model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
            kind = model.get("type") if isinstance(model, dict) else None
            raise _fail(role, f"tokenizer.json: a bert model needs a WordPiece tokenizer, not {kind!r}")
        if model.get("continuing_subword_prefix", "##") != "##":
            raise _fail(role, "tokenizer.json: WordPiece continuation prefix other than '##' is not supported")
        pieces = {int(i): t for t, i in model["vocab"].items()}
        for a in tj.get("added_tokens") or []:
            if isinstance(a, dict) and "id" in a:
                pieces[int(a["id"])] = str(a.get("content", ""))
                if a.get("special"):
                    special_ids.add(int(a["id"]))
        norm = tj.get("normalizer") or {}
        if isinstance(norm, dict) and norm.get("type") == "BertNormalizer":
            lowercase = bool(norm.get("lowercase", True))
            strip = norm.get("strip_accents")
    elif "vocab.txt" in files:
        lines = files["vocab.txt"].read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        pieces = dict(enumerate(lines))
    else:
        raise _fail(role, "the tokenizer is missing: upload tokenizer.json or vocab.txt with the weights")
    config: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        if name in files:
            data = _read_json(files, name, role)
            if isinstance(data, dict):
                config.update(data)
    if lowercase is None:
        lowercase = bool(config.get("do_lower_case", True))
    if strip is None and config.get("strip_accents") is not None:
        strip = bool(config["strip_accents"])
    n = max(pieces, default=-1) + 1
    if n > vocab_size:
        raise _fail(role, f"the tokenizer has {n} tokens but the model's vocab_size is {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        tok = pieces.get(i)
        if tok is None:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
            continue
        tokens.append(_phantom(tok))
        types.append(int(gguf.TokenType.CONTROL if i in special_ids else gguf.TokenType.NORMAL))
    index = {t: i for i, t in reversed(list(enumerate(tokens)))}
    special: dict[str, int] = {}
    for key, default in (("cls", "[CLS]"), ("sep", "[SEP]"), ("pad", "[PAD]"), ("unk", "[UNK]"), ("mask", "[MASK]")):
        entry = config.get(f"{key}_token", default)
        content = entry.get("content") if isinstance(entry, dict) else entry
        if isinstance(content, str) and content in index:
            special[key] = index[content]
            types[index[content]] = int(gguf.TokenType.CONTROL)
    for key in ("cls", "sep", "unk"):
        if key not in special:
            raise _fail(role, f"the tokenizer has no {key} token")
    return WordPieceVocab(tokens, types, special, lowercase, lowercase if strip is None else bool(strip))


# ------------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------------
def convert(source: HFSource, out: Path, progress: ProgressFn | None = None) -> None:
    """Convert a validated BERT folder into the bert GGUF ``out`` (everything checked before writing)."""
    role = source.role
    p = read_params(source, role)
    plans = plan_tensors(source, p)
    vocab = read_vocab(source.files, p.vocab_size, role)
    w = gguf.GGUFWriter(str(out), ARCH)
    try:
        w.add_file_type(file_type(plans))
        w.add_context_length(p.context_length)
        w.add_embedding_length(p.n_embd)
        w.add_block_count(p.n_layer)
        w.add_feed_forward_length(p.n_ff)
        w.add_head_count(p.n_head)
        w.add_layer_norm_eps(p.norm_eps)
        w.add_causal_attention(False)
        w.add_pooling_type(gguf.PoolingType(p.pooling))
        w.add_bool(f"{ARCH}.normalize_embeddings", p.normalize)
        w.add_tokenizer_model("bert")
        w.add_tokenizer_pre("default")
        w.add_token_list(vocab.tokens)
        w.add_token_types(vocab.types)
        w.add_token_type_count(p.n_token_types)
        w.add_bos_token_id(vocab.special["cls"])
        w.add_sep_token_id(vocab.special["sep"])
        w.add_unk_token_id(vocab.special["unk"])
        if "pad" in vocab.special:
            w.add_pad_token_id(vocab.special["pad"])
        if "mask" in vocab.special:
            w.add_mask_token_id(vocab.special["mask"])
        w.add_add_bos_token(True)
        w.add_bool(gguf.Keys.Tokenizer.ADD_SEP, True)
        w.add_bool("tokenizer.ggml.do_lower_case", vocab.lowercase)
        w.add_bool("tokenizer.ggml.strip_accents", vocab.strip_accents)
        for t in plans:
            w.add_tensor_info(t.name, t.shape, np.dtype(NP[t.out_type]), t.nbytes, raw_dtype=GGML[t.out_type])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        total, done = sum(t.nbytes for t in plans), 0
        with TensorReader(source) as reader:
            for t in plans:
                w.write_tensor_data(prepare(reader.get(t.source), t))
                done += t.nbytes
                if progress:
                    progress(done, total)
    finally:
        w.close()


def convert_folder(files: Mapping[str, Path], out: Path, role: str, progress: ProgressFn | None = None,
                   tokenizer_donor: Mapping[str, Any] | None = None) -> None:
    """Validate an uploaded BERT folder (file name -> path; nested names such as ``1_Pooling/config.json``
    keep their folder) and convert it into the GGUF ``out`` (an encoder has its own tokenizer: no donor)."""
    if role != "FROM":
        raise _fail(role, "an embedding model cannot draft; name it in FROM")
    convert(open_source(files, role), out, progress)


BERT = ArchitectureSpec(arch=ARCH, hf_classes=("BertModel",), model_types={"bert": "BertModel"},
                        convert_folder=convert_folder)
SPECS = (BERT,)
