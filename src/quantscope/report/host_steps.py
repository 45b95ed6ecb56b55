"""What runs on the host beside the compiled model, for the verdict (``host_steps``): the
text prefixes, the lookups the target leaves to the host (the io rows' ``host_lookup``: one
fact, ``model/host_gather.py``) and the integer inputs fed as they are, per-token outputs
pooled and normalised, symbolic dims fixed. Split from :mod:`quantscope.report.summary`
(which re-exports it) when that module passed 600 lines."""

from __future__ import annotations

from typing import Any

INT_TYPES = {6: "int32", 7: "int64", 2: "uint8", 3: "int8", 12: "uint32", 13: "uint64",
             9: "bool"}


def _pixels_step(pixels: str, inputs: list[dict[str, Any]]) -> str:
    """Images made into the input as the data was: a float input is quantized from that
    tensor; an integer one (uint8, TF MoveNet's int32: the image input is the model's only
    input, ``quantscope images`` fills no other) takes the pixels as they are."""
    ints = [INT_TYPES[i["dtype"]] for i in inputs if i["dtype"] in INT_TYPES]
    if len(inputs) == 1 and ints:
        return (f"make each image the input as the measured data was made ({pixels}): the "
                f"device takes those {ints[0]} pixels as they are, not quantized")
    return (f"make each image the input as the measured data was made ({pixels}): the "
            "input's quantization (io_snippet.py) takes that float tensor, not the image's "
            "pixels")


def host_steps(inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], *,
               text: bool, seq_len: int | None, longest: int | None = None,
               pooled: bool | None = None, lookups: list[dict[str, Any]] | None = None,
               prefixes: dict[str, str] | None = None,
               shapes: dict[str, list[int]] | None = None,
               shapes_from_data: bool = False,
               measured_shapes: dict[str, list[int]] | None = None,
               pixels: str | None = None) -> list[str]:
    """What the host does around the compiled model. ``inputs``/``outputs``: name, dtype
    (ONNX elem type), dims (int, or str for a symbolic dim); ``seq_len``: the length the
    run checked at; ``longest``: the data's longest text (tokens), said when no length was
    given; ``pooled``: the task scored pooled embeddings (retrieval, similarity), else the
    per-token outputs were compared as they are (default: ``text``); ``lookups``: the
    ``host_lookup`` of the io rows (the lookups the target leaves to the host; None: the
    older wording, which cannot tell); ``prefixes``: the text prefixes the data was
    evaluated with (``query``, ``document``); ``shapes``: the ``--input-shape`` the run
    checked at (those inputs' dims as given; ``shapes_from_data``: taken from the data's
    sizes, no --input-shape given); ``measured_shapes``: the data's sizes of the inputs
    whose --input-shape differs from them (the figures are the data's size's); ``pixels``:
    how ``quantscope images`` made the data from images (its note), which the host repeats
    on each image before the input's quantization."""
    steps = [] if not pixels else [_pixels_step(pixels, inputs)]
    if prefixes and (prefixes.get("query") or prefixes.get("document")):
        steps.append(f"put {prefixes.get('query', '')!r} before every query and "
                     f"{prefixes.get('document', '')!r} before every document before "
                     "tokenizing, as the evaluation did")
    ints = [i for i in inputs if i["dtype"] in INT_TYPES]
    device = {x["indices"]: x["device_reads"] for x in lookups or () if x.get("device_reads")}
    looked_up = {x["indices"] for x in lookups or ()} - set(device)
    for x in lookups or ():
        shape = "x".join(str(d) for d in x["shape"])
        steps.append(f"look up {x['table']} [{shape}] {x['dtype']} ({x['megabytes']:,.1f} "
                     f"MB) by {x['indices']} on the host (the target keeps it outside the "
                     f"compiled graph): the compiled graph takes the rows as "
                     f"'{x['output']}' (io_snippet.py)")
    ints = [i for i in ints if i["name"] not in looked_up]
    if ints and lookups is not None:
        names = ", ".join(i["name"] for i in ints)
        types = "/".join(sorted({INT_TYPES[i["dtype"]] for i in ints}))
        what = " (from the tokenizer)" if text else ""
        steps.append(f"feed {names}{what} as {types}, not quantized")
        steps += [f"{t} is fed to the device as well as looked up: the compiled graph reads "
                  f"it ({', '.join(repr(n) for n in reads[:3])}, e.g. position ids computed "
                  "from the token ids)" for t, reads in device.items()]
    elif ints:
        names = ", ".join(i["name"] for i in ints)
        types = "/".join(sorted({INT_TYPES[i["dtype"]] for i in ints}))
        what = " (token ids and mask from the tokenizer)" if text else ""
        steps.append(f"feed {names}{what} as {types}, not quantized; where the NPU takes "
                     "only 8/16-bit inputs, run the embedding lookup on the host")
    token_outs = [o["name"] for o in outputs if len(o["dims"]) == 3] if text else []
    if token_outs and (text if pooled is None else pooled):
        steps.append(f"{', '.join(token_outs)} is per token: mean-pool over attention_mask "
                     "and L2-normalise on the host (as the evaluation did)")
    elif token_outs:
        steps.append(f"{', '.join(token_outs)} is per token and was compared per token (no "
                     "pooling in this evaluation): any pooling your application does runs on "
                     "the host")
    dims = _dims_step(inputs, seq_len=seq_len, longest=longest, text=text, shapes=shapes,
                      shapes_from_data=shapes_from_data, measured_shapes=measured_shapes)
    steps += [dims] if dims else []
    return steps


def _dims_step(inputs: list[dict[str, Any]], *, seq_len: int | None, longest: int | None,
               text: bool, shapes: dict[str, list[int]] | None, shapes_from_data: bool,
               measured_shapes: dict[str, list[int]] | None) -> str | None:
    """The host step fixing the inputs' symbolic dims for the compiler (None: none open);
    the arguments as :func:`host_steps`'."""
    sym = {d for i in inputs for d in i["dims"] if isinstance(d, str) or d is None}
    if not sym:
        return None
    # a dim that leads some input is the samples' dim wherever it appears (an RNN
    # state [1, B, H] beside x [B, T, F]): 1 there too, not the length
    batch = {i["dims"][0] for i in inputs if i["dims"] and isinstance(i["dims"][0], str)}
    given = shapes or {}  # --input-shape: the shapes the run checked at
    shape = ", ".join(
        f"{i['name']}=" + ("x".join(map(str, given[i["name"]])) if i["name"] in given
                           else "x".join(_fixed(d, k, seq_len, batch, text=text)
                                         for k, d in enumerate(i["dims"])))
        for i in inputs)
    hint = ("" if seq_len or "xS" not in shape else
            " (S: the length you compile for" + (f"; the longest text here has {longest} "
                                                 "tokens)" if longest else ")"))
    named = sorted({d for i in inputs if i["name"] not in given
                    for k, d in enumerate(i["dims"])
                    if k and isinstance(d, str) and d not in batch})
    if not text and named:  # an image's H, W: sizes the run did not check at
        hint = (f" ({', '.join(named)}: the size you compile for; the size rules were "
                f"not checked at it: give --input-shape)")
    if given:
        how = "as the data's samples" if shapes_from_data else "as --input-shape"
        hint += (f" ({', '.join(given)} {how}, the "
                 f"shape{'s' * (len(given) > 1)} checked)")
    if measured_shapes:  # calibrated and measured at another size than compiled
        at = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in measured_shapes.items())
        hint += (f"; calibrated and measured on the data's {at} (not the compiled "
                 "size): give data of the size you compile for")
    return (f"fix the symbolic dims ({', '.join(sorted(map(str, sym)))}) for the "
            f"compiler: {shape}{hint}")


def _fixed(d: Any, axis: int, seq_len: int | None, batch: set[str], *,
           text: bool = True) -> str:
    if isinstance(d, int) and d > 0:
        return str(d)
    if axis == 0 or d in batch:
        return "1"
    if not text and isinstance(d, str):
        return d  # an image's H or W: one name each, not one length S for both
    return str(seq_len) if seq_len else "S"
