"""phases: a Hugging Face causal-LM export -> the prefill and decode graphs quantscope
measures (:mod:`quantscope.model.hf_phases`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantscope.cli.options import command
from quantscope.cli.types import file_stem, input_spec, run_folder, tokenizer_spec


def add_phases(sub: argparse._SubParsersAction, summary: str) -> None:
    p = command(sub, "phases", summary,
                example="quantscope phases qwen/model.onnx --out qwen-phases\n"
                        "quantscope run qwen-phases/model.prefill.onnx --data stdlib-docs "
                        "--target hailo10h",
                details="The export: input_ids, attention_mask [, position_ids, "
                        "cache_position], past_key_values.{i}.key|value -> logits, "
                        "present.{i}.key|value (torch.onnx.export of a *ForCausalLM with its "
                        "cache, or optimum's decoder_with_past_model.onnx). The mask and "
                        "positions are computed in the graphs (all ones, from the past "
                        "length); node and weight names are kept. The export is only read.")
    p.add_argument("model", type=input_spec("model", folder=False), metavar="EXPORT",
                   help="the causal-LM export (.onnx, its .data beside it)")
    p.add_argument("--out", dest="folder", required=True, type=run_folder, metavar="DIR",
                   help="folder for NAME.prefill.onnx, NAME.decode.onnx, NAME.tokenizer.json "
                        "(created if missing)")
    p.add_argument("--name", type=file_stem, help="NAME of the files (default: the export's "
                                                   "file name without .onnx)")
    p.add_argument("--tokenizer", type=tokenizer_spec,
                   help="its tokenizer.json or model folder (default: tokenizer.json beside "
                        "the export; without one, only token-id .npz data can be measured)")


def cmd_phases(args: argparse.Namespace) -> int:
    from quantscope.model.hf_phases import convert_export, tokenizer_beside

    export = Path(args.model)
    name = args.name or export.name.removesuffix(".onnx")
    tokenizer = tokenizer_beside(export, Path(args.tokenizer) if args.tokenizer else None)
    folder = Path(args.folder)
    done = convert_export(export, folder, name, tokenizer)
    print(done.said(export))
    for path in done.written:
        print(f"wrote {path}")
    if tokenizer is None:
        print(f"note: no tokenizer (none beside the export, no --tokenizer): text data needs "
              f"{folder / (name + '.tokenizer.json')}; token-id .npz data works without")
    print(f"next: quantscope run {done.prefill} --data stdlib-docs --target hailo10h")
    return 0

