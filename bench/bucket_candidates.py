"""Write the candidates file ``quantscope buckets`` chooses from, as docs/benchmarks.md used it.

    PYTHONPATH=src python bench/bucket_candidates.py --short rs.onnx --short-stats rs.npz \
        --long ts.onnx --long-stats ts.npz --target hailo10h --out-dir cands/

For the short and middle lengths, on the ``--short`` model (the rewrites that keep the
residual stream whole: outscale, peel, headsplit, rowscale):

- ``all16``: every group at a16_w16 except those ``check --seq-len AT`` refuses (demoted to
  a8_w8 until none is; at these lengths that is the attention: ``hailo.attention_16bit``);
- ``noqk``, ``noqkv``, ``noqkvao``, ``onlyup``, ``nolin``: the same with more Linear families
  back at a8_w8 (Q/K; + V; + attention output; all but the FFN up-projection; every Linear).

Both come from the product (``quantscope plan --max-legal --variants``,
:mod:`quantscope.plan.candidates`; the families are read from the graph,
:mod:`quantscope.model.families`); this script only adds the long model's ``residual``
plan and writes the candidates file.

For the longest length, on the ``--long`` model (``tokensplit --linears``): ``residual`` =
every residual-stream, skip-branch and ``/peel`` chunk group (``Add``, ``LayerNormalization``,
``Mul`` named ``…/tok<i>``) at a16_w16, everything else a8_w8 (the 1.017× plan of minilm-l6).

``quantscope buckets`` checks each candidate's legality at every length it considers, so a
candidate that is illegal somewhere is simply not chosen there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from quantscope import stages
from quantscope.model.groups import find_groups
from quantscope.model.shapes import given_shapes
from quantscope.plan.candidates import max_legal, variants
from quantscope.serde import write_plan
from quantscope.targets import load_target
from quantscope.types import Plan, Precision


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--short", required=True, help="model for the short lengths (residual whole)")
    p.add_argument("--short-stats", required=True)
    p.add_argument("--long", required=True, help="tokensplit --linears model for the longest")
    p.add_argument("--long-stats", required=True)
    p.add_argument("--target", default="hailo10h")
    p.add_argument("--at", type=int, default=128, help="length the max-legal plan is made at")
    p.add_argument("--out-dir", required=True)
    args = p.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    short = stages.open_model(args.short)
    target = load_target(args.target)
    shapes = given_shapes(short, args.at, ())
    made = max_legal(short, target, shapes)  # the product's rule-made candidates
    more, notes = variants(short, target, shapes, made)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    base = made.plan
    plans = {"all16": base, **{c.name: c.plan for c in more}}
    long = stages.open_model(args.long)
    residual = {g.name: Precision.A16_W16 for g in find_groups(long).groups
                if "/tok" in g.name and g.op_type in ("Add", "LayerNormalization", "Mul")}
    plans_long = {"residual": Plan(default=Precision.A8_W8,
                                   overrides=tuple(sorted(residual.items())), target=args.target)}
    entries = []

    def rel(path: str) -> str:
        return os.path.relpath(Path(path).resolve(), out.resolve())

    for name, plan in plans.items():
        write_plan(out / f"{name}.json", plan)
        entries.append({"name": name, "model": rel(args.short), "stats": rel(args.short_stats),
                        "plan": f"{name}.json"})
    for name, plan in plans_long.items():
        write_plan(out / f"long_{name}.json", plan)
        entries.append({"name": f"long-{name}", "model": rel(args.long),
                        "stats": rel(args.long_stats), "plan": f"long_{name}.json"})
    (out / "cands.json").write_text(json.dumps({"candidates": entries}, indent=1))
    print(f"wrote {out / 'cands.json'}: {len(entries)} candidates "
          f"(all16 demotes {len(base.overrides)} groups at {args.at} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
