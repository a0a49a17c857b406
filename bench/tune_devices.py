"""``wb tune --devices all`` against one GPU: the wall time of one tune on every GPU of the host.

In one run on one host: load the bundled family of ``--op`` (default ``scale:float32``, whose
space has 18 valid points; ``matmul:bfloat16`` has 15), tune it once to build and cache every
variant (not timed), then once on all GPUs (the "cold" run: it starts the library's workers),
then ``--repeats`` times on one GPU and on all of them, alternating, with ``save=False``. Each
tune's wall time counts checking and timing (the builds are cached by then: both runs pay the
same cache lookups). Prints the median of each, their ratio (goal:
<= 0.6 on 2 GPUs), each run's winners, and whether the all-GPU winner of each size is the
one-GPU run's or within its noise band. Writes ``tune_devices.md`` and ``tune_devices.json``
into ``--out`` (default ``$OUT`` or .).

Usage: python -m bench tune_devices [--op scale:float32] [--repeats 2] [--rounds 3] [--sizes L,L]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from bench.common import environment, out_dir, parser, write_text


def main(argv: list[str]) -> int:
    p: argparse.ArgumentParser = parser(__name__, __doc__)
    p.add_argument("--op", default="scale:float32", help="OP:DTYPE of a family with a space")
    p.add_argument("--repeats", type=int, default=2, help="tunes of each kind (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="timing rounds per tune (default 3)")
    p.add_argument("--sizes", help="comma-separated size labels of the sweep (default: all)")
    p.add_argument("--cache", help="the cache folder (default: a new temporary one)")
    p.add_argument("--out", help="where tune_devices.md and .json go (default $OUT or .)")
    p.add_argument("--playoff", type=float, help="also time tunes on all GPUs with this "
                   "WB_TUNE_PLAYOFF (0.05 say)")  # fmt: skip
    args = p.parse_args(argv)
    os.environ["WB_CACHE_DIR"] = args.cache or tempfile.mkdtemp(prefix="wb-tune-devices-")
    os.environ.setdefault("WB_QUIET", "1")

    import torch

    import workbench

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        print(f"python -m bench tune_devices: needs 2 GPUs or more, this host has {gpus}",
              file=sys.stderr)  # fmt: skip
        return 1
    op, dtype = args.op.split(":")
    lib = workbench.load(families=[op])
    kwargs: dict[str, Any] = {"lib": lib, "device": "cuda", "dtype": dtype, "save": False}
    if args.sizes:
        kwargs["sizes"] = args.sizes.split(",")
    t = time.perf_counter()
    first = workbench.tune(op, rounds=1, **kwargs)  # builds and caches every variant
    build_s = time.perf_counter() - t
    # The first tune on all GPUs starts the library's workers (CUDA, the family, each variant
    # opened in each): timed on its own as "cold"; the repeats find them started.
    t = time.perf_counter()
    cold = workbench.tune(op, rounds=args.rounds, devices="all", **kwargs)
    cold_s = time.perf_counter() - t
    kinds: list[tuple[str, str | None, str]] = [("one", None, "0"), ("all", "all", "0")]
    if args.playoff:
        kinds.append(("playoff", "all", str(args.playoff)))
    runs: dict[str, list[Any]] = {k: [] for k, _, _ in kinds}
    walls: dict[str, list[float]] = {k: [] for k, _, _ in kinds}
    for _ in range(args.repeats):
        for kind, devices, playoff in kinds:
            os.environ["WB_TUNE_PLAYOFF"] = playoff
            t = time.perf_counter()
            r = workbench.tune(op, rounds=args.rounds, devices=devices, **kwargs)
            walls[kind].append(time.perf_counter() - t)
            runs[kind].append(r)
    os.environ.pop("WB_TUNE_PLAYOFF", None)
    one_s, all_s = (statistics.median(walls[k]) for k in ("one", "all"))
    one, every = runs["one"][-1], runs["all"][-1]
    # The control: the first tune (one GPU, one round) against the same one-GPU run, so that
    # the record shows how far two one-GPU runs agree at each size.
    others = [("one GPU, first tune", first)]
    others += [(k, runs[k][-1]) for k, _, _ in kinds if k != "one"]
    agree = []
    for kind, other in others:
        for size in one.sizes:
            mine = other.winners[sum(1 for b in other.bounds if size.numel >= b)]
            theirs = one.winners[sum(1 for b in one.bounds if size.numel >= b)]
            verdict = "same" if mine == theirs else size.verdict(mine)
            agree.append(f"{kind}, {size.label}: {mine} ({verdict} in the one-GPU run)")
    env = environment()
    n = len(first.variants)
    lines = [
        f"# wb tune --devices all on {gpus} GPUs against one: {op} {dtype}, {n} variants",
        "",
        "Regenerate: `python -m bench tune_devices` on a host with 2 GPUs or more.",
        "",
        env.line("cuda"),
        "",
        f"Build of every variant (first tune, not timed below): {build_s:.1f} s.",
        "",
        f"| run | devices | wall s (median of {args.repeats}) | each | check s | time s | rounds |",
        "|---|---|---|---|---|---|---|",
        _row("one GPU", "cuda (current)", one_s, walls["one"], one),
        _row("all GPUs", ", ".join(every.devices), all_s, walls["all"], every),
        _row("all GPUs, cold", ", ".join(cold.devices), cold_s, [cold_s], cold),
        *(
            [
                _row(
                    f"all GPUs, playoff {args.playoff}",
                    ", ".join(every.devices),
                    statistics.median(walls["playoff"]),
                    walls["playoff"],
                    runs["playoff"][-1],
                )
            ]
            if args.playoff
            else []
        ),
        "",
        f"**Ratio all / one: {all_s / one_s:.2f}** (goal <= 0.6 on 2 GPUs); the first tune on "
        f"all GPUs, which starts the workers: {cold_s / one_s:.2f}.",
        *(
            [
                f"With the playoff (WB_TUNE_PLAYOFF={args.playoff}): "
                f"{statistics.median(walls['playoff']) / one_s:.2f}, of which the playoff "
                f"{runs['playoff'][-1].phases.get('playoff', 0.0):.1f} s in the last run."
            ]
            if args.playoff
            else []
        ),
        "",
        "Winner of each size, against the one-GPU run (same, noise, or slower beyond its band):",
        "",
        *(f"- {a}" for a in agree),
        "",
        "## one GPU",
        "",
        "```",
        str(one),
        "```",
        "",
        "## all GPUs",
        "",
        "```",
        str(every),
        "```",
    ]
    out = out_dir(args.out)
    write_text(out / "tune_devices.md", "\n".join(lines))
    record = {
        "env": env.to_dict(),
        "op": op,
        "dtype": dtype,
        "variants": n,
        "gpus": gpus,
        "walls": walls,
        "playoff": args.playoff,
        "ratio": all_s / one_s,
        "cold": cold_s,
        "one": one.to_dict(),
        "all": every.to_dict(),
    }
    (out / "tune_devices.json").write_text(json.dumps(record, indent=1))
    print("\n".join(lines[: lines.index("## one GPU")]))
    return 0


def _row(name: str, devices: str, median: float, walls: list[float], r: Any) -> str:
    each = ", ".join(f"{w:.1f}" for w in walls)
    check, timing = r.phases.get("check", 0.0), r.phases.get("time", 0.0)
    return (
        f"| {name} | {devices} | {median:.1f} | {each} | {check:.1f} | {timing:.1f} | "
        f"{r.rounds_done}/{r.rounds_asked} |"
    )
