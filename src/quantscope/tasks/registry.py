"""DATA names and paths -> a Dataset with the task that scores it.

==========================  ============================================================
``stdlib-docs``             built-in retrieval (1,500 pairs) + 512 calibration texts
``*.jsonl``                 user retrieval pairs ``{"query", "document"}``; calibration on
                            the documents (or ``--calib-text`` in the API)
``*.tsv`` / scored JSONL     sentence similarity (STS): ``sentence1, sentence2, score``;
                            Spearman of cosine vs the human scores, and of the quantized
                            cosines vs FP32's (``score_agreement``)
``*.txt``                   calibration sentences, one per line (no task metric)
``faces``                   built-in face verification set, in the chip style of the model
                            (150 px dlib chips or 112 px ArcFace chips, by input size)
``photos`` (``photos-small``) built-in image retrieval: augmented views of packaged photos
                            (:mod:`quantscope.tasks.images`)
folder of identity folders  user face images (one sub-folder per identity), aligned alike
``.npy`` / ``.npz`` / dir   raw tensors (fidelity only) — handled by ``tasks.tensors``
==========================  ============================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from quantscope.model.load import Model
from quantscope.numerics import sqnr_db
from quantscope.tasks import metrics as M
from quantscope.tasks.db_noise import Parts, pair_powers
from quantscope.tasks.headline import items_key, retrieval_scoring, sts_scoring
from quantscope.tasks.images import SMALL_SPEC as IMAGES_SMALL
from quantscope.tasks.images import SPEC as IMAGES_SPEC
from quantscope.tasks.images import image_dataset
from quantscope.tasks.pooling import refuse_other_pooling
from quantscope.tasks.positions import token_limit
from quantscope.tasks.text import (
    DEFAULT_MAX_LENGTH,
    NO_PREFIXES,
    STDLIB_DOCS,
    StsPairs,
    TextBatches,
    TextEncoder,
    TextPrefixes,
    describe_lengths,
    describe_tokenizer,
    detect_encoder,
    is_sts_file,
    length_profile,
    load_calibration_texts,
    load_pairs,
    load_sts,
    load_tokenizer,
    make_batches,
    pool,
    text_tokenizer,
    token_lengths,
    truncate_batches,
    truncate_feeds,
)
from quantscope.tasks.unscored import embedding_note, unscored_note
from quantscope.tasks.verification import VerificationTask as VerificationTask
from quantscope.tasks.verification import face_dataset
from quantscope.types import (
    Batch,
    Dataset,
    Metrics,
    Outputs,
    PooledEmbedding,
    QuantscopeError,
    RowScoring,
)

CALIB_TEXTS = 512


def _pooled(out: Outputs, batches: TextBatches, enc: TextEncoder, *, normalize: bool) -> np.ndarray:
    mask = enc.input_name("attention_mask")
    parts = [pool(b[enc.output_index], feeds[mask], normalize=normalize)
             for b, feeds in zip(out.batches, batches.batches, strict=True)]
    stacked = np.concatenate(parts, axis=0)
    result = np.empty_like(stacked)
    result[batches.order] = stacked
    return result


def _keep_pooled(enc: TextEncoder, outputs: tuple[np.ndarray, ...], feeds: Batch
                 ) -> tuple[np.ndarray, ...]:
    """One batch's outputs with the encoder output mean-pooled (not normalised): all that
    the text metrics read of it (pooling pooled rows again only normalises them, with the
    same float32 operations: the same embeddings bit for bit)."""
    i = enc.output_index
    pooled = pool(outputs[i], feeds[enc.input_name("attention_mask")], normalize=False)
    return (*outputs[:i], pooled, *outputs[i + 1:])


@dataclass(frozen=True, eq=False)
class RetrievalTask:
    """Query i should retrieve document i; FP32 retrieval is the reference."""

    name: str
    n_pairs: int
    batches: TextBatches  # queries then documents, in length order
    encoder: TextEncoder

    headline = "top1_agreement"
    higher_is_better = True
    goal_range = (0.0, 1.0)

    def row_scoring(self, output_names: Sequence[str] = ()) -> RowScoring | None:
        mask = self.encoder.input_name("attention_mask")
        if mask is None:
            return None
        return retrieval_scoring(self.n_pairs, self.batches.order, mask,
                                 self.encoder.output_index)

    def objective(self) -> PooledEmbedding | None:
        return PooledEmbedding(self.encoder.output_index,
                               self.encoder.input_name("attention_mask"))

    def keep(self, outputs: tuple[np.ndarray, ...], feeds: Batch) -> tuple[np.ndarray, ...]:
        """What :meth:`metrics` reads of one batch's outputs (evaluation streams them)."""
        return _keep_pooled(self.encoder, outputs, feeds)

    def embeddings(self, out: Outputs, *, normalize: bool = True) -> tuple[np.ndarray, np.ndarray]:
        emb = _pooled(out, self.batches, self.encoder, normalize=normalize)
        return emb[: self.n_pairs], emb[self.n_pairs :]

    def only_texts(self, rows: np.ndarray) -> RetrievalTask:
        """The task on the texts ``rows`` only (see :func:`_only_texts`)."""
        return _only_texts(self, rows)

    def selection_figures(self, ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
        """:func:`retrieval_figures` of a selection of pairs."""
        return retrieval_figures(ref, test)

    def sample_parts(self, ref: Outputs, test: Outputs) -> dict[str, Parts]:
        """Per pair, the signal and noise powers that ``embedding_sqnr_db`` pools (the
        rows :meth:`metrics` reads, a query's and its document's summed: one unit of the
        figure's noise, :func:`quantscope.tasks.db_noise.pair_powers`)."""
        return {"embedding_sqnr_db": pair_powers(self.embeddings(ref, normalize=False),
                                                 self.embeddings(test, normalize=False))}

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        qr, dr = self.embeddings(ref)
        qt, dt = self.embeddings(test)
        rec_ref, rec = M.recall_at_k(qr, dr), M.recall_at_k(qt, dt)
        fid = M.cosine_fidelity(np.concatenate([qr, dr]), np.concatenate([qt, dt]))
        raw_t = np.concatenate(self.embeddings(test, normalize=False))
        raw_r = np.concatenate(self.embeddings(ref, normalize=False))
        norms, norms_ref = M.norm_stats(raw_t), M.norm_stats(raw_r)
        collapse = M.collapse_report(raw_t, reference=raw_r)
        values = {
            "recall@1": rec[1], "recall@5": rec[5], "recall@10": rec[10],
            "recall@1_fp32": rec_ref[1], "mrr": M.mrr(qt, dt),
            "top1_agreement": M.top1_agreement(qr, dr, qt, dt),
            items_key("top1_agreement"): float(len(qr)),  # one top-1 pick per query
            "embedding_cosine_mean": fid["mean"], "embedding_cosine_min": fid["min"],
            "embedding_cosine_p01": fid["p01"],
            "embedding_sqnr_db": sqnr_db(raw_r, raw_t),
            "norm_cv": norms["cv"], "norm_cv_fp32": norms_ref["cv"],
            "collapsed": float(collapse.collapsed),
        }
        verdict = M.resemblance_note(fid["mean"], agreement=values["top1_agreement"],
                                     candidates=len(dr))
        values["resembles_fp32"] = float(verdict is None)
        notes = (*(f"collapse: {r}" for r in collapse.reasons), *([verdict] if verdict else []))
        return Metrics(values=values, tables={"collapse": _collapse_table(collapse)}, notes=notes)


@dataclass(frozen=True, eq=False)
class StsTask:
    """Sentence similarity: pair i is (text i, text n + i), scored by a human."""

    name: str
    pairs: StsPairs
    batches: TextBatches  # first sentences then second sentences, in length order
    encoder: TextEncoder

    headline = "score_agreement"  # Spearman of the pair cosines with FP32's
    higher_is_better = True
    goal_range = (-1.0, 1.0)

    def row_scoring(self, output_names: Sequence[str] = ()) -> RowScoring | None:
        mask = self.encoder.input_name("attention_mask")
        if mask is None:
            return None
        return sts_scoring(len(self.pairs), self.batches.order, mask, self.encoder.output_index)

    def objective(self) -> PooledEmbedding | None:
        return PooledEmbedding(self.encoder.output_index,
                               self.encoder.input_name("attention_mask"))

    def keep(self, outputs: tuple[np.ndarray, ...], feeds: Batch) -> tuple[np.ndarray, ...]:
        """What :meth:`metrics` reads of one batch's outputs (evaluation streams them)."""
        return _keep_pooled(self.encoder, outputs, feeds)

    @property
    def n_pairs(self) -> int:
        return len(self.pairs)

    def only_texts(self, rows: np.ndarray) -> StsTask:
        """The task on the texts ``rows`` only (see :func:`_only_texts`)."""
        return _only_texts(self, rows)

    def selection_figures(self, ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
        """No retrieval figures for sentence pairs (their scores need every pair's human
        score: :meth:`metrics`)."""
        return {}

    def cosines(self, out: Outputs) -> np.ndarray:
        emb = _pooled(out, self.batches, self.encoder, normalize=True)
        n = len(self.pairs)
        return np.sum(emb[:n] * emb[n:], axis=1)

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        human = np.asarray(self.pairs.scores)
        cr, ct = self.cosines(ref), self.cosines(test)
        er = _pooled(ref, self.batches, self.encoder, normalize=True)
        et = _pooled(test, self.batches, self.encoder, normalize=True)
        fid = M.cosine_fidelity(er, et)
        values = {
            "spearman": M.spearman(ct, human), "spearman_fp32": M.spearman(cr, human),
            "score_agreement": M.spearman(ct, cr),
            "similarity_mae": float(np.mean(np.abs(ct - cr))),
            "embedding_cosine_mean": fid["mean"], "embedding_cosine_min": fid["min"],
        }
        verdict = M.resemblance_note(fid["mean"])
        values["resembles_fp32"] = float(verdict is None)
        return Metrics(values=values, notes=(verdict,) if verdict else ())


def retrieval_figures(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
    """Top-1 agreement (over ``n`` queries) and recall@1 of the ``test`` embeddings of pairs
    (queries the first ``n = len // 2`` rows, their documents the rest), FP32's beside."""
    n = len(ref) // 2
    return {"top1_agreement": M.top1_agreement(ref[:n], ref[n:], test[:n], test[n:]),
            items_key("top1_agreement"): float(n), "recall@1": float(M.recall_at_k(
                test[:n], test[n:], ks=(1,))[1]),
            "recall@1_fp32": float(M.recall_at_k(ref[:n], ref[n:], ks=(1,))[1])}


class TextTask(Protocol):
    """A task over text pairs (retrieval or STS): text ``i`` and text ``n_pairs + i`` make
    pair ``i``, each text with its token count (``Dataset.token_lengths``), so it can be
    cut at a sequence length and routed by length (``quantscope route`` and ``buckets``).
    :func:`text_task` tells whether a task is one."""

    @property
    def name(self) -> str: ...

    @property
    def n_pairs(self) -> int: ...

    @property
    def batches(self) -> TextBatches: ...

    @property
    def encoder(self) -> TextEncoder: ...

    def keep(self, outputs: tuple[np.ndarray, ...], feeds: Batch) -> tuple[np.ndarray, ...]: ...

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics: ...

    def only_texts(self, rows: np.ndarray) -> TextTask: ...

    def selection_figures(self, ref: np.ndarray, test: np.ndarray) -> dict[str, float]: ...


def text_task(task: object) -> TextTask | None:
    """``task`` when it is a task over text pairs (:class:`TextTask`), else None."""
    return task if isinstance(task, RetrievalTask | StsTask) else None


_Text = TypeVar("_Text", RetrievalTask, StsTask)


def _only_texts(task: _Text, rows: np.ndarray) -> _Text:
    """The task's batches cut to the texts ``rows`` (sorted text indices), each batch
    keeping its selected rows and trimmed to its longest selected text; text ``rows[i]``
    becomes text ``i``."""
    mask_name = task.encoder.input_name("attention_mask")
    new_index = np.full(len(task.batches.order), -1)
    new_index[rows] = np.arange(len(rows))
    batches, order, start = [], [], 0
    for b in task.batches.batches:
        n = len(next(iter(b.values())))
        texts = task.batches.order[start:start + n]
        start += n
        take = new_index[texts] >= 0
        if not take.any():
            continue
        cut = {k: v[take] for k, v in b.items()}
        if mask_name is not None and mask_name in cut:
            width = int(cut[mask_name].sum(axis=1).max())
            cut = {k: (np.ascontiguousarray(v[:, :width])
                       if v.ndim == 2 and v.shape[1] == b[mask_name].shape[1] else v)
                   for k, v in cut.items()}
        batches.append(cut)
        order.extend(new_index[texts[take]])
    return dataclasses.replace(task, batches=TextBatches(batches=tuple(batches),
                                                         order=np.asarray(order)))


def first_pairs(task: TextTask, k: int) -> TextTask:
    """The task on its first ``k`` pairs alone (texts ``0..k-1`` and ``n..n+k-1``): the
    figures' names without every pair's run (``--metric`` is checked on it)."""
    n = task.n_pairs
    k = max(1, min(k, n))
    cut = task.only_texts(np.concatenate([np.arange(k), n + np.arange(k)]))
    if isinstance(cut, RetrievalTask):
        return dataclasses.replace(cut, n_pairs=k)
    assert isinstance(cut, StsTask)
    p = cut.pairs
    return dataclasses.replace(cut, pairs=dataclasses.replace(
        p, first=p.first[:k], second=p.second[:k], scores=p.scores[:k]))


def text_embeddings(task: TextTask, out: Outputs) -> np.ndarray:
    """Every text's pooled, L2-normalised embedding, in task order (queries or first
    sentences, then documents or second sentences: pair ``i`` is rows ``i`` and ``n + i``),
    from outputs kept with ``task.keep``."""
    return _pooled(out, task.batches, task.encoder, normalize=True)


def _collapse_table(c: M.CollapseReport) -> dict[str, float]:
    return {k: float(v) for k, v in c.to_dict().items()
            if isinstance(v, int | float | bool)}


def text_dataset(
    spec: str, model: Model, *, tokenizer: str | None = None, batch_size: int = 32,
    max_pairs: int | None = None, prefixes: TextPrefixes = NO_PREFIXES,
    output: str | None = None, calib_texts: int | None = None,
) -> tuple[tuple[dict[str, np.ndarray], ...], tuple[dict[str, np.ndarray], ...],
           RetrievalTask | StsTask | None, str, np.ndarray]:
    """(calibration batches, evaluation batches, task, encoder description, untruncated
    token length of every evaluation text); ``prefixes`` put before the texts as
    :class:`TextPrefixes` says; ``output``: the output scored (``--output``);
    ``calib_texts``: calibrate on the first this many calibration texts (``--calib-texts``;
    None: up to :data:`CALIB_TEXTS`).

    A pairs file's calibration texts are the documents of the pairs opened (its first
    ``max_pairs``): the pairs after them are what ``run`` holds out."""
    enc = detect_encoder(model.proto, output=output)
    sts = load_sts(spec) if is_sts_file(spec) else None  # the data first: its errors first
    pairs = load_pairs(spec) if sts is None and (
        spec == STDLIB_DOCS or spec.endswith(".jsonl")) else None
    plain = load_calibration_texts(spec) if sts is None and pairs is None else ()
    tok_file = text_tokenizer(model.source, model.proto, tokenizer)
    refuse_other_pooling(model.source, tok_file, enc.output, enc.output_kind)
    # a position table shorter than the tokenizer's truncation: texts cut where it ends
    limit = token_limit(model.proto, {r: n for r, n, _ in enc.inputs}, DEFAULT_MAX_LENGTH)
    tok = load_tokenizer(tok_file, max_length=limit.tokens if limit else DEFAULT_MAX_LENGTH)
    if sts is not None:
        n = min(len(sts), max_pairs or len(sts))
        sts = StsPairs(sts.first[:n], sts.second[:n], sts.scores[:n], sts.source)
        texts = list(prefixes.queries(sts.first)) + list(prefixes.queries(sts.second))
        eval_b = make_batches(texts, tok, enc, batch_size=batch_size)
        pool = tuple(texts[:CALIB_TEXTS])
        task: RetrievalTask | StsTask | None = StsTask(
            name=f"sts:{sts.source}", pairs=sts, batches=eval_b, encoder=enc)
    elif pairs is not None:
        n = min(len(pairs), max_pairs or len(pairs))
        pool = prefixes.documents(load_calibration_texts(STDLIB_DOCS)
                                  if spec == STDLIB_DOCS
                                  else pairs.documents[:n][:CALIB_TEXTS])
        texts = list(prefixes.queries(pairs.queries[:n])) + list(
            prefixes.documents(pairs.documents[:n]))
        eval_b = make_batches(texts, tok, enc, batch_size=batch_size)
        task = RetrievalTask(name=f"retrieval:{pairs.source}", n_pairs=n, batches=eval_b,
                             encoder=enc)
    else:
        pool = prefixes.documents(plain)
        eval_b = make_batches(pool, tok, enc, batch_size=batch_size)
        task = None
    n_calib = min(CALIB_TEXTS, calib_texts or CALIB_TEXTS)
    calib = make_batches(pool[:n_calib], tok, enc, batch_size=batch_size)
    eval_texts = texts if task is not None else pool
    lengths = token_lengths(eval_texts, tok)
    profile = length_profile(lengths)
    note = f"{enc.describe()}; {describe_tokenizer(tok_file)}; {describe_lengths(profile)}"
    if limit is not None:
        note += f"; {limit.describe()}: texts truncated there"
    if prefixes:
        note += f"; {prefixes.describe()}"
    if calib_texts is not None:
        note += (f"; calibration on the first {min(n_calib, len(pool))} of "
                 f"{min(CALIB_TEXTS, len(pool))} calibration texts (--calib-texts)")
    if isinstance(task, StsTask):
        note += ("; calibrating on this data uses the pairs' own sentences (it has no "
                 "calibration texts of its own: 'quantscope calibrate --data TEXTS.txt' "
                 "calibrates on others)")
    return tuple(calib.batches), tuple(eval_b.batches), task, note, lengths


def is_text_spec(spec: str) -> bool:
    return spec == STDLIB_DOCS or spec.endswith((".jsonl", ".txt", ".tsv"))


def is_face_spec(spec: str) -> bool:
    from quantscope.tasks.faces import face_spec

    return face_spec(spec) is not None


def check_text_model(model: Model, spec: str) -> None:
    names = set(model.input_names())
    if "input_ids" not in names and not any("ids" in n for n in names):
        raise QuantscopeError(
            f"data '{spec}' is text but the model's inputs are {', '.join(sorted(names))}: "
            "use a sentence-encoder model (inputs input_ids, attention_mask)"
        )


def at_length(data: Dataset, max_length: int) -> Dataset:
    """Text data as a deployment at ``max_length`` tokens runs it: every text longer than
    that truncated (calibration and evaluation), so a plan for that length is measured on
    what it will see, against FP32 at the same length; other data unchanged."""
    task = data.task
    if not isinstance(task, RetrievalTask | StsTask):
        return data
    ids = task.encoder.input_name("input_ids")
    if ids is None or max(b[ids].shape[1] for b in task.batches) <= max_length:
        return data
    batches = truncate_batches(task.batches, max_length, task.encoder)
    calib = tuple(truncate_feeds(b, max_length, task.encoder) for b in data.calibration)
    longer = "" if data.token_lengths is None else (
        f"{float(np.mean(np.asarray(data.token_lengths) > max_length)):.1%} of the "
        "evaluation texts are longer; ")
    note = (f"texts truncated at {max_length} tokens, as a deployment at sequence length "
            f"{max_length} runs them ({longer}quality is against FP32 at the same length)")
    return dataclasses.replace(data, calibration=calib, evaluation=batches.batches,
                               task=dataclasses.replace(task, batches=batches),
                               notes=(*data.notes, note))


def tensor_task(model: Model, spec: str, layouts: tuple = (),
                sample_axes: Mapping[str, int] | None = None
                ) -> tuple[object | None, tuple[str, ...]]:
    """The task of tensor data: the outputs declared with ``--layout`` or detected in the
    graph (a detection head), each scored by what it is; None when every output is plain
    (fidelity only). Also the notes saying what each output was read as
    (:mod:`quantscope.tasks.layout`); ``sample_axes``: each output's sample axis."""
    from quantscope.tasks.layout import layout_tasks
    from quantscope.tasks.lm_tensor import language_model_note

    task, notes = layout_tasks(model, tuple(layouts), spec, sample_axes)
    lm = language_model_note(model, task)  # what an LM's figures say: beside them
    return task, (*notes, lm) if lm else notes


def open_task_data(
    spec: str, model: Model, *, tokenizer: str | None = None, max_pairs: int | None = None,
    prefixes: TextPrefixes = NO_PREFIXES, output: str | None = None,
    calib_texts: int | None = None,
) -> Dataset | None:
    """A :class:`Dataset` for a task spec, or None when ``spec`` is plain tensor data;
    ``prefixes`` and ``calib_texts`` (text data only) as :func:`text_dataset` says."""
    if not is_text_spec(spec):  # a text option on tensor data is said, not left unused
        for given, flags in ((prefixes, "--query-prefix/--doc-prefix apply"),
                             (tokenizer, "--tokenizer applies"),
                             (calib_texts, "--calib-texts applies")):
            if given:
                raise QuantscopeError(f"{flags} to text data; '{spec}' is not text (pairs "
                                      ".jsonl, .tsv, .txt, stdlib-docs): leave it out")
    if is_text_spec(spec):
        check_text_model(model, spec)
        calib, evaluation, task, note, lengths = text_dataset(
            spec, model, tokenizer=tokenizer, max_pairs=max_pairs, prefixes=prefixes,
            output=output, calib_texts=calib_texts)
        unscored = unscored_note(model.proto, task.encoder.output) if task else None
        return Dataset(name=spec, calibration=calib, evaluation=evaluation, task=task,
                       notes=(note, *filter(None, [unscored])), token_lengths=lengths)
    if spec in (IMAGES_SPEC, IMAGES_SMALL):
        return image_dataset(model, spec=spec)
    if is_face_spec(spec):
        calib, evaluation, task, note = face_dataset(spec, model)
        other = embedding_note(model.proto, "face verification")
        return Dataset(name=spec, calibration=calib, evaluation=evaluation, task=task,
                       notes=(note, *filter(None, [other])))
    return None
