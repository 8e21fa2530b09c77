"""Where a JSON text's brackets and strings stand, read left to right and resumable: the one scanner behind finding
where a streamed value closes (server.text.tool_calls) and naming the container an error sits in (server.gojson)."""

from __future__ import annotations


class JsonScan:
    """The open brackets (innermost last) and string state of the text scanned so far. ``scan`` goes on from where
    the last call stopped, so a value streamed in chunks is read once, not again from its start at every chunk."""

    __slots__ = ("pos", "open", "in_string", "escaped")

    def __init__(self) -> None:
        self.pos = 0
        self.open: list[str] = []
        self.in_string = self.escaped = False

    def scan(self, text: str, stop: int | None = None) -> int:
        """Read ``text[pos:stop]``; the index just past the bracket that closes the outermost value, where one does
        (the scan stops there), else -1. A closing bracket with nothing open is skipped."""
        end = len(text) if stop is None else stop
        opened, in_string, escaped = self.open, self.in_string, self.escaped
        for i in range(self.pos, end):
            c = text[i]
            if in_string:
                if escaped:
                    escaped = False
                elif c == "\\":
                    escaped = True
                elif c == '"':
                    in_string = False
            elif c == '"':
                in_string = True
            elif c in "{[":
                opened.append(c)
            elif c in "}]" and opened:
                opened.pop()
                if not opened:
                    self.pos, self.in_string, self.escaped = i + 1, in_string, escaped
                    return i + 1
        self.pos, self.in_string, self.escaped = end, in_string, escaped
        return -1

    @property
    def innermost(self) -> str:
        """The innermost open bracket ("{" or "["), "" when none is open."""
        return self.open[-1] if self.open else ""
