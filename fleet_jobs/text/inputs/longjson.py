"""The text field of one JSON object read as a stream, for a record longer than a line may be.

JSON Lines records are read whole with the json module, up to MAX_LINE_BYTES; a longer one (a
1 GB document) comes here in chunks. The object's other fields are skipped without being held,
and the text field's string is decoded as it arrives (escapes, \\uXXXX, surrogate pairs split
between chunks), with json's own scanstring on runs of whole escapes: memory is bounded by the
chunk, whatever the record. Syntax outside the text is checked as far as skipping needs it.
A duplicated text key: the first is read (json.loads would keep the last).

Several text fields (``--text-column title,text``) are read in one pass as they come in the
record, each string's pieces tagged with its field (an int before them, -1 after), and a
named field that holds neither a string nor null is noted (``wrong``): ordering them is the
reader's (formats._LongRecord).
"""

from __future__ import annotations

import codecs
import re
from json.decoder import JSONDecodeError, scanstring  # type: ignore[attr-defined]  # defined at runtime; typeshed leaves it out

_WS = re.compile(r"[ \t\r\n]*")
_SKIP_STRING = re.compile(r'(?:[^"\\]++|\\.)*+', re.S)  # a string's body, escapes unchecked
_TEXT = re.compile(r'(?:[^"\\]++|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*+')  # whole escapes only
_ESCAPE_START = re.compile(r"\\(?:u[0-9a-fA-F]{0,3})?\Z")  # an escape the next chunk completes
_HIGH = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}\Z")  # its low half may follow in the next chunk
_NESTED = re.compile(r'[^"\[\]{}]*+')
_SCALAR = re.compile(r"[^,}\s]*+")
_SCALAR_OK = re.compile(r"(?:-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)\Z")
_SURROGATE = re.compile("[\ud800-\udfff]")
_KEY_MAX = 1 << 16


class NotJSON(ValueError):
    """The record is not a JSON object (or its text is not Unicode): the reason, for its Bad.
    ``pieces``: the text decoded before the fault, so that what a record gives before it does
    not depend on how its bytes were chunked."""

    def __init__(self, why: str, pieces: list | None = None):
        super().__init__(why)
        self.pieces = pieces or []


class TextField:
    """Feed a record's bytes in chunks; get back pieces of its ``column`` string, decoded.

    ``found`` once that string was read to its end; ``close()`` at the end of the record
    raises NotJSON when the object is incomplete. Several columns (a tuple of more than one):
    the pieces of each string come after its index in ``columns`` and before a -1, in the
    order the record holds them; ``wrong`` says why when one holds a number, a list...."""

    def __init__(self, column: str | tuple[str, ...]):
        self.columns = (column,) if isinstance(column, str) else tuple(column)
        self.column = self.columns[0]
        self._index = {name: k for k, name in enumerate(self.columns)}
        self._done = [False] * len(self.columns)  # each string read to its end
        self._marks = len(self.columns) > 1
        self._field = 0  # the one being read
        self._named = ""  # a scalar being read is this text field's value (several: a number is not text)
        self.wrong: str | None = None
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._buf = ""  # the unread tail: a few characters at most
        self._state = "start"
        self._token: list[str] = []  # a key or scalar being read
        self._size = 0
        self._key = ""
        self._depth = 0
        self._reading = False  # inside the text string

    @property
    def found(self) -> bool:
        return any(self._done)

    def feed(self, data: bytes) -> list:
        return self._decoded(data, False)

    def close(self) -> list:
        out = self._decoded(b"", True)
        if self._state == "scalar":
            self._end_scalar()
        if self._state != "done" or self._buf:
            raise NotJSON("the record ends early (a truncated line?)")
        return out

    def _decoded(self, data: bytes, final: bool) -> list:
        try:
            chunk = self._utf8.decode(data, final)
        except UnicodeDecodeError as e:  # the text before the bad byte first
            out = self._scan(e.object[: e.start].decode("utf-8"))
            raise NotJSON(f"invalid UTF-8 ({e.reason})", out) from None
        return self._scan(chunk)

    def _scan(self, chunk: str) -> list:
        out: list = []
        try:
            self._scan_into(chunk, out)
        except NotJSON as e:
            e.pieces = out + e.pieces
            raise
        return out

    def _scan_into(self, chunk: str, out: list) -> None:
        buf, i = self._buf + chunk, 0
        n = len(buf)
        while i < n:
            state = self._state
            if state == "text":
                i = self._text(buf, i, out)
                if self._state == "text":
                    break  # the rest is an escape the next chunk completes
                continue
            if state in ("skip", "nested_string", "key_string"):
                m = _SKIP_STRING.match(buf, i)
                assert m is not None  # it matches the empty string
                e = m.end()
                if state == "key_string":
                    self._grow(buf[i:e])
                i = e
                if i == n or buf[i] != '"':
                    break  # a lone backslash at the end: kept for the next chunk
                i += 1
                if state == "key_string":
                    self._key = _string("".join(self._token))
                    self._state = "colon"
                else:
                    self._state = "nested" if state == "nested_string" else "after"
                continue
            if state == "nested":
                m = _NESTED.match(buf, i)
                assert m is not None  # it matches the empty string
                i = m.end()
                if i == n:
                    break
                c = buf[i]
                i += 1
                if c == '"':
                    self._state = "nested_string"
                elif c in "{[":
                    self._depth += 1
                else:
                    self._depth -= 1
                    if not self._depth:
                        self._state = "after"
                continue
            if state == "scalar":
                m = _SCALAR.match(buf, i)
                assert m is not None  # it matches the empty string
                e = m.end()
                self._grow(buf[i:e])
                i = e
                if i < n:
                    self._end_scalar()
                continue
            m = _WS.match(buf, i)
            assert m is not None  # it matches the empty string
            i = m.end()
            if i == n:
                break
            c = buf[i]
            i += 1
            if state == "start" and c == "{":
                self._state = "first_key"
            elif state in ("first_key", "key") and c == '"':
                self._state, self._token, self._size = "key_string", [], 0
            elif state == "first_key" and c == "}" or state == "after" and c == "}":
                self._state = "done"
            elif state == "colon" and c == ":":
                self._state = "value"
            elif state == "after" and c == ",":
                self._state = "key"
            elif state == "value":
                k = self._index.get(self._key, -1)
                named = k >= 0 and not self._done[k]
                if c == '"' and named:
                    self._state, self._field = "text", k
                    if self._marks:
                        out.append(k)  # a mark among the pieces
                elif c == '"':
                    self._state = "skip"
                elif c in "{[":
                    self._state, self._depth = "nested", 1
                    if named and self._marks and self.wrong is None:
                        self.wrong = f"field {self._key!r} holds {'a list' if c == '[' else 'an object'}, not text"
                else:
                    self._state, self._token, self._size = "scalar", [], 0
                    self._named = self._key if named and self._marks else ""
                    i -= 1
            else:
                where = "after the object" if state == "done" else "where " + _EXPECTED[state]
                raise NotJSON(f"not JSON: {c!r} {where}")
        self._buf = buf[i:]

    def _text(self, buf: str, i: int, out: list) -> int:
        """Decode the text string from i as far as whole escapes go; the new position."""
        m = _TEXT.match(buf, i)
        assert m is not None  # it matches the empty string
        e = m.end()
        closed = e < len(buf) and buf[e] == '"'
        bad = not closed and e < len(buf) and not _ESCAPE_START.match(buf, e)
        if not closed and not bad and _HIGH.search(buf, i, e) and _escapes(buf, e - 6):
            e -= 6  # a high surrogate: decoded with the low half that follows
        if e > i:  # the text before a fault first, wherever the chunks end
            piece, fault = _text_piece(buf[i:e])
            if piece:
                out.append(piece)
            if fault:
                raise NotJSON(fault)
        if bad:
            raise NotJSON(f"not JSON: a bad escape in its text ({buf[e : e + 6]!r})")
        if closed:
            self._done[self._field], self._state = True, "after"
            if self._marks:
                out.append(-1)  # a mark among the pieces
            return e + 1
        return e

    def _grow(self, piece: str) -> None:
        self._token.append(piece)
        self._size += len(piece)
        if self._size > _KEY_MAX:
            raise NotJSON(f"a key or number longer than {_KEY_MAX >> 10} KiB")

    def _end_scalar(self) -> None:
        token = "".join(self._token)
        if not _SCALAR_OK.match(token):
            raise NotJSON(f"not JSON: {token[:20]!r} is not a value")
        if self._named and token != "null" and self.wrong is None:
            kind = "a boolean" if token in ("true", "false") else "a number"
            self.wrong = f"field {self._named!r} holds {kind}, not text"
        self._named = ""
        self._state = "after"


_EXPECTED = {
    "start": "an object should start",
    "first_key": "a key should be",
    "key": "a key should be",
    "colon": "a ':' should be",
    "value": "a value should be",
    "after": "a ',' or '}' should be",
}


def _escapes(buf: str, at: int) -> bool:
    """The backslash at ``at`` starts an escape (is not the second half of an escaped one)."""
    run = 0
    while at - run >= 0 and buf[at - run] == "\\":
        run += 1
    return run % 2 == 1


def _text_piece(body: str) -> tuple[str, str | None]:
    """The text of a run of whole escapes, up to its first fault; and the fault (or None)."""
    fault = None
    try:
        piece = scanstring(body + '"', 0, True)[0]
    except JSONDecodeError as e:  # a control character: what comes before it is text
        piece, fault = scanstring(body[: e.pos] + '"', 0, True)[0], f"not JSON: {e.msg.lower()} in its text"
    lone = _SURROGATE.search(piece)  # a pair is decoded whole: this is half of one
    if lone:
        return piece[: lone.start()], "a lone surrogate escape in its text (half of a \\uD83D\\uDE00 pair): not Unicode"
    return piece, fault


def _string(body: str) -> str:
    try:
        return scanstring(body + '"', 0, True)[0]
    except ValueError as e:  # a control character, a bad escape
        raise NotJSON(f"not JSON: {str(e).split(':')[0]}") from None
