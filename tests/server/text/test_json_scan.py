"""server.text.json_scan: where a streamed JSON value closes, and which container a position sits in."""

from server.text.json_scan import JsonScan
from server.gojson import _innermost


def test_the_end_of_a_value_fed_in_chunks_ignores_brackets_in_strings():
    text = '{"a": "}]\\"{", "b": [1, {"c": 2}]} tail'
    scan = JsonScan()
    ends = [scan.scan(text[:n]) for n in range(1, len(text) + 1)]
    first = next(i for i, e in enumerate(ends) if e >= 0)
    assert ends[first] == text.index(" tail") and text[:ends[first]].endswith("]}")


def test_the_innermost_container_before_a_position():
    doc = '{"a": [1, 2 3]}'
    assert _innermost(doc, doc.index("3")) == "["
    assert _innermost('{"a": 1 "b": 2}', 8) == "{"
    assert _innermost('[1] {"x": "[', 12) == "{"  # a value that closed, then another open; brackets in a string
