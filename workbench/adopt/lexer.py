"""A C/C++/CUDA lexer for ``wb adopt``: tokens with their line and byte span.

Comments are skipped; string and character literals (prefixes and raw strings included) are one
token each; a preprocessor directive (with its ``\\``-continued lines) is one token of kind
``pp``; ``<<<`` and ``>>>`` (CUDA's launch brackets) are tokens of their own. The spans index
the source text, so a caller can cut the original text (its comments and layout kept) around
the tokens it understood.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class Token(NamedTuple):
    kind: str  # "ident", "number", "string", "char", "punct" or "pp"
    text: str
    line: int  # 1-based line of its first character
    start: int  # offset in the source text
    end: int


class LexError(ValueError):
    """The text cannot be split into tokens (an unterminated comment or literal)."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


_PUNCT = sorted(
    [
        "<<<", ">>>", "<<=", ">>=", "...", "->*", "::", "->", "<<", ">>", "<=", ">=", "==", "!=",
        "&&", "||", "++", "--", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", ".*", "##",
    ],
    key=len,
    reverse=True,
)  # fmt: skip
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_NUMBER = re.compile(r"\.?[0-9](?:[eEpP][+-]|[A-Za-z0-9_.']|)*")
_PREFIX = re.compile(r"(?:u8|u|U|L)?R?(?=[\"'])")
_RAW = re.compile(r'(?:u8|u|U|L)?R"([^()\\ \t\n]{0,16})\(')


def _skip_quoted(text: str, i: int, quote: str, line: int) -> int:
    """The offset after the literal whose opening quote is at ``i``."""
    j = i + 1
    n = len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == quote:
            return j + 1
        if c == "\n":
            break
        j += 1
    what = "string" if quote == '"' else "character"
    raise LexError(f"unterminated {what} literal", line)


def _directive_end(text: str, i: int, line: int) -> int:
    """The offset of the newline that ends the directive starting at ``i`` (or the text's end)."""
    n = len(text)
    j = i
    while j < n:
        c = text[j]
        if c == "\\" and text.startswith("\n", j + 1):
            j += 2
        elif c == "\\" and text.startswith("\r\n", j + 1):
            j += 3
        elif text.startswith("/*", j):
            k = text.find("*/", j + 2)
            if k < 0:
                raise LexError("unterminated comment", line)
            j = k + 2
        elif text.startswith("//", j):
            k = text.find("\n", j)
            return n if k < 0 else k
        elif c == "\n":
            return j
        elif c in "\"'" and (j == i or not (text[j - 1].isalnum() or text[j - 1] == "_")):
            # an #include <a'b> has no quotes to match; quoted text in #define is a literal
            try:
                j = _skip_quoted(text, j, c, line)
            except LexError:
                j += 1
        else:
            j += 1
    return n


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text``; raises LexError (with the line) on an unterminated construct."""
    out: list[Token] = []
    i, n, line = 0, len(text), 1
    at_line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
            at_line_start = True
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if c == "\\" and text.startswith("\n", i + 1):  # a continued line outside a directive
            i += 2
            line += 1
            continue
        if text.startswith("//", i):
            k = text.find("\n", i)
            i = n if k < 0 else k
            continue
        if text.startswith("/*", i):
            k = text.find("*/", i + 2)
            if k < 0:
                raise LexError("unterminated comment", line)
            line += text.count("\n", i, k)
            i = k + 2
            continue
        start = i
        if c == "#" and at_line_start:
            end = _directive_end(text, i, line)
            out.append(Token("pp", text[start:end], line, start, end))
            line += text.count("\n", start, end)
            i = end
            continue
        at_line_start = False
        raw = _RAW.match(text, i)
        if raw:
            close = ")" + raw.group(1) + '"'
            k = text.find(close, raw.end())
            if k < 0:
                raise LexError("unterminated raw string literal", line)
            end = k + len(close)
            out.append(Token("string", text[start:end], line, start, end))
            line += text.count("\n", start, end)
            i = end
            continue
        prefix = _PREFIX.match(text, i)
        if prefix and (prefix.end() > i or c in "\"'"):
            q = text[prefix.end()]
            end = _skip_quoted(text, prefix.end(), q, line)
            out.append(Token("string" if q == '"' else "char", text[start:end], line, start, end))
            i = end
            continue
        m = _IDENT.match(text, i)
        if m:
            out.append(Token("ident", m.group(), line, start, m.end()))
            i = m.end()
            continue
        m = _NUMBER.match(text, i)
        if m:
            out.append(Token("number", m.group(), line, start, m.end()))
            i = m.end()
            continue
        for p in _PUNCT:
            if text.startswith(p, i):
                break
        else:
            p = c
        out.append(Token("punct", p, line, start, start + len(p)))
        i += len(p)
    return out


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "0": "\0", "r": "\r"}


def string_value(token: Token) -> str:
    """The characters of a string literal token (escapes of the usual kinds decoded)."""
    text = token.text
    raw = _RAW.match(text)
    if raw:
        return text[raw.end() : -len(raw.group(1)) - 2]
    body = text[text.index('"') + 1 : -1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def directive(token: Token) -> tuple[str, str]:
    """(name, rest) of a preprocessor token: ``#  include <x>`` -> ("include", "<x>")."""
    body = re.sub(r"\\\r?\n", " ", token.text[1:])
    body = re.sub(r"/\*.*?\*/", " ", body, flags=re.S)
    body = re.sub(r"//.*", "", body).strip()
    m = _IDENT.match(body)
    if not m:
        return "", body
    return m.group(), body[m.end() :].strip()
