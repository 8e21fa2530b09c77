"""Go text/template semantics of modelfile.gotemplate; expected strings follow Go's documented behaviour."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import pytest

from modelfile.gotemplate import MISSING, GoStruct, GoTemplate, StringerMap, TemplateError, go_sprintf, parse_template


def render(text: str, data: object = None, **kwargs: object) -> str:
    return GoTemplate.parse(text, **kwargs).execute({} if data is None else data)


# ---- text, trim markers, comments -------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("plain text", "plain text"),
        ("a  {{- 1 -}}  b", "a1b"),
        ("a \n{{- 1 }}\n b", "a1\n b"),
        ("a \n{{ 1 -}}\n b", "a \n1b"),
        ("{{ 1 -}}  \n\t  {{ 2 }}", "12"),  # whitespace-only text between two trims vanishes
        ("a\t\r\n{{- 1 }}", "a1"),
        ("x {{-3}} y", "x -3 y"),  # "{{-3" is the number -3, not a trim marker
        ("x {{- 3 -}} y", "x3y"),
        ("x {{ 3 }}\u00a0", "x 3\u00a0"),  # only Go's ASCII spaces count as trimmable
        ("a {{/* a comment */}} b", "a  b"),
        ("a {{- /* a comment */ -}} b", "ab"),
        ("a{{/* multi\nline {{ not an action }} */}}b", "ab"),
        ("{{ if true -}}\n  yes\n{{- end }}", "yes"),
        ("{{- /* leading */ -}}\n\nHello", "Hello"),
    ],
)
def test_text_trim_and_comments(text: str, expected: str) -> None:
    assert render(text) == expected


# ---- fields, $, dot --------------------------------------------------------------------------------


@dataclass
class Person:
    Name: str
    _secret: str = "hidden"

    def Greet(self, other: str) -> str:
        return f"{self.Name} greets {other}"


def test_fields_dot_and_root() -> None:
    data = {"System": "sys", "A": {"B": {"C": "deep"}}, "L": ["x", "y"], "X": "root"}
    assert render("{{ .System }}|{{ .A.B.C }}", data) == "sys|deep"
    assert render("{{ range .L }}{{ . }}{{ $.X }}{{ end }}", data) == "xrootyroot"
    assert render("{{ with .A }}{{ .B.C }}/{{ $.System }}{{ end }}", data) == "deep/sys"
    assert render("{{ $.A.B.C }}", data) == "deep"
    assert render("{{ . }}", "just a string") == "just a string"


def test_missing_fields_render_empty_and_are_false() -> None:
    data = {"A": {}}
    assert render("[{{ .Nope }}][{{ .A.B.C }}][{{ .Nope.Deeper }}]", data) == "[][][]"
    assert render("{{ if .Nope }}yes{{ else }}no{{ end }}", data) == "no"
    assert render("{{ len .Nope }}", data) == "0"
    assert render("{{ eq .Nope nil }} {{ eq .Nope \"\" }}", data) == "true false"
    assert render("{{ json .Nope }}", data) == "null"


def test_struct_fields_methods_and_private_attributes() -> None:
    person = Person("Ann")
    assert render("{{ .Name }}", person) == "Ann"
    assert render('{{ .Greet "Bob" }}', person) == "Ann greets Bob"
    assert render('{{ "Cy" | .Greet }}', person) == "Ann greets Cy"
    assert render("[{{ ._secret }}]", person) == "[]"  # private attributes are not fields
    struct = GoStruct({"Role": "user", "Content": "hi"}, type_name="api.Message")
    assert render("{{ .Role }}: {{ .Content }}", struct) == "user: hi"
    assert render("{{ . }}", struct) == "{user hi}"  # fmt's %v of a struct without String()


def test_field_on_non_struct_is_an_error() -> None:
    with pytest.raises(TemplateError, match="can't evaluate field B in type string"):
        render("{{ .A.B }}", {"A": "text"})


# ---- variables and scoping --------------------------------------------------------------------------


def test_variable_declaration_prints_nothing() -> None:
    assert render('{{ $x := "a" }}[{{ $x }}]') == "[a]"


def test_assignment_reaches_the_outer_variable() -> None:
    assert render("{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ end }}{{ $x }}") == "2"


def test_redeclaration_shadows_until_end() -> None:
    assert render("{{ $x := 1 }}{{ if true }}{{ $x := 2 }}{{ $x }}{{ end }}{{ $x }}") == "21"


def test_variable_scope_ends_at_end_of_control() -> None:
    with pytest.raises(TemplateError, match='undefined variable "\\$y"'):
        parse_template("{{ if true }}{{ $y := 1 }}{{ end }}{{ $y }}")


def test_if_pipeline_variable_visible_in_else() -> None:
    assert render("{{ if $x := .A }}{{ $x }}{{ else }}none[{{ $x }}]{{ end }}", {"A": ""}) == "none[]"
    assert render("{{ if $x := .A }}{{ $x }}{{ else }}none{{ end }}", {"A": "val"}) == "val"


def test_range_variables_and_dollar() -> None:
    data = {"L": ["a", "b"], "T": "t"}
    assert render("{{ range $i, $m := .L }}{{ $i }}:{{ $m }}{{ $.T }} {{ end }}", data) == "0:at 1:bt "
    assert render("{{ range $m := .L }}<{{ $m }}>{{ end }}", data) == "<a><b>"
    # an assignment inside range persists after it, a := inside does not
    assert render("{{ $n := 0 }}{{ range .L }}{{ $n = . }}{{ end }}{{ $n }}", data) == "b"
    assert render('{{ $n := "z" }}{{ range .L }}{{ $n := . }}{{ end }}{{ $n }}', data) == "z"


def test_range_assign_form() -> None:
    data = {"L": ["a", "b"]}
    assert render("{{ $i := 9 }}{{ $e := 0 }}{{ range $i, $e = .L }}{{ end }}{{ $i }}{{ $e }}", data) == "1b"


def test_too_many_declarations() -> None:
    with pytest.raises(TemplateError, match="too many declarations"):
        parse_template("{{ $x, $y := .A }}")
    with pytest.raises(TemplateError, match="too many declarations"):
        parse_template("{{ range $a, $b, $c := .A }}{{ end }}")


# ---- control structures ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [("a", "A"), ("b", "B"), ("c", "C"), ("z", "other")],
)
def test_if_else_if_chain(value: str, expected: str) -> None:
    text = '{{ if eq .V "a" }}A{{ else if eq .V "b" }}B{{ else if eq .V "c" }}C{{ else }}other{{ end }}'
    assert render(text, {"V": value}) == expected


@pytest.mark.parametrize(
    "value, truthy",
    [
        ("", False), ("x", True), (0, False), (1, True), (-1, True), (0.0, False), (0.5, True),
        (False, False), (True, True), (None, False), ([], False), ([0], True), ({}, False), ({"k": 0}, True),
        (GoStruct({}), True),
    ],
)
def test_truthiness(value: object, truthy: bool) -> None:
    assert render("{{ if .V }}T{{ else }}F{{ end }}", {"V": value}) == ("T" if truthy else "F")


def test_range_else_and_kinds() -> None:
    assert render("{{ range .L }}{{ . }}{{ else }}empty{{ end }}", {"L": []}) == "empty"
    assert render("{{ range .L }}{{ . }}{{ else }}empty{{ end }}", {}) == "empty"
    assert render("{{ range $k, $v := .M }}{{ $k }}={{ $v }};{{ end }}", {"M": {"b": 2, "a": 1}}) == "a=1;b=2;"
    assert render("{{ range 3 }}{{ . }}{{ end }}") == "012"  # Go 1.22 range over int
    with pytest.raises(TemplateError, match="range can't iterate over abc"):
        render("{{ range .S }}{{ end }}", {"S": "abc"})


def test_break_and_continue() -> None:
    text = "{{ range .L }}{{ if eq . 2 }}{{ continue }}{{ end }}{{ if eq . 4 }}{{ break }}{{ end }}{{ . }}{{ end }}"
    assert render(text, {"L": [1, 2, 3, 4, 5]}) == "13"
    # break leaves only the innermost range
    nested = "{{ range .O }}[{{ range $.I }}{{ if eq . 2 }}{{ break }}{{ end }}{{ . }}{{ end }}]{{ end }}"
    assert render(nested, {"O": [0, 0], "I": [1, 2, 3]}) == "[1][1]"


def test_with_else_and_else_with() -> None:
    assert render("{{ with .A }}[{{ . }}]{{ else }}none{{ end }}", {"A": "x"}) == "[x]"
    assert render("{{ with .A }}[{{ . }}]{{ else }}none{{ end }}", {"A": ""}) == "none"
    text = "{{ with .A }}a{{ else with .B }}b:{{ . }}{{ else }}c{{ end }}"
    assert render(text, {"A": "", "B": "bee"}) == "b:bee"
    assert render(text, {}) == "c"


# ---- pipelines and literals -----------------------------------------------------------------------


def test_pipelines_append_the_previous_value_last() -> None:
    data = {"L": ["a", "b", "c"]}
    assert render('{{ "x" | printf "%s-%s" "a" }}') == "a-x"
    assert render("{{ .L | len }}", data) == "3"
    assert render('{{ 42 | printf "%d" | len }}') == "2"
    assert render('{{ printf "%d items" (len .L) }}', data) == "3 items"
    assert render("{{ (index .P 1).Name }}", {"P": [{"Name": "a"}, {"Name": "b"}]}) == "b"


def test_piping_into_a_non_function_is_an_error() -> None:
    with pytest.raises(TemplateError, match="cannot be invoked as function|can't give argument"):
        render("{{ .A | .B }}", {"A": 1, "B": 2})
    with pytest.raises(TemplateError, match="can't give argument to non-function"):
        render('{{ "a" "b" }}')


@pytest.mark.parametrize(
    "text, expected",
    [
        (r'{{ "a\tb\n\x41\u00e9\101\\\"" }}', 'a\tb\nAéA\\"'),
        ("{{ `raw\\n {{ not }}` }}", "raw\\n {{ not }}"),
        ("{{ 'a' }} {{ '\\n' }}", "97 10"),
        ("{{ 42 }} {{ -7 }} {{ +3 }} {{ 0x1F }} {{ 017 }} {{ 0o17 }} {{ 0b101 }} {{ 1_000 }}", "42 -7 3 31 15 15 5 1000"),
        ("{{ 1.5 }} {{ 100.0 }} {{ 1e6 }} {{ 123456.0 }} {{ 1234567.0 }} {{ 0.0001 }} {{ 0.00001 }}", "1.5 100 1e+06 123456 1.234567e+06 0.0001 1e-05"),
        ("{{ true }} {{ false }} {{ print nil }}", "true false <nil>"),
    ],
)
def test_literals(text: str, expected: str) -> None:
    assert render(text) == expected


def test_nil_is_not_a_command() -> None:
    with pytest.raises(TemplateError, match="nil is not a command"):
        render("{{ nil }}")


# ---- builtins ---------------------------------------------------------------------------------------


def test_comparisons() -> None:
    assert render('{{ eq .R "a" "b" "c" }}', {"R": "b"}) == "true"
    assert render('{{ eq .R "a" "c" }}', {"R": "b"}) == "false"
    assert render('{{ ne 1 2 }} {{ ne "a" "a" }}') == "true false"
    assert render('{{ lt 1 2 }} {{ le 2 2 }} {{ gt "b" "a" }} {{ ge 1.5 2.5 }}') == "true true true false"
    assert render("{{ eq (len .L) 2 }}", {"L": [1, 2]}) == "true"
    with pytest.raises(TemplateError, match="incompatible types for comparison"):
        render('{{ eq 1 "1" }}')
    with pytest.raises(TemplateError, match="incompatible types for comparison"):
        render("{{ lt 1 1.5 }}")
    with pytest.raises(TemplateError, match="invalid type for comparison"):
        render("{{ lt true false }}")


def test_and_or_return_the_deciding_value() -> None:
    assert render('{{ and 1 "x" }}') == "x"
    assert render('{{ and 1 0 "x" }}') == "0"
    assert render('{{ or "" "y" }}') == "y"
    assert render('{{ or "" 0 }}') == "0"
    assert render('{{ or .Missing "fallback" }}') == "fallback"
    assert render('{{ "piped" | or "" }}') == "piped"


def test_and_or_short_circuit() -> None:
    # Go 1.18+: later arguments are not evaluated, so the out-of-range index never runs
    assert render("{{ or true (index .L 99) }}", {"L": []}) == "true"
    assert render("{{ and false (index .L 99) }}", {"L": []}) == "false"
    with pytest.raises(TemplateError, match="index out of range"):
        render("{{ or false (index .L 99) }}", {"L": []})


def test_not_len_index_slice() -> None:
    data = {"L": ["a", "b", "c"], "M": {"k": "v"}, "LL": [[1, 2], [3, 4]]}
    assert render('{{ not "" }} {{ not 1 }}') == "true false"
    assert render('{{ len "héllo" }} {{ len .L }} {{ len .M }}', data) == "6 3 1"  # bytes, as Go
    assert render('{{ index .M "k" }}|{{ index .M "zz" }}|{{ index .LL 1 0 }}|{{ index .L 2 }}', data) == "v||3|c"
    assert render('{{ index "abc" 1 }}') == "98"
    assert render('{{ slice .L 1 }} {{ slice .L 1 2 }} {{ slice .L }} {{ slice "hello" 1 3 }}', data) == "[b c] [b] [a b c] el"
    assert render("{{ len (slice $.L 2) }}", data) == "1"
    with pytest.raises(TemplateError, match="index out of range: 5"):
        render("{{ index .L 5 }}", data)
    with pytest.raises(TemplateError, match="invalid slice index"):
        render("{{ slice .L 2 1 }}", data)
    with pytest.raises(TemplateError, match="len of type int"):
        render("{{ len 3 }}")
    with pytest.raises(TemplateError, match="wrong number of args for not"):
        render("{{ not 1 2 }}")


def test_print_and_println() -> None:
    assert render("{{ print 1 2 }}") == "1 2"
    assert render('{{ print "a" 1 2 "b" }}') == "a1 2b"  # spaces only between two non-strings
    assert render('{{ println "a" 1 }}') == "a 1\n"
    assert render("{{ print .L .M true 1.5 }}", {"L": ["x", "y"], "M": {"b": 2, "a": 1}}) == "[x y] map[a:1 b:2] true 1.5"


def test_printf() -> None:
    text = '{{ printf "%s|%d|%v|%q|%5.2f|%-3d|%03d|%x|%X|%t|%%|%c|%8s|%-4s|%.2s" "s" 42 true "q\\"" 3.14159 7 5 255 255 false 65 "r" "l" "trunc" }}'
    assert render(text) == 's|42|true|"q\\""| 3.14|7  |005|ff|FF|false|%|A|       r|l   |tr'
    assert render('{{ printf "%d %d" 1 }}') == "1 %!d(MISSING)"
    assert render('{{ printf "%d" 1 2 }}') == "1%!(EXTRA int=2)"
    assert render('{{ printf "%d" "x" }}') == "%!d(string=x)"
    assert render('{{ printf "%v and %v" .L .M }}', {"L": ["a", "b"], "M": {"k": 1}}) == "[a b] and map[k:1]"
    assert render('{{ printf "%q" "tab\\there é" }}') == '"tab\\there é"'
    assert render('{{ printf "%+d %e %g %.3g %T" 5 1234.5678 0.000012 3.14159 1.0 }}') == "+5 1.234568e+03 1.2e-05 3.14 float64"


def test_html_js_urlquery() -> None:
    assert render("""{{ html "<a href='x'>&\\"" }}""") == "&lt;a href=&#39;x&#39;&gt;&amp;&#34;"
    assert render("""{{ js "it's <b>\\"=\\n" }}""") == "it\\'s \\u003Cb\\u003E\\\"\\u003D\\u000A"
    assert render('{{ urlquery "a b&c=d/é" }}') == "a+b%26c%3Dd%2F%C3%A9"
    assert render("{{ html 1 2 }}") == "1 2"


def test_json_matches_go_encoding() -> None:
    data = {"X": {"a": "<b>&", "n": 1.0, "f": 1.5, "tiny": 1e-7, "big": 1e21, "l": [1, None, True], "s": "é\n\u2028"}}
    expected = '{"a":"\\u003cb\\u003e\\u0026","n":1,"f":1.5,"tiny":1e-7,"big":1e+21,"l":[1,null,true],"s":"é\\n\\u2028"}'
    assert render("{{ json .X }}", data) == expected
    assert render("{{ json .S }}", {"S": GoStruct({"Name": "n"}, json_value={"name": "n"})}) == '{"name":"n"}'
    assert render("{{ json .Bad }}", {"Bad": float("nan")}) == ""  # Ollama ignores Marshal's error


def test_stringers_print_their_json() -> None:
    tool = GoStruct({"Name": "f"}, json_value={"name": "f", "n": [1, 2]}, stringer=True)
    assert render("{{ . }}", tool) == '{"name":"f","n":[1,2]}'
    assert render("{{ .A }}", {"A": StringerMap({"city": "Paris", "n": 2})}) == '{"city":"Paris","n":2}'
    assert render("{{ .A.city }}", {"A": StringerMap({"city": "Paris"})}) == "Paris"


def test_current_date_is_injectable() -> None:
    tmpl = GoTemplate.parse("Today is {{ currentDate }}.")
    assert tmpl.execute({}, today=datetime.date(2024, 5, 6)) == "Today is 2024-05-06."
    assert tmpl.execute({}).startswith("Today is 20")


def test_custom_funcs() -> None:
    tmpl = GoTemplate.parse("{{ upper .X }}{{ .X | upper }}", funcs={"upper": str.upper})
    assert tmpl.execute({"X": "ab"}) == "ABAB"
    with pytest.raises(TemplateError, match='function "upper" not defined'):
        GoTemplate.parse("{{ upper .X }}")

    def boom(_: object) -> str:
        raise RuntimeError("kaput")

    with pytest.raises(TemplateError, match="error calling boom: kaput"):
        GoTemplate.parse("{{ boom 1 }}", funcs={"boom": boom}).execute({})


def test_go_sprintf_directly() -> None:
    assert go_sprintf("%s=%v", "k", [1, "a"]) == "k=[1 a]"
    assert go_sprintf("%5.1f|%-5d|%05d", 2.25, 3, -42) == "  2.2|3    |-0042"


# ---- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, message, line",
    [
        ("{{ if .A }}x", "unexpected EOF", None),
        ("line1\n{{ .A ", "unclosed action", None),
        ("ok\n{{ end }}", "unexpected {{end}}", 2),
        ("{{ else }}", "unexpected {{else}}", 1),
        ("{{ foo }}", 'function "foo" not defined', 1),
        ("{{ $x }}", 'undefined variable "$x"', 1),
        ("{{ $x = 1 }}", 'undefined variable "$x"', 1),
        ("{{ break }}", "{{break}} outside {{range}}", 1),
        ("{{ range .A }}{{ else }}{{ continue }}{{ end }}", "{{continue}} outside {{range}}", 1),
        ('{{ "abc }}', "unterminated quoted string", 1),
        ("{{ `abc }}", "unterminated raw quoted string", 1),
        ("{{ }}", "missing value for command", 1),
        ("{{ range .A }}{{ else if .B }}{{ end }}", "unexpected 'if'", 1),
        ('{{ template "x" }}', "{{template}} is not supported", 1),
        ('{{ define "x" }}{{ end }}', "{{define}} is not supported", 1),
        ('{{ "\\q" }}', "unknown escape sequence", 1),
        ("a\n\n  {{ @ }}", "bad character '@'", 3),
        ("{{ if .A }}{{ end }}{{ end }}", "unexpected {{end}}", 1),
        ("{{ .A }", "bad character '}'", 1),
        ("ok {{/* never closed }}", "unclosed comment", 1),
        ("{{/* ok */}}\n{{/* bad */ }}", "unclosed comment", 2),
    ],
)
def test_syntax_errors(text: str, message: str, line: int | None) -> None:
    with pytest.raises(TemplateError) as info:
        parse_template(text)
    assert message in str(info.value)
    if line is not None:
        assert info.value.line == line
        assert info.value.column is not None and info.value.column >= 1


def test_error_position_points_at_the_action() -> None:
    with pytest.raises(TemplateError) as info:
        parse_template("hello\nworld {{ nope }}")
    assert (info.value.line, info.value.column) == (2, 10)
    assert str(info.value) == 'template: 2:10: function "nope" not defined'


def test_execution_errors_carry_position() -> None:
    with pytest.raises(TemplateError) as info:
        render("x\n  {{ index .L 3 }}", {"L": []})
    assert info.value.line == 2
    assert "error calling index" in str(info.value)


# ---- queries and Ollama's rewrites ------------------------------------------------------------------


def test_vars_and_has_field() -> None:
    tmpl = GoTemplate.parse(
        "{{ range $i, $m := .Messages }}{{ .Function.Name }}{{ if $.Tools }}{{ end }}{{ (index $.Extra 0).Deep }}{{ end }}"
    )
    assert tmpl.vars() == {"messages", "function", "name", "tools", "extra", "deep"}
    assert tmpl.has_field("Messages") and tmpl.has_field("messages") and tmpl.has_field("TOOLS")
    assert not tmpl.has_field("Response")
    legacy = GoTemplate.parse("{{ if .System }}{{ .System }}{{ end }}{{ .Prompt }}")
    assert legacy.vars() == {"system", "prompt"}


def test_truncated_after_field() -> None:
    data = {"Prompt": "p", "Response": "r", "X": True}
    tmpl = GoTemplate.parse("A{{ .Prompt }}B{{ .Response }}C{{ if .X }}D{{ end }}")
    assert tmpl.execute(data) == "ApBrCD"
    assert tmpl.truncated_after_field("Response").execute(data) == "ApBr"
    nested = GoTemplate.parse("{{ if .X }}x{{ .Response }}y{{ else }}z{{ end }}w")
    assert nested.truncated_after_field("Response").execute(data) == "xr"
    # conditions are not searched (as in Ollama), so a leading {{ if .Response }} survives whole
    cond = GoTemplate.parse("{{ if .Response }}a{{ end }}{{ .Response }}b")
    assert cond.truncated_after_field("Response").execute(data) == "ar"
    # the original is untouched
    assert tmpl.execute(data) == "ApBrCD"


def test_with_appended_field() -> None:
    tmpl = GoTemplate.parse("[{{ .Prompt }}]").with_appended_field("Response")
    assert tmpl.execute({"Prompt": "p", "Response": "r"}) == "[p]r"
    assert tmpl.has_field("response")


def test_missing_sentinel_is_falsy_singleton() -> None:
    assert not MISSING
    assert repr(MISSING) == "MISSING"
    assert render("{{ .X }}", {"X": MISSING}) == ""
