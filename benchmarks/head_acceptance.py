"""First-position acceptance of trained MTP heads on the target's own answers, several prompts of every kind.

    python -m benchmarks.head_acceptance TARGET.gguf HEAD.gguf [HEAD2.gguf ...] [--tokens 96] [--markdown out.md]

The target answers each prompt greedily (ChatML-wrapped where the vocabulary has it, as ``benchmarks.speculation``
sends them: ``render_prompt``); each head then reads the target's hidden states over prompt and answer together
(teacher forcing, the whole context as when serving) and drafts the token after next at every answer position.
Reported per kind and head: the share of drafts equal to the target's greedy token, which is the first draft
position's acceptance at temperature 0 (what ``mtp-n1`` measures through the engine, there over one answer per kind,
whose 96 drafts swing it by +-0.1 between heads of the same training). Six prompts a kind, none
of them among the requests the trainer writes its own text from (``server/cli/drafter_prompts.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from benchmarks.output import emit, host_line
from benchmarks.speculation import render_prompt
from engine.contract.gguf import GGUFFile
from engine.models.loader import load_model
from engine.text.tokenizer import Tokenizer
from engine.training.fit import target_pass
from engine.training.nextn_head import TrainableNextN, weights_from_head_gguf
from engine.training.self_text import answer_side_by_side
from server.cli.bench.prompt_sets import TEXT_KINDS

KIND_PROMPTS: dict[str, list[str]] = {
    "prose": [TEXT_KINDS["prose"], "Explain in one paragraph why the ocean has two high tides a day.",
              "Write a short, friendly letter inviting a neighbour to a garden party next Saturday.",
              "Describe, in a few sentences, how sourdough bread rises without commercial yeast.",
              "Write a paragraph describing a quiet city street early on a winter morning.",
              "Tell me about the life of Marie Curie in a few sentences."],
    "list": [TEXT_KINDS["list"], "Name eight countries in South America, one per line.",
             "Give me a packing list for a weekend camping trip.",
             "What are six common symptoms of the flu? Use a bulleted list.",
             "List ten animals that live in the Arctic.",
             "Give five ideas for a rainy afternoon with children, as a numbered list."],
    "french": [TEXT_KINDS["french"], "Explique-moi comment fonctionne un arc-en-ciel.",
               "Donne trois conseils pour bien dormir.", "Qu'est-ce que la photosynthèse ? Réponds en quelques phrases.",
               "Décris ta ville idéale en un paragraphe.", "Pourquoi le ciel est-il bleu ?"],
    "chinese": [TEXT_KINDS["chinese"], "请介绍一下熊猫。", "什么是人工智能？请简单回答。", "给我三个学习英语的建议。",
                "请描述一下春天的景色。", "为什么要多喝水？"],
    "code": [TEXT_KINDS["code"], "Write a Python function that checks whether a string is a palindrome.",
             "Write a JavaScript function that debounces another function.",
             "Write a SQL query that finds the five customers with the most orders.",
             "Write a Python class for a stack with push, pop and peek.",
             "Write a bash script that counts the lines of every .txt file in a folder."],
    "edit": [TEXT_KINDS["edit"],
             "Fix the typos in this sentence and return it: 'Teh quick brown fox jumpd over teh lazy dog.'",
             "Translate this list to uppercase and keep the order: apple, banana, cherry, date, elderberry",
             "Rewrite this function with a for loop instead of a while loop:\n```python\ndef count(n):\n    i = 0\n"
             "    while i < n:\n        print(i)\n        i += 1\n```",
             "Add type hints to this function and return it:\n```python\ndef area(width, height):\n"
             "    return width * height\n```",
             "Reverse the order of these words: one two three four five six seven"],
}


@torch.no_grad()
def answer_hits(head: TrainableNextN, ids: list[int], hidden: torch.Tensor, logits: torch.Tensor,
                prompt_len: int) -> tuple[int, int]:
    """(greedy drafts equal to the target's greedy token, drafts) over the answer: pair j (the state at j, token
    j + 1) drafts token j + 2, an answer token's successor once token j + 1 is the answer's (j >= prompt_len - 1)."""
    g = head(hidden[:-1], torch.tensor(ids[1:], dtype=torch.long))
    drafts = head.logits(g).argmax(-1)  # pair j's draft for position j + 2
    greedy = logits.argmax(-1)[1:]  # the target's choice for position j + 2, made at position j + 1
    first = max(prompt_len - 1, 0)
    return int((drafts[first:] == greedy[first:]).sum()), len(ids) - 1 - first


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.head_acceptance")
    ap.add_argument("target")
    ap.add_argument("heads", nargs="+")
    ap.add_argument("--tokens", type=int, default=96, help="answer tokens per prompt")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(args.target, fmt="auto")
    with GGUFFile(args.target) as f:
        tok = Tokenizer.from_gguf_metadata(f.metadata)
    stop = frozenset(tok.eot_ids | ({tok.eos_id} if tok.eos_id is not None else set()))
    heads = {Path(h).name: TrainableNextN(target, weights_from_head_gguf(h, target.config.n_layer)) for h in args.heads}
    rows: dict[str, dict[str, tuple[int, int]]] = {name: {} for name in heads}
    for kind, prompts in KIND_PROMPTS.items():
        encoded = [tok.encode(render_prompt(tok, p, raw=False), parse_special=True) for p in prompts]
        answers = answer_side_by_side(target, encoded, args.tokens, stop)
        passes = [(ids, *target_pass(target, ids)) for ids in answers]
        for name, head in heads.items():
            hits = pairs = 0
            for (ids, hidden, logits), prompt in zip(passes, encoded):
                hits_at, n = answer_hits(head, ids, hidden, logits, len(prompt))
                hits, pairs = hits + hits_at, pairs + n
            rows[name][kind] = (hits, pairs)
    kinds = list(KIND_PROMPTS)
    lines = [f"`python -m benchmarks.head_acceptance {' '.join(sys.argv[1:] if argv is None else argv)}`",
             host_line(torch.get_num_threads()), "",
             "| head | " + " | ".join(kinds) + " | mean of kinds |", "|---|" + "---:|" * (len(kinds) + 1)]
    for name, by_kind in rows.items():
        shares = [by_kind[k][0] / max(by_kind[k][1], 1) for k in kinds]
        lines.append(f"| {name} | " + " | ".join(f"{s:.3f}" for s in shares) + f" | {sum(shares) / len(shares):.3f} |")
    lines.append("")
    lines.append("Pairs per kind: " + ", ".join(f"{k} {rows[next(iter(rows))][k][1]}" for k in kinds))
    emit(lines, args.markdown)


if __name__ == "__main__":
    main()
