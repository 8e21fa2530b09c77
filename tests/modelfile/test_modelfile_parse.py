"""Modelfile parsing and rendering: Ollama's parser/parser.go behaviour, byte for byte.

Expected values come from docs/modelfile-spec.md and Ollama's parser_test.go; the
differential test at the end compares parse() with a line-by-line Python port of
Ollama's ParseFile state machine on thousands of generated inputs.
"""
from __future__ import annotations

import codecs
import random
import unicodedata

import pytest

from modelfile import Command, ParseError, parse, render
from modelfile.command import command_string, quote

INVALID_COMMAND = ('command must be one of "from", "license", "template", "system", "adapter", '
                   '"draft", "renderer", "parser", "parameter", "message", or "requires"')
INVALID_ROLE = 'message role must be one of "system", "user", or "assistant"'


def C(name, args):
    return Command(name, args)


def err_text(text):
    with pytest.raises(ParseError) as info:
        parse(text)
    return str(info.value)


# --------------------------------------------------------------------------- output model

def test_output_model_every_keyword():
    text = ("FROM base\nLICENSE MIT\nTEMPLATE t\nSYSTEM s\nADAPTER ./a\nDRAFT ./d\n"
            "RENDERER r\nPARSER p\nREQUIRES 0.14\nPARAMETER Top_K 5\nMESSAGE user hi\n")
    assert parse(text) == [
        C("model", "base"), C("license", "MIT"), C("template", "t"), C("system", "s"),
        C("adapter", "./a"), C("draft", "./d"), C("renderer", "r"), C("parser", "p"),
        C("requires", "0.14"), C("Top_K", "5"), C("message", "user: hi"),
    ]


@pytest.mark.parametrize("kw", ["from", "FROM", "From", "fRoM"])
def test_keywords_case_insensitive(kw):
    assert parse(f"{kw} x") == [C("model", "x")]


def test_keyword_names_lowercased():
    assert parse("from a\nSyStEm b\nlicense c\nDrAfT d\nparameter X y\nmessage user z") == [
        C("model", "a"), C("system", "b"), C("license", "c"), C("draft", "d"), C("X", "y"),
        C("message", "user: z")]


def test_order_kept_no_dedup_several_from():
    assert parse("PARAMETER a 1\nFROM x\nPARAMETER a 2\nFROM y\n") == [
        C("a", "1"), C("model", "x"), C("a", "2"), C("model", "y")]


def test_ollama_parse_file_file():
    text = ('\nFROM model1\nADAPTER adapter1\nLICENSE MIT\nPARAMETER param1 value1\n'
            'PARAMETER param2 value2\nTEMPLATE """{{ if .System }}<|start_header_id|>system'
            '<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"""    \n')
    assert parse(text) == [
        C("model", "model1"), C("adapter", "adapter1"), C("license", "MIT"),
        C("param1", "value1"), C("param2", "value2"),
        C("template", "{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n"
                      "{{ .System }}<|eot_id|>{{ end }}")]


def test_ollama_trim_space():
    text = ('\nFROM "     model 1"\nADAPTER      adapter3\nLICENSE "MIT       "\n'
            'PARAMETER param1        value1\nPARAMETER param2    value2\n'
            'TEMPLATE """   {{ .Prompt }}   """    \n')
    assert parse(text) == [
        C("model", "     model 1"), C("adapter", "adapter3"), C("license", "MIT       "),
        C("param1", "value1"), C("param2", "value2"), C("template", "   {{ .Prompt }}   ")]


@pytest.mark.parametrize("text,expected", [
    ('FROM "FOO  BAR  "', [C("model", "FOO  BAR  ")]),
    ('FROM "FOO BAR"\nPARAMETER param1 value1', [C("model", "FOO BAR"), C("param1", "value1")]),
    ("FROM     FOOO BAR    ", [C("model", "FOOO BAR")]),
    ("FROM /what/is/the path ", [C("model", "/what/is/the path")]),
    ("FROM llama3:7b-instruct-q4_K_M", [C("model", "llama3:7b-instruct-q4_K_M")]),
    ("PARAMETER param1 value1\nFROM foo", [C("param1", "value1"), C("model", "foo")]),
    ("PARAMETER what the \nFROM lemons make lemonade ",
     [C("what", "the"), C("model", "lemons make lemonade")]),
])
def test_ollama_parse_file_from(text, expected):
    assert parse(text) == expected


@pytest.mark.parametrize("line,name,value", [
    ("numa true", "numa", "true"),
    ("num_ctx 1", "num_ctx", "1"),
    ("top_p 1.0", "top_p", "1.0"),
    ("stop ### User:", "stop", "### User:"),
    ("stop ### User: ", "stop", "### User:"),
    ('stop "### User:"', "stop", "### User:"),
    ('stop "### User: "', "stop", "### User: "),
    ('stop """### User:"""', "stop", "### User:"),
    ('stop """### User:\n"""', "stop", "### User:\n"),
    ("stop <|endoftext|>", "stop", "<|endoftext|>"),
    ("stop </s>", "stop", "</s>"),
])
def test_ollama_parse_file_parameters(line, name, value):
    assert parse(f"FROM foo\nPARAMETER {line}\n") == [C("model", "foo"), C(name, value)]


# --------------------------------------------------------------------------- rule 1: decoding

UTF16_DATA = "FROM bob\nPARAMETER param1 1\nPARAMETER param2 4096\nSYSTEM You are a utf16 file.\n"
UTF16_EXPECTED = [C("model", "bob"), C("param1", "1"), C("param2", "4096"),
                  C("system", "You are a utf16 file.")]


def test_utf16_le_bom():
    assert parse(codecs.BOM_UTF16_LE + UTF16_DATA.encode("utf-16-le")) == UTF16_EXPECTED


def test_utf16_be_bom():
    assert parse(codecs.BOM_UTF16_BE + UTF16_DATA.encode("utf-16-be")) == UTF16_EXPECTED


def test_utf8_bom_bytes_and_str():
    data = "# comment first\nFROM bob\n"
    assert parse(codecs.BOM_UTF8 + data.encode()) == [C("model", "bob")]
    assert parse("\ufeff" + data) == [C("model", "bob")]


@pytest.mark.parametrize("encoding,bom", [("utf-8", b""), ("utf-16-le", codecs.BOM_UTF16_LE),
                                           ("utf-16-be", codecs.BOM_UTF16_BE)])
def test_multibyte(encoding, bom):
    text = "FROM test\n\tSYSTEM 你好👋"
    assert parse(bom + text.encode(encoding)) == [C("model", "test"), C("system", "你好👋")]


def test_utf16_without_bom_is_read_as_utf8():
    # 'F','\0','R',... : the NUL after F is not a letter -> invalid command on line 1.
    assert err_text("FROM x".encode("utf-16-le")) == f"(line 1): {INVALID_COMMAND}"


def test_invalid_utf8_becomes_replacement_chars():
    assert parse(b"FROM a\xffb\xe2\x82c") == [C("model", "a\ufffdb\ufffd\ufffdc")]


def test_only_first_bom_stripped():
    # A second BOM is a non-printable rune: it opens a name (not written), so this works...
    assert parse(codecs.BOM_UTF8 * 2 + b"FROM x") == [C("model", "x")]
    # ...but before a comment it is an invalid command.
    assert err_text(codecs.BOM_UTF8 * 2 + b"# c\nFROM x") == f"(line 1): {INVALID_COMMAND}"


# --------------------------------------------------------------------------- rule 2: line start, comments

def test_leading_blanks_skipped():
    assert parse(" \t\r\n\n  \tFROM x\n\n\t PARAMETER a b") == [C("model", "x"), C("a", "b")]


def test_comments():
    text = "# comment\nFROM foo\n  # indented comment\n\t#tab comment\n#\n"
    assert parse(text) == [C("model", "foo")]
    assert parse("FROM foo\n# trailing comment without newline") == [C("model", "foo")]


def test_hash_inside_value_is_literal():
    assert parse("FROM foo # x") == [C("model", "foo # x")]
    assert parse("FROM foo\nSYSTEM #not a comment") == [C("model", "foo"), C("system", "#not a comment")]


def test_hash_lines_inside_quoted_block_are_content():
    text = 'FROM foo\nSYSTEM """\n# heading\nbody\n# end\n"""\n'
    assert parse(text) == [C("model", "foo"), C("system", "\n# heading\nbody\n# end\n")]


# --------------------------------------------------------------------------- rule 3: command name

@pytest.mark.parametrize("text,line", [
    ("FROM foo\nBADCOMMAND param1 value1\n", 2),
    ("\nFROM foo\nBADCOMMAND param1 value1\n", 3),
    ("FROMX foo", 1),
    ("FROM1 foo", 1),
    ("1FROM foo", 1),
    ('"FROM" foo', 1),
    ("FR-OM foo", 1),
    ("FROM-x foo", 1),
    ("froms x", 1),
    ("PARAMETERS x y", 1),
    ("FROM x\nfoo bar", 2),
])
def test_invalid_command(text, line):
    assert err_text(text) == f"(line {line}): {INVALID_COMMAND}"


def test_unknown_command_reported_at_separator_but_eof_wins():
    # Unknown name followed by EOF: Ollama never reaches the separator.
    assert err_text("FROM x\nBOGUS") == "unexpected EOF"


def test_name_ended_by_newline_reports_next_line():
    # The counter is incremented when the newline is read, before it is rejected.
    assert err_text("FROM\nx") == f"(line 2): {INVALID_COMMAND}"
    assert err_text("FROM x\nSYSTEM\n") == f"(line 3): {INVALID_COMMAND}"
    assert err_text("FROM x\nSYSTEM\r\n") == f"(line 3): {INVALID_COMMAND}"


def test_tab_separates_name():
    assert parse("FROM\tx\nSYSTEM\t\thello") == [C("model", "x"), C("system", "hello")]


def test_unicode_letter_in_name_is_invalid():
    assert err_text("FRÖM x") == f"(line 1): {INVALID_COMMAND}"


# --------------------------------------------------------------------------- rule 4: PARAMETER

def test_parameter_name_chars_and_case_kept():
    assert parse("FROM x\nPARAMETER Num_CTX_2 8") == [C("model", "x"), C("Num_CTX_2", "8")]


@pytest.mark.parametrize("text,message", [
    ("FROM foo\nPARAMETER param1\n", "unexpected EOF: param1"),
    ("FROM foo\nPARAMETER stop\r\nx", "unexpected EOF: stop"),
    ("FROM foo\nPARAMETER top-k 1", "unexpected EOF: top"),
    ("FROM foo\nPARAMETER -x 1", "unexpected EOF: "),
    ('FROM foo\nPARAMETER "stop" x', "unexpected EOF: "),
    ("FROM foo\nPARAMETER stop.x y", "unexpected EOF: stop"),
    ("FROM foo\nPARAMETER param1", "unexpected EOF"),
    ("FROM foo\nPARAMETER ", "unexpected EOF"),
    ("FROM foo\nPARAMETER", "unexpected EOF"),
    ('FROM foo\nPARAMETER stop "unclosed', "unexpected EOF"),
])
def test_parameter_errors(text, message):
    assert err_text(text) == message


def test_parameter_two_spaces_empty_name_quirk():
    assert parse("FROM x\nPARAMETER  temperature 0.5") == [C("model", "x"), C("", "temperature 0.5")]
    assert parse("FROM x\nPARAMETER \t") == [C("model", "x"), C("", "")]


def test_parameter_newline_right_after_keyword_is_invalid_command():
    assert err_text("FROM x\nPARAMETER\nstop a") == f"(line 3): {INVALID_COMMAND}"


# --------------------------------------------------------------------------- rule 5: MESSAGE

def test_messages():
    text = ("\nFROM foo\nMESSAGE system You are a file parser. Always parse things.\n"
            "MESSAGE user Hey there!\nMESSAGE assistant Hello, I want to parse all the things!\n")
    assert parse(text) == [
        C("model", "foo"),
        C("message", "system: You are a file parser. Always parse things."),
        C("message", "user: Hey there!"),
        C("message", "assistant: Hello, I want to parse all the things!")]


def test_message_multiline():
    text = 'FROM foo\nMESSAGE system """\nYou are a multiline file parser.\n"""\n\t\t\t'
    assert parse(text) == [C("model", "foo"), C("message", "system: \nYou are a multiline file parser.\n")]


@pytest.mark.parametrize("text,message", [
    ("\nFROM foo\nMESSAGE badguy I'm a bad guy!\n", f"(line 3): {INVALID_ROLE}"),
    ("FROM foo\nMESSAGE tool result", f"(line 2): {INVALID_ROLE}"),
    ("FROM foo\nMESSAGE User hi", f"(line 2): {INVALID_ROLE}"),
    ("FROM foo\nMESSAGE users hi", f"(line 2): {INVALID_ROLE}"),
    ("FROM foo\nMESSAGE  user hi", f"(line 2): {INVALID_ROLE}"),
    ("FROM foo\nMESSAGE\tSYSTEM\thi", f"(line 2): {INVALID_ROLE}"),
    ("\nFROM foo\nMESSAGE system\n", "unexpected EOF: system"),
    ("FROM foo\nMESSAGE user1 hi", "unexpected EOF: user"),
    ("FROM foo\nMESSAGE us-er hi", "unexpected EOF: us"),
    ("\nFROM foo\nMESSAGE system", "unexpected EOF"),
    ("FROM foo\nMESSAGE ", "unexpected EOF"),
    ('FROM foo\nMESSAGE user """never closed\n', "unexpected EOF"),
])
def test_message_errors(text, message):
    assert err_text(text) == message


def test_message_args_contain_colon_space():
    assert parse("FROM x\nMESSAGE user a: b") == [C("model", "x"), C("message", "user: a: b")]


# --------------------------------------------------------------------------- rules 6-8: values

@pytest.mark.parametrize("body,value", [
    ('"""\nThis is a\nmultiline system.\n"""', "\nThis is a\nmultiline system.\n"),
    ('"""\nThis is a\nmultiline system."""', "\nThis is a\nmultiline system."),
    ('"""This is a\nmultiline system."""', "This is a\nmultiline system."),
    ('"""This is a multiline system."""', "This is a multiline system."),
    ('"""\nThis is a multiline system with "quotes".\n"""', '\nThis is a multiline system with "quotes".\n'),
    ('""""""', ""),
    ('""', ""),
    ('"\'"', "'"),
    ('"""\'\'"\'""\'""\'"\'\'\'\'\'""\'""\'"""', '\'\'"\'""\'""\'"\'\'\'\'\'""\'""\''),
    ('"a\nb"', "a\nb"),                 # single quotes span lines too
    ('"a\n\n  b  "', "a\n\n  b  "),
    ('"""a""""', 'a"'),                 # closing triple = the last three quotes
    ('"""', None),
    ('""""', None),
    ('"""""', None),
    ('"""a"""  b\nc"""', 'a"""  b\nc'),   # text after the close keeps it open
    ('"a" b\nc"', 'a" b\nc'),
    ('"  x  "', "  x  "),
    ("   a \t  b   ", "a \t  b"),
    ("'single'", "'single'"),
    ('say "hi"', 'say "hi"'),
    ('"say \\"hi\\""', 'say \\"hi\\"'),   # no escapes
    ("C:\\path\\n", "C:\\path\\n"),
    ('"x"  \t ', "x"),
    ("", ""),
    ("   ", ""),
])
def test_values(body, value):
    text = f"FROM foo\nSYSTEM {body}\nPARAMETER after 1\n"
    if value is None:
        assert err_text(text) == "unexpected EOF"
    else:
        assert parse(text) == [C("model", "foo"), C("system", value), C("after", "1")]


@pytest.mark.parametrize("text", [
    'FROM foo\nSYSTEM """This is a multiline system.""\n\t\t\t',
    'FROM foo\nSYSTEM "\n\t\t\t',
    'FROM foo\nSYSTEM "a" b\nc',
    'FROM foo\nTEMPLATE """\n{{ .Prompt }}\n""',
    'FROM "foo',
])
def test_incomplete_value_at_eof(text):
    assert err_text(text) == "unexpected EOF"


def test_value_at_eof_flushed():
    assert parse('FROM foo\nTEMPLATE """\n{{ .Prompt }}\n"""') == [
        C("model", "foo"), C("template", "\n{{ .Prompt }}\n")]
    assert parse("FROM foo\nSYSTEM x   ") == [C("model", "foo"), C("system", "x")]


def test_unclosed_quote_swallows_following_commands():
    assert err_text('FROM foo\nSYSTEM "x\nBOGUS y\nMESSAGE tool z\n') == "unexpected EOF"
    assert parse('FROM foo\nSYSTEM "x\nBOGUS y\n"') == [C("model", "foo"), C("system", "x\nBOGUS y\n")]


# --------------------------------------------------------------------------- rule 9: non-printables

def test_non_printables_dropped_in_values():
    text = "FROM fo\u200bo\x07\x1b\nSYSTEM a\u00a0b\u2028c\u00adb\x7f\x85\u3000z"
    assert parse(text) == [C("model", "foo"), C("system", "abcbz")]


def test_non_printables_inside_quote_marks_still_quote():
    # Dropped runes may split a triple quote or sit between the close and the newline.
    text = 'FROM x\nSYSTEM "\u200b""a\nb"\u200b"\x01"\u200b \n'
    assert parse(text) == [C("model", "x"), C("system", "a\nb")]


def test_non_printable_before_command_is_ignored():
    assert parse("\u200bFROM x\n\x00SYSTEM y") == [C("model", "x"), C("system", "y")]


@pytest.mark.parametrize("text,message", [
    ("FR\u200bOM x", f"(line 1): {INVALID_COMMAND}"),
    ("FROM\u200b x", f"(line 1): {INVALID_COMMAND}"),
    ("\u200b\u200bFROM x", f"(line 1): {INVALID_COMMAND}"),
    ("\u200b FROM x", f"(line 1): {INVALID_COMMAND}"),
    ("FROM x\n\x00\nSYSTEM y", f"(line 3): {INVALID_COMMAND}"),
    ("FROM x\n\x00", "unexpected EOF"),
    ("FROM x\nPARAMETER te\u200bmp 1", "unexpected EOF: te"),
    ("FROM x\nMESSAGE us\x00er hi", "unexpected EOF: us"),
])
def test_non_printables_outside_values(text, message):
    # Ollama only drops them after the state machine accepted the rune; in a name,
    # parameter name or role they are errors (beyond the spec's summary, from parser.go).
    assert err_text(text) == message


# --------------------------------------------------------------------------- rule 10: FROM quirks

def test_from_space_newline_gives_empty_model():
    assert parse("FROM \nSYSTEM x") == [C("model", ""), C("system", "x")]
    assert parse("FROM ") == [C("model", "")]


def test_from_newline_and_eof_are_errors():
    assert err_text("FROM\n") == f"(line 2): {INVALID_COMMAND}"
    assert err_text("FROM") == "unexpected EOF"


# --------------------------------------------------------------------------- rule 11: CRLF

def test_crlf_file():
    text = 'FROM foo\r\nPARAMETER stop "<|end|>"\r\nSYSTEM """a\r\nb"""\r\n\r\n# c\r\nMESSAGE user hi\r\n'
    assert parse(text) == [C("model", "foo"), C("stop", "<|end|>"), C("system", "a\r\nb"),
                           C("message", "user: hi")]


def test_crlf_line_numbers_drift():
    assert err_text("FROM foo\r\nBAD x") == f"(line 3): {INVALID_COMMAND}"
    assert err_text("FROM foo\r\n\r\nMESSAGE bad x") == f"(line 5): {INVALID_ROLE}"
    assert err_text("FROM foo\rBAD x") == f"(line 2): {INVALID_COMMAND}"


def test_line_numbers_count_lines_inside_values():
    text = 'FROM foo\nSYSTEM """\none\ntwo\n"""\nMESSAGE nobody x'
    assert err_text(text) == f"(line 6): {INVALID_ROLE}"


# --------------------------------------------------------------------------- rule 12 / missing FROM

@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment", "PARAMETER param1 value1",
                                  "SYSTEM s\nMESSAGE user hi", "LICENSE x"])
def test_no_from_line(text):
    assert err_text(text) == "no FROM line"


def test_syntax_error_before_missing_from():
    assert err_text("BAD x") == f"(line 1): {INVALID_COMMAND}"


def test_parse_error_is_value_error_with_line():
    with pytest.raises(ValueError) as info:
        parse("FROM x\nBAD y")
    assert info.value.line == 2 and info.value.msg == INVALID_COMMAND
    with pytest.raises(ParseError) as info:
        parse("")
    assert info.value.line is None


# --------------------------------------------------------------------------- render

@pytest.mark.parametrize("value,quoted", [
    ("plain", "plain"),
    ("two words", "two words"),
    ("", ""),
    (" lead", '" lead"'),
    ("trail ", '"trail "'),
    ("a\nb", '"a\nb"'),
    ('say "hi"', 'say "hi"'),
    ('"q"', '"q"'),
    (' "q"', '""" "q""""'),
    ('a\n"b"', '"""a\n"b""""'),
    ("\ttab", "\ttab"),
])
def test_quote(value, quoted):
    assert quote(value) == quoted


def test_render_lines():
    cmds = [C("model", "llama3:8b"), C("template", "{{ .Prompt }}"), C("system", "\nhi\n"),
            C("adapter", "./a b"), C("license", " MIT"), C("draft", "./d"), C("renderer", "r"),
            C("parser", "p"), C("requires", "0.14.0"), C("message", "user: hello "),
            C("message", "assistant: x"), C("stop", "</s>"), C("temperature", "0.7")]
    assert render(cmds) == (
        "FROM llama3:8b\nTEMPLATE {{ .Prompt }}\nSYSTEM \"\nhi\n\"\nADAPTER ./a b\n"
        "LICENSE \" MIT\"\nDRAFT ./d\nRENDERER r\nPARSER p\nREQUIRES 0.14.0\n"
        "MESSAGE user \"hello \"\nMESSAGE assistant x\nPARAMETER stop </s>\n"
        "PARAMETER temperature 0.7\n")
    assert str(C("model", "x")) == "FROM x"
    assert command_string(C("message", "nocolon")) == "MESSAGE nocolon "


def test_from_is_never_quoted():
    assert render([C("model", " spaced ")]) == "FROM  spaced \n"


OLLAMA_FORMAT_CASES = [
    "\nFROM foo\nADAPTER adapter1\nLICENSE MIT\nPARAMETER param1 value1\nPARAMETER param2 value2\n"
    "TEMPLATE template1\nMESSAGE system You are a file parser. Always parse things.\n"
    "MESSAGE user Hey there!\nMESSAGE assistant Hello, I want to parse all the things!\n",
    '\nFROM foo\nADAPTER adapter1\nLICENSE MIT\nPARAMETER param1 value1\nPARAMETER param2 value2\n'
    'TEMPLATE template1\nMESSAGE system """\nYou are a store greeter. Always respond with "Hello!".\n'
    '"""\nMESSAGE user Hey there!\nMESSAGE assistant Hello, I want to parse all the things!\n',
    '\nFROM foo\nADAPTER adapter1\nLICENSE """\nVery long and boring legal text.\nBlah blah blah.\n'
    '"Oh look, a quote!"\n"""\n\nPARAMETER param1 value1\nPARAMETER param2 value2\n'
    'TEMPLATE template1\nMESSAGE system """\nYou are a store greeter. Always respond with "Hello!".\n'
    '"""\nMESSAGE user Hey there!\nMESSAGE assistant Hello, I want to parse all the things!\n',
    '\nFROM foo\nSYSTEM ""\n',
]


@pytest.mark.parametrize("text", OLLAMA_FORMAT_CASES)
def test_ollama_format_parse_file(text):
    cmds = parse(text)
    assert parse(render(cmds)) == cmds


TRICKY_VALUES = [
    "", "x", "two  words", " lead", "trail ", "  both  ", "\ttabs\t inside", "a\nb", "\n", "\n\n",
    "line\n", "\nline", 'quote"inside', '"', '""', '"start', 'end"', ' "spaced quote" ',
    'multi\n"quoted"\nlines', 'ends with quote"', 'a"\n"b', "#hash", "# hash at start",
    "unicode ✓ 你好 👋", "back\\slash\\n", "'single'", "{{ .Prompt }}", "a\r\nb", "\r",
    "tab\t", "  ", " ", 'x """ y', '"""', 'a\n"""b', 'a"""\nb', 'a """  \n b',
]
ROUND_TRIP_NAMES = ["template", "system", "adapter", "license", "draft", "renderer", "parser",
                    "requires", "stop", "temperature", "Odd_Name_1", "from"]


def _round_trips_in_ollama(value: str) -> bool:
    """Values that Ollama's own String()/ParseFile pair preserves (quote() never escapes)."""
    q = quote(value)
    if q == value:  # written raw: trimmed, and a leading quote or a CR would change it
        return value.strip(" \t") == value and not value.startswith('"') and "\r" not in value
    if q.startswith('"""'):
        # closes early at a line break that follows a '"""' inside the value
        return not any(value[i] in "\r\n" and value[:i].rstrip(" \t\r\n").endswith('"""')
                       for i in range(len(value)))
    return True


REPRESENTABLE = [v for v in TRICKY_VALUES if _round_trips_in_ollama(v)]
NOT_REPRESENTABLE = [v for v in TRICKY_VALUES if not _round_trips_in_ollama(v)]


@pytest.mark.parametrize("value", REPRESENTABLE)
@pytest.mark.parametrize("name", ROUND_TRIP_NAMES)
def test_round_trip_tricky_values(name, value):
    cmds = [C("model", "base"), C(name, value), C("message", f"user: {value}")]
    assert parse(render(cmds)) == cmds


@pytest.mark.parametrize("value", NOT_REPRESENTABLE)
def test_values_ollama_cannot_round_trip(value):
    # Same limitation as Ollama's quote(): these change (or fail) when re-parsed.
    cmds = [C("model", "base"), C("system", value)]
    try:
        assert parse(render(cmds)) != cmds
    except ParseError:
        pass


def test_representable_split():
    assert set(NOT_REPRESENTABLE) == {"\ttabs\t inside", '"', '""', '"start', "\r", "tab\t",
                                      '"""', 'a"""\nb', 'a """  \n b'}


def test_round_trip_random():
    rng = random.Random(1234)
    alphabet = ["a", "b", " ", "  ", "\t", "\n", '"', "#", "\\", "'", "é", "{", "}", ":", "\r\n"]
    checked = 0
    for _ in range(600):
        value = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        if not _round_trips_in_ollama(value):
            continue
        cmds = [C("model", "m"), C(rng.choice(ROUND_TRIP_NAMES), value),
                C("message", rng.choice(["system", "user", "assistant"]) + ": " + value)]
        assert parse(render(cmds)) == cmds, repr(value)
        checked += 1
    assert checked > 300


# --------------------------------------------------------------------------- differential test

def _go_is_print(ch):
    return ch == " " or unicodedata.category(ch)[0] in "LMNPS"


def go_parse_file(text: str):
    """Line-by-line port of Ollama's ParseFile (on already decoded text).

    Returns a list of (name, args) or the error string.
    """
    NIL, NAME, VALUE, PARAMETER, MESSAGE, COMMENT = range(6)
    keywords = {"from", "license", "template", "system", "adapter", "draft", "renderer",
                "parser", "parameter", "message", "requires"}

    def is_alpha(r):
        return "a" <= r <= "z" or "A" <= r <= "Z"

    def parse_rune_for_state(r, cs):
        space, newline = r in " \t", r in "\r\n"
        if cs == NIL:
            if r == "#":
                return COMMENT, None, None
            if space or newline:
                return NIL, None, None
            return NAME, r, None
        if cs == NAME:
            if is_alpha(r):
                return NAME, r, None
            if space:
                return VALUE, None, None
            return NIL, None, INVALID_COMMAND
        if cs == VALUE:
            return (NIL if newline or space else VALUE), r, None
        if cs == PARAMETER:
            if is_alpha(r) or "0" <= r <= "9" or r == "_":
                return PARAMETER, r, None
            if space:
                return VALUE, None, None
            return NIL, None, "EOF"
        if cs == MESSAGE:
            if is_alpha(r):
                return MESSAGE, r, None
            if space:
                return VALUE, None, None
            return NIL, None, "EOF"
        return (NIL if newline else COMMENT), None, None

    def unquote(s):
        if s[:3] == '"""':
            return (s[3:-3], True) if len(s) >= 6 and s[-3:] == '"""' else ("", False)
        if s[:1] == '"':
            return (s[1:-1], True) if len(s) >= 2 and s[-1] == '"' else ("", False)
        return s, True

    cmd_name, curr, line, b, role, out = "", NIL, 1, "", "", []
    for r in text:
        if r in "\r\n":
            line += 1
        nxt, r, err = parse_rune_for_state(r, curr)
        if err == "EOF":
            return "unexpected EOF: " + b
        if err:
            return f"(line {line}): {err}"
        if nxt != curr:
            if curr == NAME:
                if b.lower() not in keywords:
                    return f"(line {line}): {INVALID_COMMAND}"
                s = b.lower()
                if s == "from":
                    cmd_name = "model"
                elif s == "parameter":
                    nxt = PARAMETER
                elif s == "message":
                    nxt = MESSAGE
                    cmd_name = s
                else:
                    cmd_name = s
            elif curr == PARAMETER:
                cmd_name = b
            elif curr == MESSAGE:
                if b not in ("system", "user", "assistant"):
                    return f"(line {line}): {INVALID_ROLE}"
                role = b
            elif curr == VALUE:
                s, ok = unquote(b.strip())
                if not ok or r in " \t":
                    b += r
                    continue
                if role:
                    s, role = role + ": " + s, ""
                out.append((cmd_name, s))
            b, curr = "", nxt
        if r is not None and _go_is_print(r):
            b += r
    if curr == VALUE:
        s, ok = unquote(b.strip())
        if not ok:
            return "unexpected EOF"
        out.append((cmd_name, role + ": " + s if role else s))
    elif curr not in (NIL, COMMENT):
        return "unexpected EOF"
    if not any(name == "model" for name, _ in out):
        return "no FROM line"
    return out


def ours(text):
    try:
        return [(c.name, c.args) for c in parse(text)]
    except ParseError as e:
        return str(e)


FRAGMENTS = ["FROM", "from", "PARAMETER", "MESSAGE", "SYSTEM", "template", "Draft", "LICENSE",
             "user", "system", "assistant", "tool", "stop", "x", "a b", "_1", " ", " ", "  ",
             "\t", "\n", "\n", "\r\n", "\r", '"', '"', '"""', "#", "-", "\u200b", "\x00", "é",
             "\\", "'", ":"]


def _random_text(rng):
    return "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 14)))


def _random_modelfile(rng):
    lines = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.choice(["FROM", "SYSTEM", "PARAMETER", "MESSAGE", "TEMPLATE", "# c", ""])
        head = kind
        if kind == "PARAMETER":
            head += rng.choice([" stop", " temperature", "", " num_ctx", " x-y"])
        elif kind == "MESSAGE":
            head += rng.choice([" user", " system", " assistant", " tool", "", " User"])
        value = "".join(rng.choice(FRAGMENTS[17:]) + rng.choice(["v", "w", ""])
                        for _ in range(rng.randint(0, 5)))
        lines.append(head + rng.choice([" ", "\t", "", "  "]) + value)
    return rng.choice(["\n", "\r\n"]).join(lines) + rng.choice(["", "\n"])


def test_differential_against_go_port():
    rng = random.Random(20240521)
    outcomes = set()
    for i in range(2500):
        text = _random_text(rng) if i % 2 else _random_modelfile(rng)
        if rng.random() < 0.5:
            text = "FROM m\n" + text
        expected = go_parse_file(text)
        assert ours(text) == expected, repr(text)
        outcomes.add(expected if isinstance(expected, str) else "ok")
    # the generator reaches every kind of outcome
    assert "ok" in outcomes and "no FROM line" in outcomes and "unexpected EOF" in outcomes
    assert any(o.startswith("unexpected EOF: ") for o in outcomes)
    assert any(o.endswith(INVALID_COMMAND) for o in outcomes)
    assert any(o.endswith(INVALID_ROLE) for o in outcomes)


def test_go_port_agrees_on_spec_examples():
    # Guard the oracle itself against drifting from the spec's documented quirks.
    assert go_parse_file("FROM \n") == [("model", "")]
    assert go_parse_file("FROM x\nPARAMETER stop\n") == "unexpected EOF: stop"
    assert go_parse_file("FROM x\nPARAMETER  a b") == [("model", "x"), ("", "a b")]
    assert go_parse_file("FROM\n") == f"(line 2): {INVALID_COMMAND}"
