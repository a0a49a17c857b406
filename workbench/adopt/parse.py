"""The top-level items of a C++/CUDA source for ``wb adopt``: directives, functions, declarations,
records and registration blocks, each with the namespaces around it and the names it defines.

This reads only what ``adopt`` needs: where each item at namespace scope starts and ends (by
matching braces and parentheses over real tokens), what it is called, its specifiers
(``__global__``, ``static``, ...), its template parameters and, for a function, its parameters
and body. Anything inside a body stays tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from workbench.adopt.lexer import Token, directive, tokenize

# Identifiers whose parenthesised argument list is not a declarator's.
ATTRIBUTES = frozenset(
    {
        "__launch_bounds__", "__align__", "alignas", "__attribute__", "__declspec", "noexcept",
        "decltype", "throw", "sizeof", "requires", "__maxnreg__", "__cluster_dims__",
    }
)  # fmt: skip
RECORD_KEYWORDS = frozenset({"struct", "class", "union", "enum"})
REGISTRATIONS = frozenset(
    {"TORCH_LIBRARY", "TORCH_LIBRARY_FRAGMENT", "TORCH_LIBRARY_IMPL", "PYBIND11_MODULE"}
)
_MACRO = re.compile(r"[A-Z][A-Z0-9_]*")
_TRAILING = frozenset({")", "const", "noexcept", "override", "final", "mutable", "volatile"})


class ParseError(ValueError):
    """A construct the top-level reader cannot place (unbalanced braces, a stray token)."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


@dataclass
class Item:
    kind: str  # "pp", "function", "declaration", "record", "registration"
    tokens: list[Token]
    scope: tuple[str, ...]  # the opening text of each enclosing namespace / extern "C" block
    names: tuple[str, ...] = ()  # what it defines
    specifiers: frozenset[str] = frozenset()  # identifiers before its name (__global__, static)
    template: list[Token] | None = None  # the tokens between template's < and >
    params: list[Token] | None = None  # a function's parameter tokens (inside the parentheses)
    body: list[Token] | None = None  # a function's body tokens (inside the braces)
    if_depth: int = 0  # how many #if blocks enclose it
    lead: int = 0  # offset where the text before it (its comments) starts
    refs: frozenset[str] = field(default_factory=frozenset)

    @property
    def line(self) -> int:
        return self.tokens[0].line

    @property
    def start(self) -> int:
        return self.tokens[0].start

    @property
    def end(self) -> int:
        return self.tokens[-1].end

    @property
    def name(self) -> str:
        return self.names[0] if self.names else ""


@dataclass
class Unit:
    """One source file: its path, text and items in order."""

    path: Path
    text: str
    items: list[Item]

    @property
    def is_cuda(self) -> bool:
        return self.path.suffix in (".cu", ".cuh")

    def where(self, line: int) -> str:
        return f"{self.path}:{line}"


def match(tokens: list[Token], i: int) -> int:
    """The index of the bracket closing the one at ``i`` ((, [ or {)."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = [pairs[tokens[i].text]]
    j = i + 1
    while j < len(tokens):
        t = tokens[j]
        if t.kind == "punct":
            if t.text in pairs:
                stack.append(pairs[t.text])
            elif t.text in (")", "]", "}"):
                if t.text != stack[-1]:
                    raise ParseError(f"'{t.text}' closes '{tokens[i].text}'", t.line)
                stack.pop()
                if not stack:
                    return j
        j += 1
    raise ParseError(f"'{tokens[i].text}' is never closed", tokens[i].line)


def match_angle(tokens: list[Token], i: int) -> int:
    """The index of the token closing the ``<`` at ``i`` (parentheses are skipped)."""
    depth = 0
    j = i
    while j < len(tokens):
        t = tokens[j]
        if t.text in ("(", "["):
            j = match(tokens, j) + 1
            continue
        if t.text == "<":
            depth += 1
        elif t.text in (">", ">>", ">>>"):
            depth -= len(t.text)
            if depth <= 0:
                return j
        elif t.text in (";", "{", "}"):
            break
        j += 1
    raise ParseError("'<' is never closed", tokens[i].line)


def split_commas(tokens: list[Token]) -> list[list[Token]]:
    """``tokens`` split at the commas outside any brackets (angle brackets of templates too,
    where a ``<`` follows an identifier)."""
    parts: list[list[Token]] = [[]]
    depth = 0
    angle = 0
    for k, t in enumerate(tokens):
        if t.text in ("(", "[", "{"):
            depth += 1
        elif t.text in (")", "]", "}"):
            depth -= 1
        elif t.text == "<" and k > 0 and tokens[k - 1].kind == "ident" and depth == 0:
            angle += 1
        elif t.text in (">", ">>") and angle > 0 and depth == 0:
            angle = max(0, angle - len(t.text))
        if t.text == "," and depth == 0 and angle == 0:
            parts.append([])
        else:
            parts[-1].append(t)
    return parts if parts != [[]] else []


def _declarator_names(toks: list[Token]) -> list[str]:
    """The names a declaration (without its initialisers' insides) introduces."""
    names = []
    depth = 0
    first_paren = True
    for k, t in enumerate(toks):
        prev = toks[k - 1] if k > 0 else None
        if t.text in ("(", "[", "{"):
            if (
                t.text == "("
                and depth == 0
                and first_paren
                and prev is not None
                and prev.kind == "ident"
                and prev.text not in ATTRIBUTES
            ):
                names.append(prev.text)
                first_paren = False
            elif t.text != "(" and depth == 0 and prev is not None and prev.kind == "ident":
                names.append(prev.text)
            depth += 1
        elif t.text in (")", "]", "}"):
            depth -= 1
        elif depth == 0 and t.text in ("=", ",", ";") and prev is not None and prev.kind == "ident":
            names.append(prev.text)
    return list(dict.fromkeys(names))


def _record_names(toks: list[Token], brace: int, close: int) -> list[str]:
    k = 0
    while k < brace and toks[k].text not in RECORD_KEYWORDS:
        k += 1
    names = []
    j = k + 1
    while j < brace:  # the record's own name: the last identifier before { or :
        t = toks[j]
        if t.text in ("(", "["):
            j = match(toks, j) + 1
            continue
        if t.text == ":":
            break
        if t.kind == "ident" and t.text not in ("class", "struct", "final", *ATTRIBUTES):
            names = [t.text]
        j += 1
    if toks[k].text == "enum":  # its enumerators are names of the scope around it
        body = toks[brace + 1 : close]
        for part in split_commas(body):
            if part and part[0].kind == "ident":
                names.append(part[0].text)
    tail = toks[close + 1 :]
    names += _declarator_names(tail)
    return names


def _function_parts(toks: list[Token], brace: int) -> tuple[int, list[str]]:
    """(index of the parameter list's '(', [name]) of a function whose body opens at brace."""
    best = name_at = -1
    k = 0
    while k < brace:
        t = toks[k]
        if t.text == "(":
            close = match(toks, k)
            at = k - 1
            if at > 0 and toks[at].text in (">", ">>"):  # f<T>(...): an explicit specialisation
                depth = 0
                while at > 0:
                    depth += len(toks[at].text) if toks[at].text in (">", ">>") else 0
                    depth -= 1 if toks[at].text == "<" else 0
                    at -= 1
                    if depth == 0:
                        break
            prev = toks[at] if at >= 0 else None
            if prev is not None and prev.kind == "ident" and prev.text not in ATTRIBUTES:
                best = k
                name_at = at
            k = close + 1
            continue
        if t.text == "[":
            k = match(toks, k) + 1
            continue
        k += 1
    if best < 0:
        raise ParseError("a body that follows no parameter list", toks[brace].line)
    return best, [toks[name_at].text]


def _template_prefix(toks: list[Token]) -> tuple[list[Token] | None, int]:
    """The parameter tokens of a leading ``template <...>`` and the index after it."""
    if not toks or toks[0].text != "template" or len(toks) < 2 or toks[1].text != "<":
        return None, 0
    close = match_angle(toks, 1)
    return toks[2:close], close + 1


def _macro_call(tokens: list[Token], i: int) -> int | None:
    """The end of ``NAME(...)`` at ``i`` when it stands alone: a macro invoked at namespace scope
    with no ';' after it (``WB_INSTANTIATE(...)``), the next token on a later line."""
    t = tokens[i]
    if t.kind != "ident" or not _MACRO.fullmatch(t.text) or t.text in REGISTRATIONS:
        return None
    if i + 1 >= len(tokens) or tokens[i + 1].text != "(":
        return None
    close = match(tokens, i + 1)
    if close + 1 >= len(tokens):
        return close + 1
    nxt = tokens[close + 1]
    if nxt.kind == "pp" or nxt.text == "}":
        return close + 1
    if nxt.line > tokens[close].line and nxt.text not in (";", "{", ":", "=", ",", "->"):
        return close + 1
    return None


_OPENS = frozenset({"if", "ifdef", "ifndef"})
_BRANCHES = frozenset({"else", "elif", "elifdef", "elifndef"})


def _group(tokens: list[Token], j: int) -> tuple[int, int]:
    """(index of the directive that ends the first branch, index of the matching #endif) of the
    conditional group that the directive at ``j`` opens."""
    depth, first = 0, -1
    for k in range(j + 1, len(tokens)):
        if tokens[k].kind != "pp":
            continue
        name = directive(tokens[k])[0]
        if name in _OPENS:
            depth += 1
        elif name == "endif" and depth > 0:
            depth -= 1
        elif name == "endif":
            return (k if first < 0 else first), k
        elif name in _BRANCHES and depth == 0 and first < 0:
            first = k
    raise ParseError(f"{tokens[j].text.strip()} with no #endif", tokens[j].line)


def _statement(tokens: list[Token], i: int) -> tuple[int, str, int]:
    """(end index, kind, index of the body's '{' or -1) of the statement starting at ``i``.

    A conditional group (#if ... #endif) inside the statement belongs to it: its first branch is
    read as the statement's tokens and the others are skipped, and a statement that ends inside
    the group ends after its #endif (``constexpr int k =`` then ``#if A`` ``1;`` ``#else`` ``2;``
    ``#endif``). Other directives inside it (#pragma, #define) are part of its text.
    """
    call = _macro_call(tokens, i)
    if call is not None:
        return call, "declaration", -1
    groups: list[tuple[int, int]] = []  # (first branch's end, #endif) of the open groups

    def past(end: int) -> int:  # a statement that ends inside a group ends after its #endif
        return max(end, groups[0][1] + 1) if groups else end

    j = i
    seen_eq = seen_paren = seen_record = False
    while j < len(tokens):
        while groups and j >= groups[-1][0]:  # past a first branch: skip the group's others
            j = max(j, groups.pop()[1] + 1)
        if j >= len(tokens):
            break
        t = tokens[j]
        if t.kind == "pp":
            name = directive(t)[0]
            if name in _BRANCHES or name == "endif":  # a group the statement did not open
                raise ParseError(f"a directive inside a declaration: {t.text.strip()}", t.line)
            if name in _OPENS:
                groups.append(_group(tokens, j))
            j += 1
            continue
        if t.text == ";":
            return past(j + 1), "declaration", -1
        if t.text == "=":
            seen_eq = True
        elif t.text in RECORD_KEYWORDS:
            seen_record = True
        elif t.text in ("(", "["):
            seen_paren = seen_paren or t.text == "("
            j = match(tokens, j) + 1
            continue
        elif t.text == "<" and j > i and tokens[j - 1].text == "template":
            j = match_angle(tokens, j) + 1
            continue
        elif t.text == "}":
            raise ParseError("'}' closes nothing", t.line)
        elif t.text == "{":
            close = match(tokens, j)
            before = tokens[j - 1].text if j > i else ""
            function = seen_paren and not seen_eq and (not seen_record or before in _TRAILING)
            if function or (seen_paren and before == ")" and not seen_eq):
                return past(close + 1), "function", j
            j = close + 1
            if not seen_eq and seen_record:
                while j < len(tokens) and tokens[j].text != ";":
                    j = match(tokens, j) + 1 if tokens[j].text in "([{" else j + 1
                return past(j + 1), "record", -1
            continue
        j += 1
    raise ParseError("a declaration with no end (';' or a body)", tokens[i].line)


def _item(
    tokens: list[Token], i: int, end: int, kind: str, brace: int, scope: tuple[str, ...]
) -> Item:
    toks = tokens[i:end]
    template, head = _template_prefix(toks)
    rest = toks[head:]
    item = Item(kind, toks, scope, template=template)
    if kind == "function":
        b = brace - i - head
        paren, names = _function_parts(rest, b)
        item.names = tuple(names)
        item.params = rest[paren + 1 : match(rest, paren)]
        item.body = rest[b + 1 : -1]
        item.specifiers = frozenset(t.text for t in rest[: paren - 1] if t.kind == "ident")
        if names[0] in REGISTRATIONS:
            item.kind = "registration"
    elif kind == "record":
        b = next(k for k, t in enumerate(rest) if t.text == "{")
        item.names = tuple(_record_names(rest, b, match(rest, b)))
        item.specifiers = frozenset(t.text for t in rest[:b] if t.kind == "ident")
    else:
        item.names = tuple(_declarator_names(rest))
        if rest and rest[0].text in ("using",) and len(rest) > 1:
            item.names = (rest[1].text,) if rest[2:3] and rest[2].text == "=" else item.names
        stop = next((k for k, t in enumerate(rest) if t.text in ("=", "(", "[", "{")), len(rest))
        item.specifiers = frozenset(t.text for t in rest[:stop] if t.kind == "ident")
    item.refs = frozenset(t.text for t in toks if t.kind == "ident")
    return item


def parse(path: Path, text: str) -> Unit:
    """The items of ``text`` (the file ``path``) at namespace scope."""
    tokens = tokenize(text)
    items: list[Item] = []
    scope: list[str] = []
    if_depth = 0
    i = 0
    lead = 0
    while i < len(tokens):
        t = tokens[i]
        if t.kind == "pp":
            name, _ = directive(t)
            if name == "endif":
                if_depth -= 1
            item = Item("pp", [t], tuple(scope), names=(name,), if_depth=if_depth, lead=lead)
            if name == "define":
                _, rest = directive(t)
                macro = rest.split("(", 1)[0].split()[0] if rest else ""
                item.names = ("define", macro)
            items.append(item)
            if name in _OPENS:
                if_depth += 1
            lead = t.end
            i += 1
            continue
        if t.text == "}":
            if not scope:
                raise ParseError("'}' closes nothing", t.line)
            scope.pop()
            i += 1
            if i < len(tokens) and tokens[i].text == ";":
                i += 1
            lead = tokens[i - 1].end
            continue
        if t.text == ";":
            i += 1
            continue
        opener = _opener(tokens, i)
        if opener is not None:
            scope.append(text[t.start : tokens[opener].end])
            i = opener + 1
            lead = tokens[opener].end
            continue
        end, kind, brace = _statement(tokens, i)
        item = _item(tokens, i, end, kind, brace, tuple(scope))
        item.if_depth = if_depth
        item.lead = lead
        items.append(item)
        lead = tokens[end - 1].end
        i = end
    if scope:
        raise ParseError(f"'{scope[-1]}' is never closed", tokens[-1].line)
    return Unit(path, text, items)


def _opener(tokens: list[Token], i: int) -> int | None:
    """The index of the '{' when tokens[i] opens a namespace or an extern "C" block."""
    j = i
    if tokens[j].text == "inline" and j + 1 < len(tokens) and tokens[j + 1].text == "namespace":
        j += 1
    if tokens[j].text == "namespace":
        k = j + 1
        while k < len(tokens) and (tokens[k].kind == "ident" or tokens[k].text == "::"):
            k += 1
        return k if k < len(tokens) and tokens[k].text == "{" else None
    if (
        tokens[j].text == "extern"
        and j + 2 < len(tokens)
        and tokens[j + 1].kind == "string"
        and tokens[j + 2].text == "{"
    ):
        return j + 2
    return None
