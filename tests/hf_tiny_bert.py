"""A tiny random sentence-transformers BERT folder, built by transformers, for oracle tests of the bert path.

``make_bert_folder(dir)`` trains a small WordPiece vocabulary (``tokenizers``) on a mixed corpus (accents,
CJK, punctuation), saves it through transformers' ``BertTokenizerFast`` (tokenizer.json, vocab.txt,
tokenizer_config.json), builds a ``BertModel`` with randomised weights (LayerNorms and biases included) and
writes it as safetensors, plus sentence-transformers' ``modules.json`` and ``1_Pooling/config.json`` for the
pooling asked for. The reference is the same folder loaded by transformers in float64.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CORPUS = [
    "The quick brown fox jumps over the lazy dog.", "Héllo wörld, café crème brûlée!", "naïve façade coöperate",
    "東京は日本の首都です。", "北京欢迎你", "C'est la vie; don't panic: 42 + 7 = 49?", "e-mail: someone@example.com",
    "unbelievably antidisestablishmentarianism supercalifragilistic", "Hello, HELLO, hello.",
    "tokenization (with punctuation) [brackets] {braces} <angle> \"quotes\"", "numbers 123 4567 89.01",
    "Ünïcödé ÀÉÎÕÜ àéîõü ß ø å", "semantic search embeddings vectors cosine similarity", "a b c d e f g",
]
POOLING_KEYS = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "last": "pooling_mode_lasttoken"}


def make_bert_folder(out: Path, *, pooling: str = "mean", normalize: bool = True, lowercase: bool = True,
                     n_layer: int = 2, seed: int = 0, vocab_size: int = 400, context: int = 64) -> Path:
    import transformers as tf
    from tokenizers import BertWordPieceTokenizer, processors

    out.mkdir(parents=True, exist_ok=True)
    wp = BertWordPieceTokenizer(lowercase=lowercase, strip_accents=None)
    wp.train_from_iterator(CORPUS * 3, vocab_size=vocab_size, min_frequency=1, limit_alphabet=500)
    vocab = sorted(wp.get_vocab().items(), key=lambda kv: kv[1])
    (out / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
    # what a BERT tokenizer.json carries: [CLS] $A [SEP]
    wp.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", wp.token_to_id("[CLS]")), ("[SEP]", wp.token_to_id("[SEP]"))])
    wp.save(str(out / "tokenizer.json"))
    specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                "mask_token": "[MASK]"}
    (out / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lowercase, **specials,
                                                           "tokenizer_class": "BertTokenizer",
                                                           "model_max_length": context}))
    (out / "special_tokens_map.json").write_text(json.dumps(specials))

    torch.manual_seed(seed)
    cfg = tf.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=n_layer, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=context, type_vocab_size=2,
                        layer_norm_eps=1e-12, hidden_act="gelu")
    model = tf.BertModel(cfg, add_pooling_layer=True).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    model.save_pretrained(str(out), safe_serialization=True)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir(exist_ok=True)
    pool = {"word_embedding_dimension": 32, **{k: False for k in POOLING_KEYS.values()}, POOLING_KEYS[pooling]: True}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    return out


def folder_files(folder: Path) -> dict[str, Path]:
    """The folder as an upload: every file under its path relative to the folder."""
    return {str(p.relative_to(folder)): p for p in folder.rglob("*") if p.is_file()}


def reference(folder: Path):
    """(transformers BertModel in float64, its fast tokenizer)."""
    import transformers as tf

    model = tf.BertModel.from_pretrained(str(folder), torch_dtype=torch.float64).eval()
    return model, tf.AutoTokenizer.from_pretrained(str(folder))
