"""A kernel's signature as its torch-free launcher spells it: the template parameters, the
parameter types (named p0, p1, ...), and the parameters a launcher cannot spell (refused)."""

from __future__ import annotations

import re

from workbench.adopt.lexer import Token
from workbench.adopt.parse import Item, Unit, split_commas
from workbench.adopt.registration import Refusal

# Kernel parameter types a torch-free launcher can spell (besides template parameters).
_SCALARS = frozenset(
    {
        "const", "volatile", "__restrict__", "__restrict", "unsigned", "signed", "long", "short",
        "char", "int", "float", "double", "bool", "void", "size_t", "ptrdiff_t", "int8_t",
        "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t",
        "intptr_t", "uintptr_t", "dim3",
    }
)  # fmt: skip
_VECTOR = re.compile(r"(?:u?char|u?short|u?int|u?long|u?longlong|float|double)[1-4]")


def template_params(it: Item) -> list[tuple[str, str]]:
    """(kind, name) of each template parameter: kind "type" or "value"."""
    out = []
    for part in split_commas(it.template or []):
        texts = [t.text for t in part]
        if "=" in texts:
            part = part[: texts.index("=")]
            texts = texts[: len(part)]
        if "..." in texts or "template" in texts or not part or part[-1].kind != "ident":
            out.append(("bad", " ".join(texts)))
        else:
            out.append(("type" if texts[0] in ("typename", "class") else "value", part[-1].text))
    return out


def kernel_param_refusals(u: Unit, it: Item) -> list[Refusal]:
    tparams = {n for k, n in template_params(it)}
    out = []
    for kind, name in template_params(it):
        if kind == "bad":
            out.append(
                Refusal(
                    u.where(it.line),
                    f"template parameter '{name}' of kernel {it.name!r}",
                    "adopt names type and value parameters only "
                    "(no packs or template templates): launch it by hand",
                )
            )
    for part in split_commas(it.params or []):
        texts = [t.text for t in part if t.kind == "ident"]
        bad = [
            x for x in texts[:-1] if x not in _SCALARS and x not in tparams
            and not _VECTOR.fullmatch(x)
        ]  # fmt: skip
        if bad or any(t.text in ("(", "[", "&", "::") for t in part):
            out.append(
                Refusal(
                    u.where(part[0].line if part else it.line),
                    f"kernel {it.name!r} parameter '{' '.join(t.text for t in part)}'",
                    "a launcher of a device-only TU spells the kernel's parameter types "
                    "without its source: use scalars, pointers to scalars and template "
                    "parameters, or write the launcher by hand",
                )
            )
    return out


def param_decls(it: Item) -> list[tuple[str, str]]:
    """(type text, name) of each parameter of a kernel, names made p0, p1, ..."""
    out = []
    for k, part in enumerate(split_commas(it.params or [])):
        toks: list[Token] = list(part)
        if "=" in [t.text for t in toks]:
            toks = toks[: [t.text for t in toks].index("=")]
        if len(toks) > 1 and toks[-1].kind == "ident" and toks[-1].text not in _SCALARS:
            toks = toks[:-1]
        if [t.text for t in toks] == ["void"]:
            return []
        # __restrict__ says nothing to a launcher, and its pointer would not convert to void*.
        kept = [t.text for t in toks if t.text not in ("__restrict__", "__restrict")]
        out.append((" ".join(kept).replace(" *", "*"), f"p{k}"))
    return out
