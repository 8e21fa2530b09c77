"""Writes tiny but structurally complete GGUF models for tests (random weights, real tokenizer metadata).

The files carry everything the importer and the engine read from a real model: architecture
hyper-parameters, a byte-level BPE (gpt2-style) or SentencePiece-style (llama-style) vocabulary with
control tokens, an optional chat template, and every tensor an architecture needs, in GGUF naming.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

from engine.text.tokenizer import BYTE_TO_UNICODE

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# A handful of merges so that common English/code pieces become single tokens.
_MERGE_WORDS = ["the", "def", "return", "in", "an", "er", "on", "re", "at", "ing", "self", "print"]


def gpt2_vocab(extra_specials: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")) -> tuple[list[str], list[int], list[str]]:
    """tokens, token types and merges for a small byte-level BPE vocabulary."""
    byte_map = BYTE_TO_UNICODE
    tokens = [byte_map[b] for b in range(256)]
    merges: list[str] = []
    seen = set(tokens)
    for word in _MERGE_WORDS:
        cur = word[0]
        for ch in word[1:]:
            merged = cur + ch
            if merged not in seen:
                merges.append(f"{cur} {ch}")
                tokens.append(merged)
                seen.add(merged)
            cur = merged
    # 'Ġ' + word merges: leading-space variants, as real vocabularies have.
    for word in ("the", "def", "return"):
        merged = "Ġ" + word
        if merged not in seen:
            merges.append(f"Ġ {word}")
            tokens.append(merged)
            seen.add(merged)
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for special in extra_specials:
        tokens.append(special)
        types.append(gguf.TokenType.CONTROL)
    return tokens, [int(t) for t in types], merges


def spm_vocab() -> tuple[list[str], list[int], list[float]]:
    """tokens, types and scores for a small SentencePiece-style (llama/gemma) vocabulary."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.UNKNOWN,
             gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    scores = [0.0] * len(tokens)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(gguf.TokenType.BYTE)
        scores.append(0.0)
    pieces = ["▁", "▁the", "▁def", "▁return", "e", "t", "h", "d", "f", "r", "u", "n", "a", "o", "s", "i",
              "th", "he", "▁t", "▁d", "in", "an", "er", "on", "▁a", "▁i", "▁s"]
    for i, p in enumerate(pieces):
        tokens.append(p)
        types.append(gguf.TokenType.NORMAL)
        scores.append(-float(i))
    return tokens, [int(t) for t in types], scores


@dataclass
class TinySpec:
    arch: str = "llama"  # llama | qwen2 | gemma3 | qwen3 | qwen3moe
    n_layer: int = 2
    n_embd: int = 64
    n_ff: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    context_length: int = 256
    rope_base: float = 10000.0
    rms_eps: float = 1e-6
    tied_output: bool = True
    sliding_window: int = 8  # gemma3 only
    head_dim: int | None = None  # written as attention.key_length/value_length; None: n_embd // n_head
    n_expert: int = 0  # qwen3moe: experts per layer (every layer's FFN is a sparse MoE)
    n_expert_used: int = 0  # experts each token runs through
    n_ff_expert: int = 0  # one expert's FFN width
    tokenizer: str = "gpt2"  # gpt2 | llama (SentencePiece-style)
    pre: str = "smollm"  # tokenizer.ggml.pre for gpt2 vocabularies
    chat_template: str | None = CHATML_TEMPLATE
    dtype: str = "F32"  # F32 | F16 | BF16 | Q8_0 | Q4_0, or a RANDOM_BLOCK_TYPES name (for 2-D weights)
    seed: int = 0
    name: str = "tiny"
    extra_metadata: dict = field(default_factory=dict)
    n_nextn: int = 0  # NextN (MTP) head blocks after the layers, counted in block_count as llama.cpp does
    extra_specials: tuple[str, ...] = ()  # more control tokens after the gpt2 vocabulary's (FIM markers, <think>)


def vocab_for(spec: TinySpec) -> tuple[list[str], list[int]]:
    if spec.tokenizer == "llama":
        tokens, types, _ = spm_vocab()
    else:
        tokens, types, _ = _gpt2_vocab_for(spec)
    return tokens, types


_GPT2_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _gpt2_vocab_for(spec: TinySpec) -> tuple[list[str], list[int], list[str]]:
    return gpt2_vocab(_GPT2_SPECIALS + tuple(spec.extra_specials))


_QUANT = {
    "F32": gguf.GGMLQuantizationType.F32,
    "F16": gguf.GGMLQuantizationType.F16,
    "BF16": gguf.GGMLQuantizationType.BF16,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
    "Q4_0": gguf.GGMLQuantizationType.Q4_0,
}
_FILE_TYPE = {"F32": 0, "F16": 1, "BF16": 32, "Q8_0": 7, "Q4_0": 2}

# Types gguf-py cannot quantize to: a weight of one of these is written as random blocks (not the spec's
# floats) by random_blocks. Value: llama.cpp's general.file_type for a file mostly of that type.
RANDOM_BLOCK_TYPES = {"IQ1_S": 24, "IQ1_M": 31, "IQ2_XXS": 19, "IQ2_XS": 20, "IQ2_S": 28, "IQ3_XXS": 23,
                      "IQ3_S": 26, "IQ4_NL": 25, "IQ4_XS": 30, "MXFP4": 38, "TQ1_0": 36, "TQ2_0": 37}
_QUANT.update({name: gguf.GGMLQuantizationType[name] for name in RANDOM_BLOCK_TYPES})
_FILE_TYPE.update(RANDOM_BLOCK_TYPES)

# About how large a random block's values are for a scale of 1 (the codes times the sub-block scales), so
# random_blocks can aim at weights of a given size.
_VALUES_PER_SCALE = {"IQ1_S": 8, "IQ1_M": 8, "IQ2_XXS": 50, "IQ2_XS": 50, "IQ2_S": 50, "IQ3_XXS": 120,
                     "IQ3_S": 120, "IQ4_NL": 60, "IQ4_XS": 1000, "MXFP4": 3}


def random_blocks(qtype: gguf.GGMLQuantizationType, shape: tuple[int, ...], rng: np.random.Generator,
                  size: float = 0.05) -> np.ndarray:
    """Random valid bytes [..., row bytes] of a tensor of ``shape`` (torch order) in ``qtype``, with
    values of about ``size``.

    Any bit pattern is a valid IQ or MXFP4 block once its scale is finite, so everything is random but
    the scale: a random f16 (IQ types) or an E8M0 exponent (MXFP4). Other types' scale fields stay random."""
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    nb = int(np.prod(shape)) // block
    b = rng.integers(0, 256, size=(nb, type_size), dtype=np.uint8)
    scale = size / _VALUES_PER_SCALE.get(qtype.name, 1)
    d = (rng.standard_normal(nb) * scale).astype(np.float16).view(np.uint16)
    if qtype == gguf.GGMLQuantizationType.MXFP4:
        b[:, 0] = 127 + round(np.log2(scale)) + rng.integers(-2, 3, size=nb)
    elif qtype == gguf.GGMLQuantizationType.IQ1_M:  # its f16 scale is the top nibbles of 4 u16 words
        words = b[:, 48:56].copy().view(np.uint16)
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
        b[:, 48:56] = words.view(np.uint8)
    elif qtype.name.startswith("IQ"):  # the f16 scale leads the block
        b[:, 0:2] = d.view(np.uint8).reshape(nb, 2)
    return b.reshape(*shape[:-1], -1)


def tiny_tensors(spec: TinySpec, n_vocab: int) -> dict[str, np.ndarray]:
    """Random weights in GGUF naming and torch order (outermost dimension first)."""
    rng = np.random.default_rng(spec.seed)
    head_dim = spec.head_dim or spec.n_embd // spec.n_head

    def w(*shape: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t: dict[str, np.ndarray] = {"token_embd.weight": w(n_vocab, spec.n_embd, scale=0.5)}
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm(spec.n_embd)
        t[p + "attn_q.weight"] = w(spec.n_head * head_dim, spec.n_embd)
        t[p + "attn_k.weight"] = w(spec.n_head_kv * head_dim, spec.n_embd)
        t[p + "attn_v.weight"] = w(spec.n_head_kv * head_dim, spec.n_embd)
        t[p + "attn_output.weight"] = w(spec.n_embd, spec.n_head * head_dim)
        if spec.arch == "qwen2":
            t[p + "attn_q.bias"] = w(spec.n_head * head_dim, scale=0.2)
            t[p + "attn_k.bias"] = w(spec.n_head_kv * head_dim, scale=0.2)
            t[p + "attn_v.bias"] = w(spec.n_head_kv * head_dim, scale=0.2)
        if spec.arch in ("gemma3", "qwen3", "qwen3moe"):
            t[p + "attn_q_norm.weight"] = norm(head_dim)
            t[p + "attn_k_norm.weight"] = norm(head_dim)
        if spec.arch == "gemma3":
            t[p + "post_attention_norm.weight"] = norm(spec.n_embd)
            t[p + "post_ffw_norm.weight"] = norm(spec.n_embd)
        t[p + "ffn_norm.weight"] = norm(spec.n_embd)
        if spec.n_expert:  # llama.cpp's layout: router [E, D], experts stacked [E, rows, cols]
            E, F = spec.n_expert, spec.n_ff_expert
            t[p + "ffn_gate_inp.weight"] = w(E, spec.n_embd, scale=0.3)
            t[p + "ffn_gate_exps.weight"] = w(E, F, spec.n_embd)
            t[p + "ffn_up_exps.weight"] = w(E, F, spec.n_embd)
            t[p + "ffn_down_exps.weight"] = w(E, spec.n_embd, F)
            continue
        t[p + "ffn_gate.weight"] = w(spec.n_ff, spec.n_embd)
        t[p + "ffn_up.weight"] = w(spec.n_ff, spec.n_embd)
        t[p + "ffn_down.weight"] = w(spec.n_embd, spec.n_ff)
    t["output_norm.weight"] = norm(spec.n_embd)
    if not spec.tied_output:
        t["output.weight"] = w(n_vocab, spec.n_embd)
    return t


def write_tiny_gguf(path: str | Path, spec: TinySpec | None = None, tensors: dict[str, np.ndarray] | None = None) -> Path:
    """Write ``spec`` as a GGUF at ``path``; ``tensors`` (GGUF names, torch order) overrides the random weights."""
    spec = spec or TinySpec()
    path = Path(path)
    tokens, types = vocab_for(spec)
    n_vocab = len(tokens)
    arch = spec.arch
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(spec.name)
    writer.add_file_type(_FILE_TYPE[spec.dtype])
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer + spec.n_nextn)
    if spec.n_nextn:
        writer.add_nextn_predict_layers(spec.n_nextn)
    if spec.n_ff:  # 0: no dense FFN, no key (qwen35moe, as llama.cpp's converter writes it)
        writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_layer_norm_rms_eps(spec.rms_eps)
    writer.add_rope_freq_base(spec.rope_base)
    writer.add_vocab_size(n_vocab)
    if arch == "gemma3" or spec.head_dim:
        head_dim = spec.head_dim or spec.n_embd // spec.n_head
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch == "gemma3":
        writer.add_sliding_window(spec.sliding_window)
    if spec.n_expert:
        writer.add_expert_count(spec.n_expert)
        writer.add_expert_used_count(spec.n_expert_used)
        writer.add_expert_feed_forward_length(spec.n_ff_expert)
    if spec.tokenizer == "llama":
        tokens, types, scores = spm_vocab()
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_scores(scores)
        writer.add_bos_token_id(2)
        writer.add_eos_token_id(1)
        writer.add_unk_token_id(3)
        writer.add_pad_token_id(0)
        writer.add_add_bos_token(True)
    else:
        tokens, types, merges = _gpt2_vocab_for(spec)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(spec.pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(tokens.index("<|im_start|>"))
        writer.add_eos_token_id(tokens.index("<|im_end|>"))
        writer.add_add_bos_token(False)
    if spec.chat_template:
        writer.add_chat_template(spec.chat_template)
    for key, value in spec.extra_metadata.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, (list, tuple)):
            writer.add_array(key, list(value))
        else:
            raise TypeError(f"unsupported metadata value for {key}: {value!r}")
    rng = np.random.default_rng(spec.seed)
    for name, arr in (tensors if tensors is not None else tiny_tensors(spec, n_vocab)).items():
        # llama.cpp keeps MoE routers in F32 whatever the file type (its converter and its quantizer)
        router = name.endswith("ffn_gate_inp.weight")
        qtype = _QUANT[spec.dtype] if arr.ndim >= 2 and not router else gguf.GGMLQuantizationType.F32
        if qtype.name in RANDOM_BLOCK_TYPES:
            data = random_blocks(qtype, arr.shape, rng)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
        elif qtype in (gguf.GGMLQuantizationType.F32,):
            writer.add_tensor(name, arr.astype(np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, arr.astype(np.float16))
        else:
            data = gguf.quants.quantize(arr.astype(np.float32), qtype)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
