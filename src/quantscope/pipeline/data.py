"""The run's data: what calibrates and fits the plan, and what evaluates it (held out).

======================================  ==============================================
``--eval-data D2``                      fit on DATA, evaluate on D2
text retrieval pairs (stdlib-docs,      fit (analysis, plan search) on the first
``.jsonl``) without ``--eval-data``     ``--pairs`` pairs, evaluate on the next
                                        ``--pairs`` (written to ``heldout.jsonl``);
                                        calibration texts are separate already
tensors (.npy/.npz) without             the batches (or, with one batch, its rows)
``--eval-data``                         split in two: the first half calibrates and
                                        fits, the second half evaluates
face data (``faces``, a folder of       split by person (``tasks.face_split``: people
identity folders) without               by chip count, most first, each to the half
``--eval-data``                         with fewer chips; no person in both; each half
                                        its own genuine and impostor pairs): the first
                                        half calibrates and fits, the other evaluates;
                                        a half of under 2 people or 8 genuine pairs:
                                        not split, said. The built-in ``faces`` (ArcFace
                                        chips): 12 people (126 chips) fit, 12 (117) held
                                        out; provenance: each part's ``faces`` (people,
                                        photos, chips, pairs)
anything else (.txt)                    not split: evaluation reuses the fit data,
                                        and the run says so
======================================  ==============================================
"""

from __future__ import annotations

import filecmp
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from quantscope import stages
from quantscope.model.load import Model
from quantscope.tasks.face_split import half_record, halves_by_person, splits_by_people
from quantscope.tasks.text import TextPrefixes
from quantscope.tasks.verify import split_rows, splits_by_rows
from quantscope.types import Batch, Dataset, QuantscopeError, batch_rows, take_rows

HELDOUT_PAIRS = "heldout.jsonl"


@dataclass(frozen=True)
class RunData:
    fit: Dataset  # calibration, analysis, plan search, repairs
    held_out: Dataset  # the final evaluation
    split: str  # how held_out was obtained, one sentence
    # --query-prefix/--doc-prefix put before the texts of both parts (None: none)
    prefixes: TextPrefixes | None = None

    @property
    def is_held_out(self) -> bool:
        """The evaluation is on other samples than the fit (False: data that cannot be
        split is evaluated on the fit data, and every figure must say so)."""
        return self.held_out is not self.fit


def open_run_data(model: Model, data: str, *, eval_data: str | None, pairs: int | None,
                  tokenizer: str | None, folder: Path, layout: tuple[Any, ...] = (),
                  batch_axes: dict[str, int] | None = None,
                  prefixes: TextPrefixes | None = None, fit: Dataset | None = None,
                  calib_texts: int | None = None) -> RunData:
    """Open the fit and the evaluation data (see the module table); ``layout``: the
    ``--layout`` declarations of tensor data's outputs; ``batch_axes``: the inputs' sample
    axes declared with ``--batch-axis``; ``prefixes``: the text prefixes of text data, on
    both parts; ``fit``: the fit data as opened already with these options (by a model
    with the same inputs, outputs and tokenizer), not opened again; ``calib_texts``: text
    data calibrates on its first this many calibration texts (``--calib-texts``)."""
    rd = _open_run_data(model, data, eval_data=eval_data, pairs=pairs, tokenizer=tokenizer,
                        folder=folder, layout=layout, batch_axes=batch_axes, prefixes=prefixes,
                        fit=fit, calib_texts=calib_texts)
    return replace(rd, prefixes=prefixes or None)


def _open_run_data(model: Model, data: str, *, eval_data: str | None, pairs: int | None,
                   tokenizer: str | None, folder: Path, layout: tuple[Any, ...],
                   batch_axes: dict[str, int] | None, prefixes: TextPrefixes | None,
                   fit: Dataset | None = None, calib_texts: int | None = None) -> RunData:
    if fit is None:
        fit = stages.open_data(data, model, tokenizer=tokenizer, max_pairs=pairs,
                               layout=layout, batch_axes=batch_axes, prefixes=prefixes,
                               calib_texts=calib_texts)
    if eval_data:
        held = stages.open_data(eval_data, model, tokenizer=tokenizer, max_pairs=pairs,
                                layout=layout, batch_axes=batch_axes, show=False,
                                prefixes=prefixes)
        return RunData(fit, held, f"evaluation on --eval-data {eval_data}, held out from "
                       f"calibration and fitting on {data}")
    if _is_pairs(data):
        return _split_pairs(model, data, fit, pairs=pairs, tokenizer=tokenizer, folder=folder,
                            prefixes=prefixes)
    return _split_own(fit, data)


def _split_own(fit: Dataset, data: str) -> RunData:
    """Data without held-out samples of its own (not ``--eval-data``, not pairs): face data
    by person, tensors by rows, anything else not split (the module table)."""
    if splits_by_people(fit.task) and _same_batches(fit.calibration, fit.evaluation):
        return _split_faces(fit, data)
    row_local = fit.task is None or getattr(fit.task, "row_local", False) or splits_by_rows(
        fit.task)  # a verify task's labels split with the samples
    if row_local and _same_batches(fit.calibration, fit.evaluation):
        return _split_tensors(fit)
    return RunData(fit, fit, f"NOT held out: {data} is not split (its task needs every "
                   "sample); give --eval-data for a held-out evaluation")


def open_fit_data(model: Model, data: str, *, eval_data: str | None, pairs: int | None,
                  tokenizer: str | None, layout: tuple[Any, ...] = (),
                  batch_axes: dict[str, int] | None = None,
                  prefixes: TextPrefixes | None = None, calib_texts: int | None = None
                  ) -> Dataset:
    """The fit part of :func:`open_run_data` alone (nothing written, nothing held out
    read): what ``run --rewrites auto`` measures the rewrites on."""
    fit = stages.open_data(data, model, tokenizer=tokenizer, max_pairs=pairs, layout=layout,
                           batch_axes=batch_axes, show=False, prefixes=prefixes,
                           calib_texts=calib_texts)
    return fit_part(fit, data, eval_data=eval_data)


def fit_part(opened: Dataset, data: str, *, eval_data: str | None) -> Dataset:
    """The part of ``data`` (opened whole as ``opened``) that fits the plan: all of it with
    ``--eval-data`` or for text pairs, else its own split's fit part."""
    if eval_data or _is_pairs(data):
        return opened
    return _split_own(opened, data).fit


def widest_text_batch(fit: Dataset) -> int | None:
    """The length text data is measured at without ``--seq-len``: its widest padded
    evaluation batch (the tokenizer truncates longer texts); None for other data."""
    enc = getattr(fit.task, "encoder", None)
    ids = enc.input_name("input_ids") if enc is not None else None
    widths = [np.asarray(b[ids]).shape[1] for b in fit.evaluation if ids in b]
    return max(widths) if widths else None


def _same_batches(a: tuple[Batch, ...], b: tuple[Batch, ...]) -> bool:
    """The same batch objects (tensor data, calibrated and evaluated alike: split in two);
    by identity: ``==`` compares the arrays inside (a .txt's batches: an internal error)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def calibration_rule(data: str) -> dict[str, str]:
    """The calibration rule of ``data`` in the run folder's keys: a pairs file calibrates
    on the documents of the pairs used (stop 79; before, on the file's first 512 documents,
    the held-out ones among them), so a folder made under the old rule calibrates again.
    Empty for other data (their keys unchanged)."""
    from quantscope.tasks.text import STDLIB_DOCS

    return {"calibration": "the pairs' documents"} if _is_pairs(data) and \
        data != STDLIB_DOCS else {}


def _is_pairs(spec: str) -> bool:
    from quantscope.tasks.text import STDLIB_DOCS

    return spec == STDLIB_DOCS or spec.endswith(".jsonl")


def _split_pairs(model: Model, data: str, fit: Dataset, *, pairs: int | None,
                 tokenizer: str | None, folder: Path,
                 prefixes: TextPrefixes | None = None) -> RunData:
    from quantscope.tasks.text import STDLIB_DOCS, load_pairs

    every = load_pairs(data)
    n = fit.task.n_pairs if fit.task is not None else len(every)  # type: ignore[attr-defined]
    rest = list(zip(every.queries[n:], every.documents[n:], strict=True))[: pairs or None]
    if len(rest) < 2:
        return RunData(fit, fit, f"NOT held out: all {len(every)} pairs of {data} fit the plan; "
                       "give fewer --pairs or --eval-data")
    path = folder / HELDOUT_PAIRS
    text = "".join(json.dumps({"query": q, "document": d}) + "\n" for q, d in rest)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        stages.write_text(path, text)
    held = stages.open_data(str(path), model, tokenizer=tokenizer, prefixes=prefixes)
    held = replace(held, name=f"{data} pairs {n + 1}-{n + len(rest)}")
    calibrates = ("the separate calibration texts" if data == STDLIB_DOCS else
                  f"the documents of pairs 1-{n} (none held out)")
    return RunData(fit, held, f"split: pairs 1-{n} of {data} fit the plan, pairs "
                   f"{n + 1}-{n + len(rest)} (held out, {HELDOUT_PAIRS}) evaluate it; "
                   f"calibration uses {calibrates}")


def _split_tensors(ds: Dataset) -> RunData:
    """The first half of the samples (rounded up) fits, the second is held out, a batch
    cut where the halves meet: whole batches would hold out 4 of 36 samples in batches of
    32 (a figure on 4 photos)."""
    batches = list(ds.calibration)
    sizes = [batch_rows(b) for b in batches]
    if sum(sizes) < 2:
        return RunData(ds, ds, f"NOT held out: {ds.name} has one sample")
    k = (sum(sizes) + 1) // 2
    first: list[Batch] = []
    second: list[Batch] = []
    seen = 0
    for batch, rows in zip(batches, sizes, strict=True):
        cut = min(max(k - seen, 0), rows)
        first += [batch] if cut == rows else ([_rows(batch, 0, cut)] if cut else [])
        second += [] if cut == rows else ([batch] if not cut else [_rows(batch, cut, rows)])
        seen += rows
    n1, n2 = _count(tuple(first)), _count(tuple(second))
    fit = replace(ds, calibration=tuple(first), evaluation=tuple(first),
                  task=split_rows(ds.task, 0, n1))
    held = replace(ds, name=f"{ds.name} (held-out part)", calibration=tuple(second),
                   evaluation=tuple(second), task=split_rows(ds.task, n1, n1 + n2))
    return RunData(fit, held, f"split: the first {n1} samples of {ds.name} calibrate and fit "
                   f"the plan, the other {n2} (held out) evaluate it")


def _split_faces(ds: Dataset, data: str) -> RunData:
    """Face data split by person (:mod:`quantscope.tasks.face_split`): the first half
    calibrates and fits, the other (held out) evaluates; not split when a half would be
    too small to judge, said."""
    halves = halves_by_person(ds.task, ds.evaluation)  # type: ignore[arg-type]
    if isinstance(halves, str):
        return RunData(ds, ds, f"NOT held out: {data} is not split by person: a half would "
                       f"hold {halves}: evaluation reuses the fit data; give --eval-data "
                       "(photos of other people) for a held-out evaluation")
    (a, b), (fit_b, held_b) = halves.tasks, halves.batches
    n1, n2 = len(halves.split.fit), len(halves.split.held)
    p1, p2 = halves.people
    fit = replace(ds, calibration=fit_b, evaluation=fit_b, task=a, notes=(*ds.notes, (
        f"split by person (run): the fit part, {p1} people, {n1} chips and the {len(a.pairs)} "
        "pairs among them, calibrates and fits the plan")))
    held = replace(ds, name=f"{ds.name} (held-out people)", calibration=held_b,
                   evaluation=held_b, task=b, notes=(*ds.notes, (
                       f"split by person (run): the held-out part, {p2} other people, {n2} "
                       f"chips and the {len(b.pairs)} pairs among them, evaluates the plan")))
    return RunData(fit, held, (
        f"split by person: {p1} people ({n1} chips, {len(a.pairs)} pairs) of {data} "
        f"calibrate and fit the plan, the other {p2} ({n2} chips, {len(b.pairs)} pairs; "
        "held out) evaluate it; no person in both (people by chip count, most first, each "
        "to the half with fewer chips: a stable order, no seed; the pairs across the halves "
        "are in neither)"))


def _rows(batch: Batch, a: int, b: int) -> Batch:
    return take_rows(batch, slice(a, b))


def _count(batches: tuple[Batch, ...]) -> int:
    return sum(batch_rows(b) for b in batches)


def provenance(rd: RunData) -> dict[str, Any]:
    """Rows, source and notes of both parts (the report's data provenance), and the text
    prefixes when given (``heldout.jsonl`` keeps the texts as given: the prefixes are
    put before them when opened, as on the fit part)."""
    def part(ds: Dataset) -> dict[str, Any]:
        task = ds.task
        return {"name": ds.name, "calibration_samples": _count(ds.calibration),
                "evaluation_samples": _count(ds.evaluation),
                "task": getattr(task, "name", None), "notes": list(ds.notes),
                "token_lengths": _token_lengths(ds),
                **({"faces": faces} if (faces := half_record(task)) is not None else {})}

    prefixes = {"prefixes": {**rd.prefixes.to_dict(), "note": rd.prefixes.describe()}} \
        if rd.prefixes else {}
    return {"split": rd.split, "is_held_out": rd.is_held_out, **prefixes, "fit": part(rd.fit),
            "held_out": part(rd.held_out)}


def _token_lengths(ds: Dataset) -> list[int] | None:
    """Token count per evaluation text (attention-mask sums), for text data; else None."""
    task = ds.task
    enc = getattr(task, "encoder", None)
    mask = enc.input_name("attention_mask") if enc is not None else None
    if not mask:
        return None
    return [int(x) for b in ds.evaluation for x in np.asarray(b[mask]).sum(axis=1)]



def refuse_same_data(data: str, eval_data: str) -> None:
    """``--eval-data`` that is ``--data`` (the same name, file or folder, or a copy with
    the same bytes): its figures would be called held out while measured on the samples
    the plan was fitted on; refused in one line."""
    a, b = Path(data), Path(eval_data)
    same = data == eval_data or (a.exists() and b.exists() and (
        a.resolve() == b.resolve() or _same_bytes(a, b)))
    if same:
        raise QuantscopeError(
            f"--eval-data '{eval_data}' holds the same data as --data '{data}': the "
            "evaluation would not be held out from the fitting: give other samples, or leave "
            "--eval-data out (run then holds out part of --data)")


def _same_bytes(a: Path, b: Path) -> bool:
    """Two data files, or two data folders file by file, with the same bytes (sizes first:
    data files may be large, and a copy is rare)."""
    def files(p: Path) -> list[tuple[str, Path]]:
        return ([(str(f.relative_to(p)), f) for f in sorted(p.rglob("*")) if f.is_file()]
                if p.is_dir() else [("", p)])

    fa, fb = files(a), files(b)
    if [(n, f.stat().st_size) for n, f in fa] != [(n, f.stat().st_size) for n, f in fb]:
        return False
    return all(filecmp.cmp(x, y, shallow=False) for (_, x), (_, y) in zip(fa, fb, strict=True))


def refuse_overlap(data: str, eval_data: str, fit: Dataset, held: Dataset,
                   pairs: int | None) -> None:
    """``--eval-data`` some of whose samples are ``--data``'s (not the same bytes: a
    subset, a reshuffle, a file that shares pairs): refused in one line saying how many,
    not dropped (the held-out figure's n would change under the user; h42's decision).
    Retrieval pairs compare as (query, document) pairs, the first ``--pairs`` of each;
    other data sample by sample, a text by its tokens under its attention mask."""
    from quantscope.tasks.text import load_pairs

    if _is_pairs(data) and _is_pairs(eval_data):
        try:
            a, b = load_pairs(data), load_pairs(eval_data)
        except QuantscopeError:  # sentence pairs (.jsonl of STS rows): sample by sample
            pass
        else:
            n_fit = getattr(fit.task, "n_pairs", len(a))
            mine = set(zip(a.queries[:n_fit], a.documents[:n_fit], strict=True))
            theirs = list(zip(b.queries, b.documents, strict=True))[: pairs or None]
            _say_overlap(data, eval_data, sum(p in mine for p in theirs), len(theirs),
                         "pairs")
            return
    mine = {s for b in (*fit.calibration, *fit.evaluation) for s in _sample_keys(b)}
    theirs = [s for b in held.evaluation for s in _sample_keys(b)]
    _say_overlap(data, eval_data, sum(s in mine for s in theirs), len(theirs), "samples")


def _say_overlap(data: str, eval_data: str, shared: int, total: int, what: str) -> None:
    if shared:
        raise QuantscopeError(
            f"--eval-data '{eval_data}': {shared} of its {total} {what} are also in --data "
            f"'{data}': figures on them would be called held out though the plan was fitted "
            f"on them: give --eval-data {what} not in --data, or leave --eval-data out (run "
            "then holds out part of --data)")


def _sample_keys(batch: Batch) -> list[bytes]:
    """Each sample of ``batch`` as bytes (every input's row, in name order; a text's
    integer inputs only where its attention mask is 1, so padding to another batch's width
    changes nothing)."""
    import hashlib

    keys = []
    for i in range(batch_rows(batch)):
        row = take_rows(batch, [i])
        mask = np.asarray(row["attention_mask"]) != 0 if "attention_mask" in row else None
        h = hashlib.sha256()
        for name in sorted(row):
            arr = np.asarray(row[name])
            if mask is not None and arr.shape == mask.shape:
                arr = arr[mask]
            h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode() + arr.tobytes())
        keys.append(h.digest())
    return keys
