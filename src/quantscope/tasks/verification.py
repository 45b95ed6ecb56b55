"""Face verification: the task that scores a face embedder on ``faces`` or a folder of
identity folders (:class:`VerificationTask`), and the data it reads (:func:`face_dataset`).

The chips are fed to the model's one RGB image input, channels first (``[N, 3, H, W]``) or
channels last (``[N, H, W, 3]``: a TensorFlow model converted by tf2onnx), in the chip style
of its size (150 px: dlib, 112 px: ArcFace). Decisions are compared with FP32's at the
style's threshold; when FP32 itself does not tell the faces apart (every embedding in
nearly one direction, or most impostor pairs matching at the threshold) a note says the
agreement says little, which ``run``'s verdict repeats as a ``warning:``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantscope.model.load import Model
from quantscope.numerics import sqnr_db
from quantscope.tasks import metrics as M
from quantscope.tasks.db_noise import Parts, unit_powers
from quantscope.types import Metrics, Outputs, PooledEmbedding, QuantscopeError, RowScoring

# FP32 accepting more than this share of the impostor pairs at the threshold does not
# verify faces on the data (a working face model's FAR there is a few per cent).
FP32_FAR_DEGENERATE = 0.5


FACE_FAR = 0.01


@dataclass(frozen=True, eq=False)
class VerificationTask:
    """Face verification at the style's threshold, plus pre_norm quality per slice.

    dlib style: Euclidean distance of raw descriptors < 0.6; arcface style: distance of
    L2-normalised embeddings < 1.1, with ``pre_norm`` (the norm before normalisation)
    per distance slice and the genuine match rate binned by it (``tasks.face_quality``).
    """

    name: str
    pairs: object  # tasks.faces.VerificationPairs
    threshold: float
    normalize: bool = False
    # per chip, the face it is of (a face's variants are no independent samples: the
    # noise of its embedding SQNR leaves out one face at a time); None: each chip its own
    faces: np.ndarray | None = None
    # per chip, the person it is of (face data: ``run`` holds out people, never a person's
    # chips on both sides: :mod:`quantscope.tasks.face_split`); None: not known
    identity: np.ndarray | None = None
    photo_names: tuple[str, ...] = ()  # the names :attr:`faces` indexes (a face's photo)

    headline = "decision_agreement"  # same-person decisions as FP32's, at the threshold
    higher_is_better = True
    goal_range = (0.0, 1.0)

    def row_scoring(self, output_names: Sequence[str] = ()) -> RowScoring | None:
        return None  # the analysis ranks by the embedding's fidelity

    def objective(self) -> PooledEmbedding | None:
        return None  # the raw descriptor: every float output

    def _embeddings(self, out: Outputs) -> np.ndarray:
        return np.concatenate([np.asarray(b[0], np.float32).reshape(len(b[0]), -1)
                               for b in out.batches])

    def sample_parts(self, ref: Outputs, test: Outputs) -> dict[str, Parts]:
        """The powers ``embedding_sqnr_db`` pools, summed per face (:attr:`faces`, else per
        chip: :func:`quantscope.tasks.db_noise.unit_powers`): the noise the planner's
        choice and ``run``'s held-out check read, once summed per person where the
        :attr:`identity` is known (:func:`quantscope.tasks.left_out.unit_parts`)."""
        er, et = self._embeddings(ref), self._embeddings(test)
        faces = np.arange(len(er)) if self.faces is None else self.faces
        if len(faces) != len(er):
            return {}
        return {"embedding_sqnr_db": unit_powers(
            er, et, faces, "chips" if self.faces is None else "faces")}

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        from quantscope.tasks.faces import SLICES, pair_distances, same_person

        er, et = self._embeddings(ref), self._embeddings(test)
        dr = pair_distances(er, self.pairs, normalize=self.normalize)
        dt = pair_distances(et, self.pairs, normalize=self.normalize)
        labels = self.pairs.genuine.astype(np.int64)
        values: dict[str, float] = {}
        tables: dict[str, dict[str, float]] = {}
        for name in SLICES:
            sel = self.pairs.distance == name
            if not sel.any():
                continue
            row = _slice_row(dr[sel], dt[sel], labels[sel], self.threshold)
            tables[f"faces_{name}"] = row
            values[f"tar@{self.threshold:g}_{name}"] = row["tar_at_threshold"]
        agree = M.decision_agreement(same_person(dr, self.threshold), same_person(dt, self.threshold))
        tf = M.tar_far_at_threshold(dt, labels, self.threshold)
        collapse = M.collapse_report(et, reference=er)
        norms = M.norm_stats(et)
        values.update({
            f"tar@{self.threshold:g}": tf.tar, f"far@{self.threshold:g}": tf.far,
            f"tar@far{FACE_FAR:g}": M.tar_at_far(dt, labels, FACE_FAR).tar,
            "decision_agreement": agree,
            # its items, the pairs decided (the plan search's noise reads them here)
            "decision_agreement_items": float(len(labels)),
            "embedding_cosine_mean": M.cosine_fidelity(er, et)["mean"],
            "embedding_sqnr_db": sqnr_db(er, et),
            "norm_mean": norms["mean"], "norm_cv": norms["cv"],
            "norm_cv_fp32": M.norm_stats(er)["cv"], "collapsed": float(collapse.collapsed),
        })
        quality_values, quality_tables = self._prenorm_quality(er, et, dt)
        values.update(quality_values)
        tables.update(quality_tables)
        verdict = M.resemblance_note(values["embedding_cosine_mean"])
        values["resembles_fp32"] = float(verdict is None)
        values[f"far@{self.threshold:g}_fp32"] = M.tar_far_at_threshold(
            dr, labels, self.threshold).far
        values["pairwise_cosine_fp32"] = M.mean_pairwise_cosine(er)
        notes = (*(f"collapse: {r}" for r in collapse.reasons), *([verdict] if verdict else []),
                 *filter(None, [self._fp32_degenerate(values, len(er))]))
        if "pre_norm_match_rate" in quality_tables:  # enough genuine pairs to bin
            notes += (_gate_note(values["pre_norm_gate"]),)
        return Metrics(values=values, tables=tables, notes=notes)

    def _fp32_degenerate(self, values: dict[str, float], n: int) -> str | None:
        """A note when FP32 itself does not verify faces on the data: its embeddings in
        nearly one direction, or most impostor pairs matching at the threshold. Every
        decision then agrees with FP32's whatever the quantization does."""
        far, mcos = values[f"far@{self.threshold:g}_fp32"], values["pairwise_cosine_fp32"]
        said = ([f"its {n} embeddings' mean pairwise cosine is {mcos:.4f}"]
                if mcos > M.COLLAPSE_MEAN_COSINE_NO_REF else [])
        if far > FP32_FAR_DEGENERATE:
            said.append(f"it matches {100 * far:.1f} % of the impostor pairs at {self.threshold:g}")
        if not said:
            return None
        return (f"FP32 itself does not tell these faces apart ({' and '.join(said)}): the "
                "decision agreement says little; check that the model takes the chips as "
                "they are fed (size, alignment and values: the data note; other values: "
                "data 'faces:PIXELS', e.g. 'faces:raw' for a graph that normalises 0..255 "
                "itself) and that its first output is the identity embedding")

    def _prenorm_quality(
        self, er: np.ndarray, et: np.ndarray, dt: np.ndarray
    ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """pre_norm per slice (test and FP32), genuine match rate by bin, the gate."""
        from quantscope.tasks import face_quality as Q
        from quantscope.tasks.faces import SLICES, pre_norms

        nr, nt = pre_norms(er), pre_norms(et)
        p = self.pairs
        tables: dict[str, dict[str, float]] = {}
        by_ref = Q.prenorm_by_slice(nr, p.second, p.distance, SLICES)
        for name, row in Q.prenorm_by_slice(nt, p.second, p.distance, SLICES).items():
            tables[f"pre_norm_{name}"] = {**row, **{f"{k}_fp32": v for k, v in by_ref[name].items()}}
        gen = p.genuine
        values = {"pre_norm_mean": float(nt.mean()), "pre_norm_gate": float("nan")}
        if gen.sum() >= Q.N_BINS:
            edges = Q.prenorm_edges(nr[p.second[gen]])
            bins = Q.match_rate_by_prenorm(nt[p.second[gen]], dt[gen] < self.threshold, edges)
            tables["pre_norm_match_rate"] = Q.bins_table(bins)
            values["pre_norm_gate"] = Q.quality_gate(bins)
        return values, tables


def _gate_note(gate: float) -> str:
    from quantscope.tasks.face_quality import GATE_TARGET

    if gate == -np.inf:
        return f"pre_norm gate: none needed (every pre_norm bin matches >= {GATE_TARGET:.0%})"
    if np.isnan(gate):
        return f"pre_norm gate: no pre_norm range reaches a {GATE_TARGET:.0%} match rate"
    return f"pre_norm gate: reject faces with pre_norm < {gate:.4g} (below it matches < {GATE_TARGET:.0%})"


def _slice_row(dr: np.ndarray, dt: np.ndarray, labels: np.ndarray, thr: float) -> dict[str, float]:
    t = M.tar_far_at_threshold(dt, labels, thr)
    t_ref = M.tar_far_at_threshold(dr, labels, thr)
    at = M.tar_at_far(dt, labels, FACE_FAR)
    gen = dt[labels == 1]
    return {
        "tar_at_threshold": t.tar, "far_at_threshold": t.far,
        "tar_at_threshold_fp32": t_ref.tar, "far_at_threshold_fp32": t_ref.far,
        f"tar_at_far{FACE_FAR:g}": at.tar,
        "genuine_distance_mean": float(gen.mean()) if gen.size else float("nan"),
        "genuine_distance_mean_fp32": float(dr[labels == 1].mean()) if gen.size else float("nan"),
        "n_genuine": float((labels == 1).sum()), "n_impostor": float((labels == 0).sum()),
    }


@dataclass(frozen=True)
class FaceFeed:
    """How face data feeds a model: the data's source, the chip style (``own``: the one the
    input size picks; ``style``: it with the declared pixels), channels last or first."""

    source: str
    own: Any  # tasks.faces.FaceStyle
    style: Any
    last: bool
    input: str  # the model's one image input
    rows: int | None  # its static sample count (a static export runs that many at a time)

    def pixels(self) -> str:
        """The chips' pixels made input values, in words (the host repeats it)."""
        s = self.style
        order = "BGR" if s.pixels.bgr else "RGB"
        size = f"{s.chip_size} x {s.chip_size}"
        return (f"aligned {s.name} chips of {size} px, {order}"
                f"{', channels last' if self.last else ''}, {s.pixels.formula()}")


def face_feed(spec: str, model: Model) -> FaceFeed:
    """What face data ``spec`` feeds ``model`` (one clear line when it cannot)."""
    from quantscope.tasks.faces import face_spec, style_for_input

    source, pixels = face_spec(spec) or (spec, None)
    names = model.input_names()
    shape = tuple(model.value_shapes().get(names[0], ()))
    last = len(shape) == 4 and shape[3] == 3 and shape[1] != 3  # NHWC: a TF export's
    if len(names) != 1 or len(shape) != 4 or not (shape[1] == 3 or last):
        raise QuantscopeError(
            f"data '{spec}' is face images but the model's inputs are {', '.join(names)} "
            f"{shape}: use a face model with one RGB image input, [N, 3, H, W] or "
            "[N, H, W, 3] (e.g. dlib-face, mobilefacenet)"
        )
    own = style_for_input((shape[0], 3, shape[1], shape[2]) if last else shape)
    rows = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else None
    return FaceFeed(source, own, own.with_pixels(pixels) if pixels else own, last, names[0],
                    rows)


def face_dataset(
    spec: str, model: Model, *, batch_size: int = 32
) -> tuple[tuple[dict[str, np.ndarray], ...], tuple[dict[str, np.ndarray], ...], VerificationTask, str]:
    from quantscope.tasks.faces import (
        check_embedding_output,
        face_batches,
        load_faces,
        verification_pairs,
    )

    feed = face_feed(spec, model)
    source, own, style, last, name = feed.source, feed.own, feed.style, feed.last, feed.input
    check_embedding_output(spec, model.output_names()[0], model.value_shapes())
    faces = load_faces(source, style.name)
    batch_size = feed.rows or batch_size
    batches = tuple({name: np.ascontiguousarray(b.transpose(0, 2, 3, 1)) if last else b}
                    for b in face_batches(faces, batch_size, style))
    task = VerificationTask(name=f"verification:{spec}", pairs=verification_pairs(faces),
                            threshold=style.threshold, normalize=style.normalize,
                            faces=faces.photo, identity=faces.identity,
                            photo_names=faces.photo_names)
    lo = min(float(b[name].min()) for b in batches)
    hi = max(float(b[name].max()) for b in batches)
    fed = (f"{'BGR' if style.pixels.bgr else 'RGB'}, {style.pixels.formula()}, as declared "
           f"(the {own.name} style's own: {own.pixels.formula()})" if style.declared else
           f"the {style.name} style's {style.pixels.formula()}; for other values give the "
           f"data as '{source}:PIXELS', e.g. '{source}:raw'")
    note = (f"faces: {len(faces.chips)} aligned {style.name} chips"
            f"{' (channels last, as the input takes them)' if last else ''} of values "
            f"{lo:.3g} .. {hi:.3g} ({fed}), {len(task.pairs)} pairs; "
            "calibration uses the same chips (the built-in set is small)")
    return batches, batches, task, note
