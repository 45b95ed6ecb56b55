"""Converters into what quantscope measures: ``phases`` (a Hugging Face causal-LM export ->
the prefill and decode graphs, :mod:`quantscope.model.hf_phases`) and ``images`` (a folder
of images -> tensor data by a declared preprocessing, :mod:`quantscope.tasks.pixels`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantscope.cli.numbers import positive_int
from quantscope.cli.options import add_input_shape, command, model_parent
from quantscope.cli.types import (
    file_stem,
    input_spec,
    output_file,
    run_folder,
    tokenizer_spec,
)

RUN_PHASES = "quantscope run {prefill} --data stdlib-docs --target hailo10h --out {out}"
"""The run a converted pair is given next (the --help example and the ``next:`` line)."""


def add_phases(sub: argparse._SubParsersAction, summary: str) -> None:
    p = command(sub, "phases", summary,
                example="quantscope phases qwen/model.onnx --out qwen-phases\n"
                        + RUN_PHASES.format(prefill="qwen-phases/model.prefill.onnx",
                                            out="qwen-run"),
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
    print("next: " + RUN_PHASES.format(prefill=done.prefill, out="W"))
    return 0



def add_images(sub: argparse._SubParsersAction, summary: str) -> None:
    p = command(sub, "images", summary, parents=(model_parent(option=True),),
                example="quantscope images calib/ --model yolov8n.onnx --pixels "
                        "scale=255,resize=letterbox --out calib.npz\n"
                        "quantscope run yolov8n.onnx --data calib.npz --target hailo8 "
                        "--out W",
                details="How the model was trained to see pixels is not in the ONNX file, "
                        "so it is declared, never guessed: --pixels is required. The "
                        "images (.jpg .jpeg .png .bmp .webp .tif, the folder's own, sorted "
                        "by name) are turned upright by their EXIF orientation, converted to "
                        "RGB (grey for a 1-channel input), resized bilinearly, normalised "
                        "and laid out as the model's one image input (channels first or "
                        "last, from its shape). NAME.pixels.json beside the .npz records "
                        "the files and the preprocessing; every command given the .npz "
                        "says it. The folder is only read.")
    p.add_argument("folder", type=input_spec("images folder"), metavar="FOLDER",
                   help="folder of images")
    p.add_argument("--pixels", required=True, type=_pixels, metavar="SPEC",
                   help="how a pixel (0..255) becomes an input value, comma-separated: "
                        "scale=S (divide first), mean=M, std=D (then (x-M)/D; one value or "
                        "R/G/B), bgr, resize=stretch|letterbox|crop, pad=114, or raw. "
                        "E.g. scale=255 (YOLO), scale=255,mean=0.485/0.456/0.406,"
                        "std=0.229/0.224/0.225 (ImageNet), mean=127.5,std=128 (ArcFace)")
    add_input_shape(p, "the input's shape where its height and width are symbolic, e.g. "
                       "images=1x3x640x640")
    p.add_argument("--limit", type=positive_int, metavar="N",
                   help="the first N images by name (default: all)")
    p.add_argument("--out", required=True, type=output_file, metavar="FILE.npz",
                   help="the tensor data to write (.npz; NAME.pixels.json beside it)")


def _pixels(text: str) -> object:
    """``--pixels`` (:func:`quantscope.tasks.pixels.parse_pixels`), checked while parsing."""
    from quantscope.tasks.pixels import parse_pixels
    from quantscope.types import QuantscopeError

    try:
        return parse_pixels(text)
    except QuantscopeError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--pixels ")) from None


def cmd_images(args: argparse.Namespace) -> int:
    import numpy as np

    from quantscope.model.shapes import given_shapes
    from quantscope.serde import json_writer, write_atomic_set
    from quantscope.stages import open_model
    from quantscope.tasks.pixels import images_to_arrays, sidecar
    from quantscope.types import QuantscopeError

    out = Path(args.out)
    if out.suffix.lower() != ".npz":
        raise QuantscopeError(f"--out '{out}' is not a .npz file: name it NAME.npz")
    model = open_model(args.model)
    shapes = given_shapes(model, None, tuple(args.input_shape)) if args.input_shape else None
    folder = Path(args.folder)
    made = images_to_arrays(folder, model, args.pixels, shapes=shapes, limit=args.limit,
                            show=True)
    record = made.record(folder)
    written = write_atomic_set([
        (out, lambda f: np.savez(f, **made.arrays)),
        (sidecar(out), json_writer(record))])
    print(made.said(folder))
    for path in written:
        print(f"wrote {path}")
    print(f"next: quantscope run {args.model} --data {out} --target TARGET --out W")
    return 0
