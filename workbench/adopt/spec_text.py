"""``spec.py`` of an adopted family: one OpSpec per op, samples made from its schema.

The reference is a stub that raises until it is filled in, or a call of the Python function
the user named (``--reference [OP=]module:function``), imported when the check first runs.
Samples give every Tensor argument the same shape (the elementwise shapes of
``workbench.spec``), a float 0.5, an int 2, a bool True; the fake returns a tensor like the
first Tensor argument. Dtypes: float32, and float64 too where the host code dispatches
floating types: the tutorial extensions' kernels read float32 only.
"""

from __future__ import annotations

import re

_ARG = re.compile(r"^\s*(?P<type>.+?)\s+(?P<name>\w+)\s*(?:=\s*(?P<default>.+))?$")
_VALUES = {
    "float": "0.5",
    "Scalar": "0.5",
    "int": "2",
    "SymInt": "2",
    "bool": "True",
    "str": '""',
    "int[]": "[1]",
    "SymInt[]": "[1]",
    "float[]": "[0.5]",
}


def schema_args(schema: str) -> tuple[list[tuple[str, str]], str]:
    """([(type, name)], return text) of a schema; ``*`` (keyword-only marker) is dropped."""
    head, _, ret = schema.partition("->")
    inner = head[head.index("(") + 1 : head.rindex(")")]
    args, depth, cur = [], 0, ""
    for c in inner:
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        if c == "," and depth == 0:
            args.append(cur)
            cur = ""
        else:
            cur += c
    if cur.strip():
        args.append(cur)
    out = []
    for a in args:
        if a.strip() == "*":
            continue
        m = _ARG.match(a)
        if m:
            out.append((re.sub(r"\([^)]*\)", "", m.group("type")).strip(), m.group("name")))
    return out, ret.strip()


def _sample(args: list[tuple[str, str]]) -> str:
    parts = []
    for t, _ in args:
        base = t.rstrip("?")
        if base == "Tensor":
            parts.append("randn(shape, dtype, device, gen, strided=strided)")
        elif base == "Tensor[]":
            parts.append("[randn(shape, dtype, device, gen, strided=strided)]")
        else:
            parts.append(_VALUES.get(base, "None  # TODO: a value of type " + t))
    return ", ".join(parts) + ("," if len(parts) == 1 else "")


def _fake(args: list[tuple[str, str]], ret: str) -> str:
    first = next((n for t, n in args if t.rstrip("?") == "Tensor"), None)
    if ret in ("()", "") or first is None:
        return "None"
    # The first tensor's layout, as ATen's elementwise ops give it (a transposed input, a
    # transposed output); a kernel that writes a contiguous output passes the check's layout
    # test whatever the fake (workbench.verify.contract.layout).
    like = f"torch.empty_like({first})"
    if ret.startswith("("):  # a tuple of results
        return "(" + ", ".join([like] * (ret.count(",") + 1)) + ")"
    return like


def spec_py(
    name: str,
    ops: list[tuple[str, str, tuple[str, ...]]],
    references: dict[str, str],
    floating: bool,
    sources: str,
) -> str:
    """``ops``: (op, schema, devices); ``references``: op -> "module:function"."""
    dtypes = "(torch.float32, torch.float64)" if floating else "(torch.float32,)"
    out = [
        f'"""Spec of the {name} family, adopted by wb adopt from {sources}.\n\n'
        "Fill in each reference (plain PyTorch computing what the op computes), then run\n"
        f"`wb check {' '.join(op for op, _, _ in ops)}`. The samples and fakes below are read\n"
        "from the schemas: every Tensor argument gets one shape; adjust them where the op needs\n"
        "otherwise.\n"
        '"""\n\nfrom __future__ import annotations\n\nimport importlib\nfrom typing import Any\n\n'
        "import torch\n\nfrom workbench.spec import OpSpec, Sample, elementwise_shapes, randn\n\n"
        f"DTYPES = {dtypes}\n",
    ]
    entries = []
    for op, schema, devices in ops:
        fn = re.sub(r"\W", "_", op)
        args, ret = schema_args(schema)
        params = ", ".join(f"{n}: Any" for _, n in args)
        call = ", ".join(n for _, n in args)
        out.append(f"\n\n# {schema}\ndef {fn}_reference({params}) -> Any:\n")
        target = references.get(op)
        if target is None:
            out.append(
                f'    raise NotImplementedError(\n        "{name}/spec.py: write the reference of '
                f'{op} in plain PyTorch"\n    )\n'
            )
        else:
            module, _, attr = target.partition(":")
            out.append(f'    fn = getattr(importlib.import_module("{module}"), "{attr}")\n')
            out.append(f"    return fn({call})\n")
        out.append(
            f"\n\ndef {fn}_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator)"
            " -> list[Sample]:\n"
            "    return [\n"
            f"        Sample(({_sample(args)}), label)\n"
            "        for label, shape, strided in elementwise_shapes()\n"
            "    ]\n"
        )
        out.append(f"\n\ndef {fn}_fake({params}) -> Any:\n    return {_fake(args, ret)}\n")
        entries.append(
            f"    OpSpec(\n        name={op!r},\n        reference={fn}_reference,\n"
            f"        samples={fn}_samples,\n        fake={fn}_fake,\n        dtypes=DTYPES,\n"
            f"        devices={devices!r},\n    ),\n"
        )
    out.append("\n\nOPS = [\n" + "".join(entries) + "]\n")
    return "".join(out)
