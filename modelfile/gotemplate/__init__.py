"""Go's text/template, the subset Ollama TEMPLATEs use.

The package, bottom up: `nodes` (the syntax tree), `values` (Go value semantics: truth, fmt printing,
encoding/json, printf, and the value types GoStruct, StringerMap, StringerList, MISSING), `funcs` (the
builtin functions), `parse` (text -> tree, grammar in ../gotemplate.lark) and `template` (execution and
GoTemplate).

Parsing yields an immutable tree of small dataclasses; execution walks it with Go's semantics: whitespace
trim markers, variable scoping (a variable lives until the `end` of the control structure that declared it),
`range`/`else`/`break`/`continue`, pipelines that append the previous result as the last argument,
short-circuit `and`/`or` returning the deciding value, Go truthiness, `fmt`-style printing and Ollama's extra
funcs `json` and `currentDate`.

Deliberate deviations from Go, all in the direction of rendering instead of failing:
- A missing field or map key evaluates to "no value" (MISSING): falsy, printed as "" (Go prints
  "<no value>" for maps and fails with "can't evaluate field" for structs), `len` 0, equal only to
  nil/no value, `json` null.  Field access on nil/no value also gives no value (Go fails for nil pointers).
- Maps keep insertion order in `json` output (Go sorts map keys; Ollama's tool arguments are ordered).
- Not supported: `define`/`template`/`block`, the `call` builtin, complex numbers, `%[n]` argument
  indexes in printf, iterator functions in `range`, custom delimiters.
"""

from .nodes import Action, Field, If, Node, Paren, Pipe, Range, Text, With
from .template import GoTemplate, parse_template
from .values import MISSING, GoStruct, StringerList, StringerMap, TemplateError, format_value, go_json, go_sprintf

__all__ = [
    "Action",
    "Field",
    "GoStruct",
    "GoTemplate",
    "If",
    "MISSING",
    "Node",
    "Paren",
    "Pipe",
    "Range",
    "StringerList",
    "StringerMap",
    "TemplateError",
    "Text",
    "With",
    "format_value",
    "go_json",
    "go_sprintf",
    "parse_template",
]
