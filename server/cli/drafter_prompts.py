"""The requests a drafter's training asks its target to answer: what chat models are asked, of every kind.

A head trained only on text the target reads learns that text: on SmolLM2, one trained on the standard library's
sources and package descriptions agreed with the target's greedy token on 0.29 of held-out such text, 0.40-0.48 of
the target's answer to a coding request, and 0.08-0.09 of its answer to a prose request (docs/speculation.md). The
target's own answers to requests like these (prose, lists, explanations, code, edits, several languages) are the
text it will draft for, so the trainer generates them and trains on them too.
"""

from __future__ import annotations

import random

INSTRUCTIONS = (
    "Write a short paragraph about {topic}.",
    "Explain {topic} to a twelve-year-old.",
    "List five facts about {topic}, one per line.",
    "Give three tips for someone learning about {topic}.",
    "Summarize the history of {topic} in a few sentences.",
    "Write a short story in which {topic} plays a part.",
    "What are the pros and cons of {topic}? Answer as a bulleted list.",
    "Écris un court paragraphe sur {topic}.",
    "Escribe un párrafo breve sobre {topic}.",
    "Schreibe einen kurzen Absatz über {topic}.",
    "用几句话介绍{topic}。",
    "Write a Python function related to {topic}, with a docstring.",
    "Write a JavaScript snippet that models {topic} as an object with two methods.",
    "Write a SQL table definition for storing information about {topic}.",
    "Rewrite this sentence to be more formal: 'so {topic} is kinda cool and lots of folks like it'.",
    "Answer briefly: why does {topic} matter?",
)

TOPICS = (
    "the printing press", "photosynthesis", "the Roman empire", "volcanoes", "coffee", "the moon landing",
    "machine learning", "bicycles", "the French revolution", "honey bees", "electric cars", "the internet",
    "chess", "climate change", "the human heart", "jazz music", "bread baking", "the stock market", "rainbows",
    "ancient Egypt", "recycling", "earthquakes", "the violin", "vaccines", "public libraries", "a todo list app",
    "a bank account", "sorting algorithms", "the water cycle", "mountain climbing", "solar panels", "tea",
    "the Olympic games", "octopuses", "city parks", "trains", "the periodic table", "gardening", "black holes",
    "a weather station",
)


def drafter_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` requests (instruction x topic, in a seeded order; repeated if n exceeds the combinations)."""
    pairs = [i.format(topic=t) for i in INSTRUCTIONS for t in TOPICS]
    random.Random(seed).shuffle(pairs)
    return [pairs[k % len(pairs)] for k in range(n)]
