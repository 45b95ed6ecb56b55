"""An embedding in tensor data, judged by its neighbours: ``--layout OUT=embedding``.

An embedding (a face descriptor, a speaker or an image embedding) is used by what it is
nearest to: the enrolled face a host matches, the closest item it retrieves. Tensor data
seldom carries labels, and without them no identity can be checked; what can be is whether
each sample's nearest other sample is the same under the plan as under FP32 (the built-in ``photos``
set's ``top1_agreement`` over views, :mod:`quantscope.tasks.images`, without the photos).
Every sample of the data is compared with every other (``[N, ...]`` read as ``N`` rows):

===========================  ===========================================================
``neighbour_agreement``      (headline without labels) the share of samples whose nearest other sample
                             is the one FP32's is, over ``neighbour_agreement_items``
                             samples (one pick each: :mod:`quantscope.tasks.shares`)
``neighbour_top5_overlap``   the mean share of each sample's 5 nearest others under FP32
                             that are among its 5 nearest under the plan (fewer when the
                             data has 6 samples or fewer: all the others)
``embedding_cosine_mean``,   each sample's embedding against FP32's: cosine (mean, least)
``embedding_cosine_min``,    and SQNR over every value (its per-sample powers beside it:
``embedding_sqnr_db``        the jackknife noise the planner and ``run``'s held-out check
                             read, ``sample_parts``)
``collapsed``,               the collapse test of :func:`quantscope.tasks.metrics.collapse_report`
``pairwise_cosine_fp32``     (1: collapsed against FP32's) and FP32's own mean pairwise cosine
===========================  ===========================================================

``labels=NAME`` (an array of the data file, one label per sample, as ``verify`` reads it:
:func:`quantscope.tasks.verify.read_labels`) adds ``neighbour_label_agreement``, the
headline then: the share of samples whose nearest other's label is the label of FP32's
nearest (over ``neighbour_label_agreement_items``). Without labels a swap between two
samples of one identity counts as a change (faceres' 8-bit descriptor: 8 face chips' nearest
turned from one variant of the same face to another); with them it does not. Labels bind
the task to the samples' order: it is then not ``row_local`` (the analysis ranks by the
outputs' fidelity, as for ``verify``) and ``run`` splits the labels with the samples.

``norm=l2`` (the default): nearest by cosine, the embeddings' directions, as a host that
L2-normalises them (ArcFace, a speaker encoder, CLIP) or compares cosines matches them; a
change of an embedding's length alone, common at 8 bit, then moves no neighbour.
``norm=none``: nearest by Euclidean distance of the raw embeddings, for a host that
matches them unnormalised (dlib's descriptors at distance 0.6).

Notes: below :data:`AGREEMENT_RESEMBLES` a ``NOT LIKE FP32`` line counting the samples
whose neighbour changed; FP32's own embeddings in nearly one direction (mean pairwise
cosine above :data:`quantscope.tasks.metrics.COLLAPSE_MEAN_COSINE_NO_REF`, the threshold
face verification's note uses) make every neighbour fragile and the agreement say little,
said (``run``'s verdict repeats it as a ``warning:``). Data of fewer than
:data:`MIN_SAMPLES` samples is refused before any work (:func:`check_neighbour_samples`).
The figure is computed over whichever samples are scored (``row_local`` without labels):
``run``'s held-out half is judged by its samples' neighbours among themselves. It is no
estimate of the figure over more samples (``rows_alone`` False): the analysis ranks by it
only where every row is scored, by the outputs' fidelity on its row subsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from quantscope.numerics import sqnr_db
from quantscope.tasks import metrics as M
from quantscope.tasks.db_noise import Parts, row_powers
from quantscope.tasks.shares import items_key
from quantscope.types import Metrics, Outputs, QuantscopeError
from quantscope.units import value

NORMS = ("l2", "none")
TOP_K = 5
CHUNK = 1024  # rows compared with all rows at a time
MIN_SAMPLES = 3  # each sample's nearest other among 2 or more: else nothing to change
AGREEMENT_RESEMBLES = 0.95  # fewer samples keeping their neighbour: NOT LIKE FP32


def neighbours(emb: np.ndarray, *, l2: bool = True, k: int = 1, chunk: int = CHUNK
               ) -> tuple[np.ndarray, np.ndarray]:
    """Each row's nearest other row of ``emb`` (ties: the lowest index) and its ``k``
    nearest others (in no order; ``k`` at most the others): by cosine (``l2``), or by
    Euclidean distance. Rows are compared ``chunk`` at a time with all rows, so the
    memory is ``chunk x N``, not ``N x N``."""
    x = np.asarray(emb, np.float64)
    n = len(x)
    k = max(1, min(k, n - 1))
    if l2:
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    sq = np.sum(x * x, axis=1)
    nearest, top = np.zeros(n, np.int64), np.zeros((n, k), np.int64)
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        sim = x[a:b] @ x.T  # larger is nearer: the cosine, or minus the squared distance
        if not l2:
            sim = 2.0 * sim - sq[a:b, None] - sq[None, :]
        sim[np.arange(b - a), np.arange(a, b)] = -np.inf
        nearest[a:b] = np.argmax(sim, axis=1)
        top[a:b] = np.argpartition(-sim, k - 1, axis=1)[:, :k]
    return nearest, top


def top_overlap(top_ref: np.ndarray, top_test: np.ndarray) -> float:
    """The mean share of each row's nearest others under FP32 (``top_ref``, ``[N, k]``)
    that are among its nearest under the plan (``top_test``)."""
    k = top_ref.shape[1]
    hits = [len(np.intersect1d(x, y)) for x, y in zip(top_ref, top_test, strict=True)]
    return float(np.mean(hits)) / k


@dataclass(frozen=True, eq=False)
class EmbeddingTask:
    """An embedding output judged by each sample's nearest other (module docstring)."""

    name: str
    output: str
    norm: str = "l2"
    labels: np.ndarray | None = field(default=None, repr=False)
    label_name: str = ""
    headline: str = "neighbour_agreement"
    higher_is_better: bool = True
    goal_range: tuple[float, float] = (0.0, 1.0)
    row_local: bool = True  # False with labels: they are bound to the samples' order
    # each sample's figure reads every other sample (its nearest among them): a subset's
    # figure is no estimate of the whole data's, so the analysis' row subsets rank by the
    # outputs' fidelity (tasks.headline.sample_row_scoring)
    rows_alone: bool = False

    def describe(self) -> str:
        how = ("cosine (the directions: norm=l2)" if self.norm == "l2" else
               "Euclidean distance of the raw embeddings (norm=none)")
        text = (f"an embedding, judged by its neighbours: each sample's nearest other sample "
                f"by {how}, the plan's against FP32's")
        if self.labels is None:
            return text
        return (f"{text}; headline: whether its label (from '{self.label_name}', "
                f"{len(np.unique(self.labels))} labels, {len(self.labels)} samples) is the "
                "label of FP32's nearest (a swap between two samples of one label is no change)")

    def _rows(self, out: Outputs) -> np.ndarray:
        i = out.names.index(self.output)
        parts = [np.asarray(b[i], np.float64).reshape(len(b[i]), -1) for b in out.batches]
        return np.concatenate(parts) if parts else np.zeros((0, 0))

    def sample_parts(self, ref: Outputs, test: Outputs) -> dict[str, Parts]:
        """Per sample, the powers ``embedding_sqnr_db`` pools (one row each: each sample
        its own input; :func:`quantscope.tasks.db_noise.row_powers`): the noise the
        planner's choice and ``run``'s held-out check read."""
        got = row_powers(self._rows(ref), self._rows(test))
        return {"embedding_sqnr_db": Parts(got.signal, got.noise, "samples")}

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        r, t = self._rows(ref), self._rows(test)
        n = len(r)
        if n < MIN_SAMPLES:
            nan = float("nan")
            return Metrics(values={"neighbour_agreement": nan, self.headline: nan,
                                   "neighbour_top5_overlap": nan},
                           notes=(f"output '{self.output}': {n} sample(s) scored, and each "
                                  f"one's nearest other needs {MIN_SAMPLES} or more: the "
                                  "neighbour agreement is not measured",))
        l2 = self.norm == "l2"
        (nr, kr), (nt, kt) = neighbours(r, l2=l2, k=TOP_K), neighbours(t, l2=l2, k=TOP_K)
        same = nr == nt
        fid = M.cosine_fidelity(r, t)
        collapse = M.collapse_report(t, reference=r)
        values = {
            "neighbour_agreement": float(np.mean(same)),
            items_key("neighbour_agreement"): float(n),  # one pick per sample
            "neighbour_top5_overlap": top_overlap(kr, kt),
            "embedding_cosine_mean": float(fid["mean"]),
            "embedding_cosine_min": float(fid["min"]),
            "embedding_sqnr_db": sqnr_db(r, t),
            "collapsed": float(collapse.collapsed),
            "pairwise_cosine_fp32": M.mean_pairwise_cosine(r),
            **self._label_values(nr, nt, n),
        }
        notes = [f"collapse: output '{self.output}': {why}" for why in collapse.reasons]
        if values[self.headline] < AGREEMENT_RESEMBLES:
            key, what = (("neighbour_label_agreement", "is of another label than FP32's")
                         if self.labels is not None else
                         ("neighbour_agreement", "is not FP32's"))
            changed = int(round(n * (1.0 - values[key])))
            notes.append(f"NOT LIKE FP32: output '{self.output}': {changed} of {n} samples' "
                         f"nearest other sample {what} ({key.replace('_', ' ')} "
                         f"{value(key, values[key])} < {value(key, AGREEMENT_RESEMBLES)})")
        degenerate = self._fp32_degenerate(values["pairwise_cosine_fp32"], n)
        return Metrics(values=values, notes=(*notes, *([degenerate] if degenerate else [])))

    def _label_values(self, nr: np.ndarray, nt: np.ndarray, n: int) -> dict[str, float]:
        """With labels: the share of samples whose nearest other's label is the label of
        FP32's nearest (the identity a host matching its nearest enrolled sample reads)."""
        if self.labels is None:
            return {}
        if len(self.labels) != n:
            raise QuantscopeError(
                f"--layout {self.output}=embedding: '{self.label_name}' holds "
                f"{len(self.labels)} labels and the data {n} samples: give one label per "
                "sample, in the data's order")
        key = "neighbour_label_agreement"
        return {key: float(np.mean(self.labels[nr] == self.labels[nt])), items_key(key): float(n)}

    def _fp32_degenerate(self, mcos: float, n: int) -> str | None:
        """A note when FP32's own embeddings point nearly one way (the threshold face
        verification's note uses): every neighbour is then a near tie, which any noise
        flips, and one the host could not rely on either."""
        if not mcos > M.COLLAPSE_MEAN_COSINE_NO_REF:
            return None
        return (f"output '{self.output}': FP32 itself does not tell these samples apart (its "
                f"{n} embeddings' mean pairwise cosine is {mcos:.4f} > "
                f"{M.COLLAPSE_MEAN_COSINE_NO_REF:g}): the neighbour agreement says little; "
                "check that the data is fed as the model takes it (values, size, channel "
                "order: the data note) and that the output is the embedding")


def neighbour_tasks(task: object) -> list[EmbeddingTask]:
    """The embedding tasks of a task (alone or among several outputs')."""
    return [t for t in getattr(task, "tasks", (task,)) if isinstance(t, EmbeddingTask)]


def check_neighbour_samples(task: object, samples: int) -> None:
    """Refuse, before any work, data too small for an embedding's neighbours."""
    for t in neighbour_tasks(task):
        if samples < MIN_SAMPLES:
            raise QuantscopeError(
                f"--layout {t.output}=embedding: the data has {samples} sample(s), and each "
                f"sample's nearest other needs {MIN_SAMPLES} or more: give at least "
                f"{MIN_SAMPLES} samples (more make the agreement's noise smaller)")


def embedding_task(output: str, norm: str | None, labels: np.ndarray | None = None,
                   label_name: str = "") -> EmbeddingTask:
    """The task of an ``embedding`` layout (``norm`` checked by the layout's syntax;
    ``labels``: the data file's array ``label_name``, :func:`quantscope.tasks.verify.read_labels`)."""
    if labels is None:
        return EmbeddingTask(name=f"embedding:{output}", output=output,
                             norm=(norm or NORMS[0]).lower())
    return EmbeddingTask(name=f"embedding:{output}", output=output,
                         norm=(norm or NORMS[0]).lower(), labels=labels, label_name=label_name,
                         headline="neighbour_label_agreement", row_local=False)


__all__ = ["EmbeddingTask", "check_neighbour_samples", "embedding_task",
                          "neighbours", "top_overlap"]
