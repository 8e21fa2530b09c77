"""Tiny random Gemma 4 models built by transformers, written as GGUF in llama.cpp's gemma4 layout.

``make_gemma4(variant, dir)`` builds a ``Gemma4ForCausalLM`` (float64) and the GGUF that holds the same
weights, as llama.cpp's converter writes it: norms stored as they are (gemma4's norm multiplies by w),
``layer_scalar`` as ``blk.N.layer_output_scale``, the per-layer embedding tensors, a ``rope_freqs``
tensor that turns the global layers' RoPE into transformers' "proportional" one (1e30 for the
unrotated frequencies), per-layer ``head_count_kv``/``feed_forward_length`` arrays, the sliding-window
pattern as one bool per layer, and the ``gemma4`` tokenizer model (SentencePiece-style BPE with merges).

Variants: ``e2b`` (per-layer embeddings, KV sharing over the last two layers, double-wide FFN in the
shared layers, final soft-capping), ``31b`` (global layers with K = V and their own K/V head count) and
``26b`` (four layers of 31b's attention, a sparse MoE beside every layer's dense FFN: 8 experts, top 2;
llama.cpp writes the fused ``ffn_gate_up_exps``, ``ffn_down_exps``, the router ``ffn_gate_inp`` with its
input scale ``ffn_gate_inp.scale``, the per-expert scale ``ffn_down_exps.scale`` and the branches' norms).
All have sliding layers of head size 16 and global layers of head size 32, a window of 8.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from importer.architectures.gemma4 import gguf_name

WINDOW = 8
N_EMBD, N_HEAD, N_FF = 64, 4, 96
HEAD_SWA, HEAD_FULL = 16, 32
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention",
               "sliding_attention", "sliding_attention", "full_attention"]
MOE_LAYER_TYPES = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
ROPE_BASE, ROPE_BASE_SWA = 1_000_000.0, 10_000.0
PARTIAL_ROTARY = 0.25
CONTEXT = 256

VARIANTS = {
    "e2b": dict(num_key_value_heads=2, num_kv_shared_layers=2, hidden_size_per_layer_input=8,
                use_double_wide_mlp=True, final_logit_softcapping=30.0),
    "31b": dict(num_key_value_heads=2, attention_k_eq_v=True, num_global_key_value_heads=1,
                hidden_size_per_layer_input=0),
    # Four layers, the last one global: deeper tiny random MoE stacks amplify f32 rounding past the float64
    # comparison's tolerance (their routing and one-hot attention are that sensitive), not a model difference.
    "26b": dict(num_key_value_heads=2, attention_k_eq_v=True, num_global_key_value_heads=1,
                hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=8, top_k_experts=2,
                moe_intermediate_size=32, layer_types=MOE_LAYER_TYPES),
}


def gemma4_vocab() -> tuple[list[str], list[int], list[float], list[str]]:
    """tokens, types, scores and merges of a small gemma4-style vocabulary: control tokens, the 256
    byte-fallback tokens, ``▁``-spelled pieces and the merges that build them, in rank order."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "\n", "\n\n"]
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 2 + \
        [gguf.TokenType.NORMAL] * 2
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(gguf.TokenType.BYTE)
    chars = ["▁"] + list("abcdefghijklmnopqrstuvwxyz.,!?")
    words = ["▁t", "he", "▁the", "in", "▁a", "er", "on", "▁i", "▁s", "re", "at", "▁d", "ef", "▁def", "▁re",
             "tu", "rn", "turn", "▁return", "▁o", "▁of", "an", "▁an", "▁and", "▁▁", "▁▁▁▁"]
    merges = []
    seen = set(tokens)
    for c in chars:
        tokens.append(c)
        types.append(gguf.TokenType.NORMAL)
        seen.add(c)
    for w in words:
        for i in range(1, len(w)):
            left, right = w[:i], w[i:]
            if left in seen and right in seen:
                merges.append(f"{left} {right}")
                break
        else:
            raise AssertionError(w)
        tokens.append(w)
        types.append(gguf.TokenType.NORMAL)
        seen.add(w)
    scores = [0.0] * len(tokens)
    return tokens, [int(t) for t in types], scores, merges


# A Gemma 4 style chat template, written for the tests in the constructs Gemma 4's own template uses (see
# tests/server/text/test_templates_gemma4.py).
CHAT_TEMPLATE = r"""
{%- macro quote(value) -%}
    {%- if value is string -%}{{- '<|"|>' + value + '<|"|>' -}}
    {%- elif value is boolean -%}{{- 'true' if value else 'false' -}}
    {%- elif value is mapping -%}
        {{- '{' -}}
        {%- for k, v in value | dictsort -%}{{- k -}}:{{- quote(v) -}}{%- if not loop.last %},{% endif -%}{%- endfor -%}
        {{- '}' -}}
    {%- elif value is sequence -%}
        {{- '[' -}}{%- for v in value -%}{{- quote(v) -}}{%- if not loop.last %},{% endif -%}{%- endfor -%}{{- ']' -}}
    {%- else -%}{{- value -}}
    {%- endif -%}
{%- endmacro -%}
{%- macro without_thoughts(text) -%}
    {%- set ns = namespace(out='') -%}
    {%- for part in text.split('<channel|>') -%}
        {%- set ns.out = ns.out + (part.split('<|channel>')[0] if '<|channel>' in part else part) -%}
    {%- endfor -%}
    {{- ns.out | trim -}}
{%- endmacro -%}
{%- set rest = messages -%}
{{ bos_token }}
{%- if (enable_thinking is defined and enable_thinking) or tools or messages[0]['role'] == 'system' -%}
    {{- '<|turn>system\n' -}}
    {%- if enable_thinking is defined and enable_thinking -%}{{- '<|think|>' -}}{%- endif -%}
    {%- if messages[0]['role'] == 'system' -%}
        {{- messages[0]['content'] | trim -}}
        {%- set rest = messages[1:] -%}
    {%- endif -%}
    {%- for tool in tools or [] -%}
        {{- '<|tool>declaration:' + tool['function']['name'] -}}
        {{- quote(tool['function']['parameters'] | default({})) -}}{{- '<tool|>' -}}
    {%- endfor -%}
    {{- '<turn|>\n' -}}
{%- endif %}
{%- for message in rest -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{- '<|turn>' + role + '\n' }}
    {%- for call in message['tool_calls'] | default([]) -%}
        {{- '<|tool_call>call:' + call['function']['name'] + quote(call['function']['arguments']) + '<tool_call|>' -}}
    {%- endfor -%}
    {%- if role == 'model' -%}{{- without_thoughts(message['content'] or '') -}}
    {%- else -%}{{- (message['content'] or '') | trim -}}
    {%- endif -%}
    {{- '<turn|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|turn>model\n' -}}
    {%- if not enable_thinking | default(false) -%}{{- '<|channel>thought\n<channel|>' -}}{%- endif -%}
{%- endif -%}
"""


@dataclass
class Gemma4Pair:
    variant: str
    hf: torch.nn.Module  # Gemma4ForCausalLM, float64, eval mode
    path: Path
    vocab_size: int
    config: object  # the Gemma4TextConfig


def hf_text_config(variant: str, vocab_size: int, **extra):
    import transformers as tf

    v = dict(VARIANTS[variant])
    v.update(extra)
    ple = v.get("hidden_size_per_layer_input", 0)
    layer_types = list(v.pop("layer_types", LAYER_TYPES))
    return tf.Gemma4TextConfig(
        vocab_size=vocab_size, hidden_size=N_EMBD, intermediate_size=N_FF, num_hidden_layers=len(layer_types),
        num_attention_heads=N_HEAD, head_dim=HEAD_SWA, global_head_dim=HEAD_FULL, layer_types=layer_types,
        sliding_window=WINDOW, max_position_embeddings=CONTEXT, rms_norm_eps=1e-6,
        vocab_size_per_layer_input=vocab_size if ple else 0, tie_word_embeddings=True,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": ROPE_BASE_SWA},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": PARTIAL_ROTARY,
                                            "rope_theta": ROPE_BASE}},
        pad_token_id=0, bos_token_id=2, eos_token_id=1, **v)


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights that make every part matter: norms near 1, peaked attention, layer scalars away from 1.
    Rounded to f32 so that the GGUF (f32) and the float64 reference hold exactly the same numbers."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("inv_freq") or name.endswith("embed_scale") or not p.is_floating_point():
                continue
            if name.endswith(("layer_scalar", "per_expert_scale")):
                p.copy_(0.5 + torch.rand(p.shape, generator=g, dtype=p.dtype))
            elif name.endswith("router.scale"):  # the router reads rms(x) * scale / sqrt(D): decisive logits
                p.copy_(N_EMBD ** 0.5 * (1.0 + 0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype)))
            elif name.endswith("router.proj.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif "embed_tokens" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif "q_proj" in name or "k_proj" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            p.copy_(p.float().double())


def gguf_tensors(state: dict[str, torch.Tensor], prefix: str = "model.") -> dict[str, np.ndarray]:
    """A Gemma 4 text model's state dict in llama.cpp's GGUF naming (norms as they are), named by the importer's
    own map: a wrong name there still fails these tests, whose reference is transformers' output, not the names."""
    out: dict[str, np.ndarray] = {}
    for name, t in state.items():
        if name == "lm_head.weight" or not name.startswith(prefix):
            continue
        gname = gguf_name("model." + name[len(prefix):])
        if gname is None:
            raise KeyError(f"unmapped tensor {name}")
        out[gname] = np.ascontiguousarray(t.detach().to(torch.float64).numpy().astype(np.float32))
    return out


def rope_freqs() -> np.ndarray:
    """llama.cpp's stand-in for proportional RoPE on the global layers: factor 1 for the rotated
    frequencies, 1e30 (no rotation) for the rest."""
    n_rot = int(HEAD_FULL * PARTIAL_ROTARY / 2)
    return np.array([1.0] * n_rot + [1e30] * (HEAD_FULL // 2 - n_rot), dtype=np.float32)


def write_tokenizer(w: gguf.GGUFWriter, chat_template: str | None = None) -> None:
    tokens, types, scores, merges = gemma4_vocab()
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    if chat_template:
        w.add_chat_template(chat_template)


def write_tensors(w: gguf.GGUFWriter, tensors: dict[str, np.ndarray], expert_type: str = "F32") -> None:
    """``expert_type``: 'Q8_0' stores the stacked expert tensors (``*_exps.weight``) quantized, as a
    quantized 26B-A4B file does; everything else stays f32."""
    qtype = gguf.GGMLQuantizationType[expert_type]
    for name, arr in tensors.items():
        if name.endswith("_exps.weight") and qtype != gguf.GGMLQuantizationType.F32:
            data = gguf.quants.quantize(arr.astype(np.float32), qtype)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gemma4_gguf(path: Path, cfg, tensors: dict[str, np.ndarray], chat_template: str | None = None,
                      expert_type: str = "F32") -> Path:
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_name("tiny-gemma4")
    w.add_file_type(0)
    n = cfg.num_hidden_layers
    swa = [t == "sliding_attention" for t in cfg.layer_types]
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(n)
    shared = cfg.num_kv_shared_layers
    if cfg.use_double_wide_mlp:
        w.add_feed_forward_length([cfg.intermediate_size * (2 if i >= n - shared else 1) for i in range(n)])
    else:
        w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    kv_heads = [cfg.per_layer_config[i].num_key_value_heads for i in range(n)]
    w.add_head_count_kv(kv_heads if len(set(kv_heads)) > 1 else kv_heads[0])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(HEAD_FULL)
    w.add_value_length(HEAD_FULL)
    w.add_key_length_swa(HEAD_SWA)
    w.add_value_length_swa(HEAD_SWA)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_rope_freq_base_swa(ROPE_BASE_SWA)
    w.add_rope_dimension_count(HEAD_FULL)
    w.add_rope_dimension_count_swa(HEAD_SWA)
    w.add_sliding_window(cfg.sliding_window)
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(shared)
    w.add_embedding_length_per_layer_input(cfg.hidden_size_per_layer_input or 0)
    if cfg.final_logit_softcapping:
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if cfg.enable_moe_block:
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.top_k_experts)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_vocab_size(cfg.vocab_size)
    write_tokenizer(w, chat_template)
    write_tensors(w, {"rope_freqs.weight": rope_freqs(), **tensors}, expert_type)
    return path


def make_gemma4(variant: str, directory: Path, *, seed: int = 0, chat_template: str | None = None,
                bigram: bool = False, expert_type: str = "F32") -> Gemma4Pair:
    """``bigram``: every block's output projections are zero, so the next token depends on the current
    one only (a target whose future a crafted assistant can know)."""
    import transformers as tf

    vocab_size = len(gemma4_vocab()[0])
    cfg = hf_text_config(variant, vocab_size)
    torch.manual_seed(seed)
    extra = {"experts_implementation": "eager"} if cfg.enable_moe_block else {}  # grouped_mm takes no float64
    hf = tf.Gemma4ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float64, **extra)
    randomize(hf, seed + 1)
    if bigram:
        with torch.no_grad():
            for name, p in hf.named_parameters():
                if name.endswith(("o_proj.weight", "down_proj.weight", "per_layer_projection.weight")):
                    p.zero_()
    hf = hf.double().eval()
    path = Path(directory) / f"tiny-gemma4-{variant}-{seed}{'-bigram' if bigram else ''}{'' if expert_type == 'F32' else '-' + expert_type}.gguf"
    write_gemma4_gguf(path, cfg, gguf_tensors(hf.state_dict()), chat_template, expert_type)
    return Gemma4Pair(variant, hf, path, vocab_size, cfg)


# ------------------------------------------------------------------------------------------------
# the assistant (MTP drafter)
# ------------------------------------------------------------------------------------------------
ASSISTANT_EMBD = 32
ASSISTANT_LAYER_TYPES = ["sliding_attention", "full_attention"]


@dataclass
class AssistantPair:
    hf: torch.nn.Module  # Gemma4AssistantForCausalLM, float64, eval mode
    path: Path


def make_assistant(target: Gemma4Pair, directory: Path, *, seed: int = 5, target_width: int | None = None,
                   name: str = "assistant", copy_bigram: float | None = None) -> AssistantPair:
    """A ``Gemma4AssistantForCausalLM`` for ``target`` (its K/V heads and head sizes) and its GGUF as llama.cpp
    names it (arch ``gemma4-assistant``, ``nextn.pre_projection``/``nextn.post_projection``, the target's
    width as ``embedding_length_out``; ``target_width`` writes another width there).

    ``copy_bigram`` (for a ``bigram`` target): the GGUF's weights are crafted so that the assistant
    computes the target's own bigram logits (no soft-capping) from the token it is given, with this
    much noise added to its output embedding: a drafter whose q is close to, not equal to, p. The
    transformers model then no longer matches the file."""
    import transformers as tf

    tcfg = target.config
    width = N_EMBD if copy_bigram is not None else ASSISTANT_EMBD  # a copied head needs the target's width
    kv = {t: tcfg.per_layer_config[tcfg.layer_types.index(t)].num_key_value_heads for t in set(tcfg.layer_types)}
    extra = {}
    if kv["full_attention"] != kv["sliding_attention"]:
        extra = dict(attention_k_eq_v=True, num_global_key_value_heads=kv["full_attention"])
    text = tf.Gemma4TextConfig(
        vocab_size=target.vocab_size, hidden_size=width, intermediate_size=48,
        num_hidden_layers=len(ASSISTANT_LAYER_TYPES), num_attention_heads=2, num_key_value_heads=kv["sliding_attention"],
        head_dim=HEAD_SWA, global_head_dim=HEAD_FULL, layer_types=list(ASSISTANT_LAYER_TYPES), sliding_window=WINDOW,
        max_position_embeddings=CONTEXT, rms_norm_eps=1e-6, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
        num_kv_shared_layers=len(ASSISTANT_LAYER_TYPES), tie_word_embeddings=True,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": ROPE_BASE_SWA},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": PARTIAL_ROTARY,
                                            "rope_theta": ROPE_BASE}},
        pad_token_id=0, bos_token_id=2, eos_token_id=1, **extra)
    cfg = tf.Gemma4AssistantConfig(text_config=text, backbone_hidden_size=N_EMBD, use_ordered_embeddings=False)
    torch.manual_seed(seed)
    hf = tf.Gemma4AssistantForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float64)
    randomize(hf, seed + 1)
    hf = hf.double().eval()
    state = hf.state_dict()
    tensors = gguf_tensors(state)
    tensors["nextn.pre_projection.weight"] = state["pre_projection.weight"].numpy().astype(np.float32)
    tensors["nextn.post_projection.weight"] = state["post_projection.weight"].numpy().astype(np.float32)
    if copy_bigram is not None:
        tt = gguf_tensors(target.hf.state_dict())
        rng = np.random.default_rng(seed)
        tensors["nextn.pre_projection.weight"] = np.concatenate(
            [np.eye(N_EMBD), np.zeros((N_EMBD, N_EMBD))], 1).astype(np.float32)
        for key in tensors:
            if key.endswith(("attn_output.weight", "ffn_down.weight")):
                tensors[key] = np.zeros_like(tensors[key])
        tensors["output_norm.weight"] = tt["output_norm.weight"]
        tensors["token_embd.weight"] = (tt["token_embd.weight"] + copy_bigram * rng.standard_normal(
            tt["token_embd.weight"].shape)).astype(np.float32)
    path = Path(directory) / f"{name}.gguf"
    arch = "gemma4-assistant"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-gemma4-assistant")
    w.add_file_type(0)
    n = len(ASSISTANT_LAYER_TYPES)
    swa = [t == "sliding_attention" for t in ASSISTANT_LAYER_TYPES]
    w.add_context_length(CONTEXT)
    w.add_embedding_length(width)
    w.add_embedding_length_out(target_width or N_EMBD)
    w.add_block_count(n)
    w.add_nextn_predict_layers(n)
    w.add_feed_forward_length(48)
    w.add_head_count(2)
    w.add_head_count_kv([kv[t] for t in ASSISTANT_LAYER_TYPES])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(HEAD_FULL)
    w.add_value_length(HEAD_FULL)
    w.add_key_length_swa(HEAD_SWA)
    w.add_value_length_swa(HEAD_SWA)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_rope_freq_base_swa(ROPE_BASE_SWA)
    w.add_rope_dimension_count(HEAD_FULL)
    w.add_rope_dimension_count_swa(HEAD_SWA)
    w.add_sliding_window(WINDOW)
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(n)
    w.add_vocab_size(target.vocab_size)
    write_tokenizer(w)
    write_tensors(w, {"rope_freqs.weight": rope_freqs(), **tensors})
    return AssistantPair(hf, path)


def hf_assistant_drafts(target: Gemma4Pair, assistant: AssistantPair, log: list[int], k: int
                        ) -> tuple[list[int], list[torch.Tensor]]:
    """A hand-rolled transformers drafting round after the committed ``log``: the target evaluates
    ``log[:-1]`` (P = len(log) - 1 positions), the assistant drafts ``k`` greedy tokens at position P from
    the last token and the target's post-norm hidden state at P - 1, attending the K/V of the target's
    last layer of each kind: all P positions for global layers, the last ``WINDOW - 1`` for sliding
    ones (the positions inside the window of a query at P). Returns the drafts and each step's logits."""
    P = len(log) - 1
    with torch.no_grad():
        out = target.hf.model(torch.tensor([log[:-1]]), return_shared_kv_states=True, use_cache=False)
        shared = dict(out.shared_kv_states)
        k_s, v_s = shared["sliding_attention"]
        start = max(0, P - WINDOW + 1)
        shared["sliding_attention"] = (k_s[:, :, start:P], v_s[:, :, start:P])
        h = out.last_hidden_state[:, -1:]
        token = log[-1]
        drafts, logits = [], []
        for _ in range(k):
            e = target.hf.model.embed_tokens(torch.tensor([[token]]))
            o = assistant.hf(inputs_embeds=torch.cat([e, h], dim=-1), position_ids=torch.tensor([[P]]),
                             shared_kv_states=shared)
            logits.append(o.logits[0, -1])
            token = int(o.logits[0, -1].argmax())
            drafts.append(token)
            h = o.last_hidden_state
    return drafts, logits
