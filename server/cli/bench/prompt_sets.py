"""The benchmark prompts, in one place: `tandem bench` (over the API) and the developer benchmark
`benchmarks.speculation` (in-process) both use these. Plain data; importing this module loads nothing else.

``PROMPTS`` is the speed set (one prompt per kind: code, prose, and a repetitive code edit that copies
most of its prompt, where n-gram drafting can pay). ``TEXT_KINDS`` is the set a speculation default is
chosen on (issue 33): prose, two lists (one that counts, where a context copy looks right and is not),
chat in French and Chinese, code and an edit; its prose, code and edit are the speed set's. ``PROSE_PROMPTS`` is the quality set for the
target-likelihood measurements of `tandem bench --quality` (its first entry is the speed set's prose
prompt). ``TEMPERATURES`` are the sampling settings the benchmarks sweep.
"""

from __future__ import annotations

PROMPTS: dict[str, str] = {
    "code": "Write a Python function `merge_intervals(intervals)` that merges overlapping intervals. "
            "Include type hints and a docstring.",
    "prose": "Write a short paragraph about the history of the printing press in Europe.",
    "repetitive": (
        "Here is a function:\n```python\ndef total_price(items):\n    total = 0\n    for item in items:\n"
        "        total += item.price * item.quantity\n    if total > 100:\n        total = total * 0.9\n"
        "    return total\n```\nRewrite it exactly, but rename the variable `total` to `acc`."),
}

TEXT_KINDS: dict[str, str] = {
    "prose": PROMPTS["prose"],
    "list": "List twelve kitchen utensils, one per line, each with a short note on what it is for.",
    "count": "List the numbers from 1 to 40, separated by commas.",
    "french": "Écris un court paragraphe sur l'histoire de Paris.",
    "chinese": "请用中文简单介绍一下长城的历史。",
    "code": PROMPTS["code"],
    "edit": PROMPTS["repetitive"],
}

PROSE_PROMPTS: dict[str, str] = {
    "printing-press": PROMPTS["prose"],
    "tides": "Explain in one paragraph why the ocean has two high tides a day.",
    "letter": "Write a short, friendly letter inviting a neighbour to a garden party next Saturday.",
    "bread": "Describe, in a few sentences, how sourdough bread rises without commercial yeast.",
    "city": "Write a paragraph describing a quiet city street early on a winter morning.",
    "habits": "Give three pieces of advice for building a reading habit, in a short paragraph.",
}

# Temperature name -> sampling options (min_p 0.01 at temperature > 0, as the speculation issues use).
TEMPERATURES: dict[str, dict] = {
    "0": dict(temperature=0.0),
    "0.6": dict(temperature=0.6, min_p=0.01),
}
