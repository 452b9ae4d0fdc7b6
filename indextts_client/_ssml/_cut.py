"""SSML in pieces (an LLM's tokens) cut into whole SSML documents, one per sentence, for ``stream_text``.

The cutter reads the markup as it comes, character by character and once (linear), and cuts
only where no element is open and no tag is being read: after a sentence end (``.``, ``!``,
``?`` and their full-width forms, then a space), after a ``</s>`` or ``</p>``, or where the
caller flushes (a flush inside a tag or an element waits for its end).  So a tag is never split
across sentences, and neither is an element: a ``<prosody>`` that spans three sentences is
spoken as one piece.  A ``<speak ...>`` around the whole is taken off and put around each piece
(its ``xml:lang`` with it); each piece is then read as any SSML text is.  An open element longer
than ``max_chars`` is refused (``invalid_ssml``).
"""

from __future__ import annotations

import re

from ._plan import SsmlError

__all__ = ["SsmlSplitter"]

_ENDS = frozenset(".!?\u3002\uff01\uff1f")
_SPEAK = re.compile(r"\s*<speak\b[^>]*>", re.ASCII)


class SsmlSplitter:
    """``add(fragment) -> [document, ...]`` as each is complete; ``finish() -> document`` (or "")."""

    def __init__(self, max_chars: int) -> None:
        self._max = max_chars
        self._buffer: list[str] = []
        self._size = 0
        self._open = "<speak>"
        self._root_seen = False
        self._head = ""  # text before the root is known to be there or not
        self._depth = 0
        self._tag: list[str] = []  # the tag being read, from its "<"
        self._quote = ""
        self._end_pending = False  # a sentence end was read: cut at the next space
        self._done: list[str] = []

    @property
    def pending(self) -> int:
        return self._size

    def add(self, text: str) -> list[str]:
        if not self._root_seen:
            self._head += text
            if len(self._head.lstrip()) < 6 and "<speak"[: len(self._head.lstrip())] == self._head.lstrip():
                return []  # could still be "<speak"
            match = _SPEAK.match(self._head)
            if match is None and self._head.lstrip().startswith("<speak") and ">" not in self._head:
                if len(self._head) > self._max:
                    raise SsmlError("the <speak> tag is longer than a sentence may be")
                return []
            self._root_seen = True
            text, self._head = self._head, ""
            if match is not None:
                self._open = match.group(0).strip()
                text = text[match.end() :]
        for char in text:
            self._read(char)
        done, self._done = self._done, []
        return done

    def flush(self) -> str:
        """What is held, as a document, if no tag or element is open; else "" (it waits for the
        next place it can be cut: a flush never splits a tag or an element)."""
        if not self._root_seen or self._tag or self._depth > 0:
            return ""
        return self._take()

    def finish(self) -> str:
        if not self._root_seen:
            self.add("")
        if self._tag:
            raise SsmlError(f"the text ends inside a tag: {''.join(self._tag)[:40]!r}")
        return self._take()

    def _take(self) -> str:
        body = "".join(self._buffer)
        self._buffer, self._size, self._end_pending = [], 0, False
        if body.rstrip().endswith("</speak>"):
            body = body.rstrip()[: -len("</speak>")]
        if not body.strip():
            return ""
        return f"{self._open}{body}</speak>"

    def _cut(self) -> None:
        piece = self._take()
        if piece:
            self._done.append(piece)

    def _read(self, char: str) -> None:
        self._buffer.append(char)
        self._size += 1
        if self._tag:
            self._tag.append(char)
            if self._quote:
                if char == self._quote:
                    self._quote = ""
            elif char in "\"'":
                self._quote = char
            elif char == ">":
                self._end_tag("".join(self._tag))
            return
        if char == "<":
            self._tag = [char]
            self._end_pending = False
            return
        if self._depth == 0:
            if ((self._end_pending or self._size > self._max) and char.isspace()) or self._size > 2 * self._max:
                self._cut()  # a sentence's end, or a long text without one cut at a space (or anywhere)
                return
            self._end_pending = char in _ENDS
        if self._size > self._max and self._depth > 0:
            raise SsmlError(f"an element runs over {self._max} characters without closing: it cannot be cut")

    def _end_tag(self, tag: str) -> None:
        self._tag = []
        if tag.startswith(("<!", "<?")) or tag.endswith("/>"):
            return
        if tag.startswith("</"):
            self._depth -= 1
            if self._depth == 0 and re.match(r"</(s|p)\s*>", tag):
                self._cut()
            return
        self._depth += 1
