"""Mistakes in chat templates as models ship them, corrected before a template renders a prompt.

A template teaches the model its tool-call syntax by example, and the model copies the example exactly.
Qwen2.5-Coder's GGUFs carry Qwen's Jinja template, whose tool instructions show the call wrapped in doubled
braces (``{{"name": <function-name>, ...}}``: written as if for a format-string engine, but inside a Jinja
string literal, so it renders verbatim). Taught that, Qwen2.5-Coder-1.5B answers ``{{"name": "get_weather", ...}}``
(Ollama's integration test ``TestTools/tools-routes``), which is not JSON. Ollama never renders this text: its
library model carries a hand-written Go template whose example has single braces, as Qwen2.5's other templates do.
Each erratum here is (the shipped text, the text Ollama's template has), matched exactly, in the template source.
"""

from __future__ import annotations

ERRATA: tuple[tuple[str, str], ...] = (
    ('{{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}}',
     '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}'),
)


def corrected_chat_template(source: str) -> str:
    """``source`` with every known erratum corrected (unchanged when it has none)."""
    for shipped, fixed in ERRATA:
        source = source.replace(shipped, fixed)
    return source
