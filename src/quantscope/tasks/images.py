"""``photos``: image retrieval across augmented views of real photos shipped in packages.

=============  ========================================================================
photos         18 sample photos bundled in the scikit-image 0.26.0 wheel
               (``skimage/data``, read as files: scikit-image is not imported and
               nothing is downloaded; each file's SHA-256 is checked against
               :data:`SKIMAGE_PHOTOS`) + the 18 ``orig`` face chips of the built-in
               ``faces`` set (``quantscope/data/faces``, see its SOURCES.json)
subset         ``photos-small``: every 3rd photo (12 photos, 36 views; for ``analyze``)
views          per photo, :data:`VIEWS` evaluation views and one calibration view, each
               from a seeded generator (:data:`SEED`; calibration views use another
               seed): random resized crop (area 35-100 %, aspect 3/4-4/3), horizontal
               flip (p 0.5), colour jitter (brightness, contrast, saturation x0.7-1.3),
               JPEG re-encode (p 0.5, quality 30-90), downscale (p 0.3, to 56-112 px and
               back); every view 224 x 224 RGB
task           every view is a query; the gallery is every other view; a hit when the
               nearest gallery view (cosine) is a view of the same photo
embedding      CLS token of a [B, T, C] token output (``tokens[:, 0]``), or a [B, D]
               output as is; the mean of the patch tokens is reported as a variant
metrics        recall@1 (and FP32's), top-1 agreement with FP32 (same nearest view; over
               ``top1_agreement_items`` views, :mod:`quantscope.tasks.shares`),
               embedding cosine to FP32 and SQNR, collapse; ``recall@1_patch_mean``
=============  ========================================================================

Frozen: the source files are checked by hash and the views depend only on them, the seed
and Pillow's JPEG codec; :func:`views_digest` (printed in the dataset notes) tells whether
two machines made the same pixels.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from quantscope.model.load import Model
from quantscope.numerics import sqnr_db
from quantscope.tasks import metrics as M
from quantscope.tasks.db_noise import Parts, unit_powers
from quantscope.tasks.neighbours import neighbours
from quantscope.tasks.pixels import MAKE_TENSORS
from quantscope.tasks.shares import items_key
from quantscope.tasks.unscored import embedding_note
from quantscope.types import (
    Batch,
    Dataset,
    Metrics,
    Outputs,
    PooledEmbedding,
    QuantscopeError,
    RowScoring,
)

if TYPE_CHECKING:
    from PIL import Image

SPEC = "photos"
SMALL_SPEC = "photos-small"  # every 3rd photo (12 photos, 36 views): for analyze sweeps
SMALL_STEP = 3
SEED, CALIB_SEED = 2026, 7
VIEWS = 3
SIZE = 224
SKIMAGE = ("scikit-image", "0.26.0")
SKIMAGE_PHOTOS: dict[str, str] = {  # file in skimage/data -> SHA-256 of the file
    "astronaut.png": "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
    "brick.png": "7966caf324f6ba843118d98f7a07746d22f6a343430add0233eca5f6eaaa8fcf",
    "camera.png": "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a",
    "cell.png": "8d23a7fb81f7cc877cd09f330357fc7f595651306e84e17252f6e0a1b3f61515",
    "chelsea.png": "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",
    "clock_motion.png": "f029226b28b642e80113d86622e9b215ee067a0966feaf5e60604a1e05733955",
    "coffee.png": "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",
    "coins.png": "f8d773fc9cfa6f4d8e5942dc34d0a0788fcaed2a4fefbbed0aef5398d7ef4cba",
    "grass.png": "b6b6022426b38936c43a4ac09635cd78af074e90f42ffa8227ac8b7452d39f89",
    "gravel.png": "c48615b451bf1e606fbd72c0aa9f8cc0f068ab7111ef7d93bb9b0f2586440c12",
    "hubble_deep_field.jpg": "3a19c5dd8a927a9334bb1229a6d63711b1c0c767fb27e2286e7c84a3e2c2f5f4",
    "ihc.png": "f8dd1aa387ddd1f49d8ad13b50921b237df8e9b262606d258770687b0ef93cef",
    "moon.png": "78739619d11f7eb9c165bb5d2efd4772cee557812ec847532dbb1d92ef71f577",
    "motorcycle_left.png": "db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179",
    "page.png": "341a6f0a61557662b02734a9b6e56ec33a915b2c41886b97509dedf2a43b47a3",
    "retina.jpg": "38a07f36f27f095e818aea7b96d34202c05176d30253c66733f2e00379e9e0e6",
    "rocket.jpg": "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c",
    "text.png": "bd84aa3a6e3c9887850d45d606c96b2e59433fbef50338570b63c319e668e6d1",
}


@dataclass(frozen=True)
class PhotoViews:
    """Views (uint8 [M, 224, 224, 3]) with the photo each comes from."""

    views: np.ndarray
    photo: np.ndarray  # int32 [M]
    photo_names: tuple[str, ...]
    provenance: str


def _skimage_photo(name: str) -> Image.Image:
    from PIL import Image

    try:
        dist = importlib.metadata.distribution(SKIMAGE[0])
    except importlib.metadata.PackageNotFoundError:
        raise QuantscopeError(f"data '{SPEC}' needs the sample photos of {SKIMAGE[0]}=="
                              f"{SKIMAGE[1]}: pip install 'quantscope[models]'") from None
    path = Path(str(dist.locate_file(f"skimage/data/{name}")))
    data = path.read_bytes() if path.is_file() else b""
    if hashlib.sha256(data).hexdigest() != SKIMAGE_PHOTOS[name]:
        raise QuantscopeError(f"data '{SPEC}': skimage/data/{name} of {SKIMAGE[0]} "
                              f"{dist.version} is missing or differs from the frozen one "
                              f"({SKIMAGE[0]}=={SKIMAGE[1]})")
    return Image.open(io.BytesIO(data)).convert("RGB")


def source_photos() -> tuple[list[Image.Image], tuple[str, ...]]:
    """The photos (PIL RGB) and their names: scikit-image samples, then face chips."""
    from PIL import Image

    from quantscope.tasks.faces import load_builtin_faces

    photos = [_skimage_photo(n) for n in SKIMAGE_PHOTOS]
    faces = load_builtin_faces()
    orig = np.flatnonzero(faces.variant == "orig")
    photos += [Image.fromarray(faces.chips[i]) for i in orig]
    names = tuple(SKIMAGE_PHOTOS) + tuple(f"faces/{faces.photo_names[faces.photo[i]]}"
                                          for i in orig)
    return photos, names


def augment(photo: Image.Image, rng: np.random.Generator) -> np.ndarray:
    """One view: crop, flip, colour jitter, JPEG, downscale (see the module table)."""
    from PIL import Image, ImageEnhance

    w, h = photo.size
    area, aspect = rng.uniform(0.35, 1.0) * w * h, np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    cw, ch = min(w, int(round(np.sqrt(area * aspect)))), min(h, int(round(np.sqrt(area / aspect))))
    x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    im = photo.crop((x0, y0, x0 + cw, y0 + ch)).resize((SIZE, SIZE), Image.BICUBIC)
    if rng.random() < 0.5:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        im = enhance(im).enhance(float(rng.uniform(0.7, 1.3)))
    if rng.random() < 0.5:
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=int(rng.integers(30, 91)))
        im = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    if rng.random() < 0.3:
        side = int(rng.integers(56, 113))
        im = im.resize((side, side), Image.BILINEAR).resize((SIZE, SIZE), Image.BILINEAR)
    return np.asarray(im, dtype=np.uint8)


def make_views(views: int = VIEWS, seed: int = SEED, photos: int | None = None,
               step: int = 1) -> PhotoViews:
    """``views`` seeded views of each photo (every ``step``-th of the first ``photos``)."""
    sources, names = source_photos()
    sources, names = sources[:photos:step], names[:photos:step]
    rng = np.random.default_rng(seed)
    out = np.stack([augment(p, rng) for p in sources for _ in range(views)])
    photo = np.repeat(np.arange(len(sources), dtype=np.int32), views)
    prov = (f"{len(sources)} photos ({SKIMAGE[0]}=={SKIMAGE[1]} skimage/data samples, "
            f"SHA-256 checked, + built-in face chips) x {views} views, seed {seed}; "
            f"views sha256 {views_digest(out)[:16]}")
    return PhotoViews(views=out, photo=photo, photo_names=names, provenance=prov)


def views_digest(views: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(views).tobytes()).hexdigest()


def _embeddings(out: Outputs, *, variant: str = "cls") -> np.ndarray:
    """Per view: the CLS token ([B, T, C] outputs) or the output itself ([B, D])."""
    rows = []
    for b in out.batches:
        x = np.asarray(b[0], np.float64)
        if x.ndim == 3:
            x = x[:, 0] if variant == "cls" else x[:, 1:].mean(axis=1)
        rows.append(x.reshape(len(x), -1))
    return np.concatenate(rows)


def nearest_other(emb: np.ndarray) -> np.ndarray:
    """Index of each row's nearest other row by cosine (ties: lowest index)."""
    return neighbours(emb)[0]


@dataclass(frozen=True, eq=False)
class ViewRetrievalTask:
    """Each view must retrieve another view of the same photo among all other views."""

    name: str
    photo: np.ndarray  # int32 [M]: photo of each evaluation view

    headline = "top1_agreement"  # the same nearest other view as FP32's
    higher_is_better = True
    goal_range = (0.0, 1.0)

    def row_scoring(self, output_names: Sequence[str] = ()) -> RowScoring | None:
        return None  # the analysis ranks by the outputs' fidelity

    def objective(self) -> PooledEmbedding | None:
        return None

    def keep(self, outputs: tuple[np.ndarray, ...], feeds: Batch) -> tuple[np.ndarray, ...]:
        """What :meth:`metrics` reads of one batch (evaluation streams them): of a
        [B, T, C] first output, the CLS token and the patch-token mean, in float64 as
        :func:`_embeddings` computes them ([B, 2, C]: the mean of the one kept mean is
        itself, so the embeddings are the same bit for bit)."""
        del feeds
        if np.ndim(outputs[0]) != 3:
            return outputs
        x = np.asarray(outputs[0], np.float64)
        return (np.stack([x[:, 0], x[:, 1:].mean(axis=1)], axis=1), *outputs[1:])

    def _recall(self, emb: np.ndarray) -> tuple[float, np.ndarray]:
        nn = nearest_other(emb)
        return float(np.mean(self.photo[nn] == self.photo)), nn

    def sample_parts(self, ref: Outputs, test: Outputs) -> dict[str, Parts]:
        """The powers ``embedding_sqnr_db`` pools, summed per photo (a photo's views are
        no independent samples: :func:`quantscope.tasks.db_noise.unit_powers`): the
        noise the planner's choice and ``run``'s held-out check read."""
        er, et = _embeddings(ref), _embeddings(test)
        if len(er) != len(self.photo):
            return {}
        return {"embedding_sqnr_db": unit_powers(er, et, self.photo, "photos")}

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        er, et = _embeddings(ref), _embeddings(test)
        (rec_ref, nn_ref), (rec, nn) = self._recall(er), self._recall(et)
        fid = M.cosine_fidelity(er, et)
        collapse = M.collapse_report(et, reference=er)
        values = {
            "recall@1": rec, "recall@1_fp32": rec_ref,
            "top1_agreement": float(np.mean(nn == nn_ref)),
            items_key("top1_agreement"): float(len(nn)),  # one pick per view
            "recall@1_patch_mean": self._recall(_embeddings(test, variant="mean"))[0],
            "recall@1_patch_mean_fp32": self._recall(_embeddings(ref, variant="mean"))[0],
            "embedding_cosine_mean": fid["mean"], "embedding_cosine_min": fid["min"],
            "embedding_sqnr_db": sqnr_db(er, et),
            "norm_cv": M.norm_stats(et)["cv"], "norm_cv_fp32": M.norm_stats(er)["cv"],
            "collapsed": float(collapse.collapsed),
        }
        verdict = M.resemblance_note(float(fid["mean"]), agreement=values["top1_agreement"],
                                     candidates=len(er) - 1)
        values["resembles_fp32"] = float(verdict is None)
        notes = (*(f"collapse: {r}" for r in collapse.reasons), *([verdict] if verdict else []))
        return Metrics(values=values, notes=notes)


def _not_an_embedding(model: Model) -> str | None:
    """Why the model's first output is no embedding the retrieval can read (a YOLO head's
    first row is its box centres; a per-pixel Softmax is a segmentation), else None."""
    from quantscope.tasks.classes import class_output
    from quantscope.tasks.detection import detect_layout

    out = model.output_names()[0]
    if detect_layout(model, out) is not None:
        return f"'{out}' is a detection head (4 box rows, then class rows)"
    rank = len(model.value_shapes().get(out) or ())
    if rank > 2 and class_output(model, out) == 1:
        return f"'{out}' is class scores per position (a Softmax over its axis 1)"
    return None


def image_dataset(model: Model, *, batch_size: int = 12, spec: str = SPEC) -> Dataset:
    """The built-in ``photos`` (or ``photos-small``) retrieval set for a model with one
    [B, 3, 224, 224] input."""
    from quantscope.zoo.vit import preprocess_image

    names = model.input_names()
    shape = model.value_shapes().get(names[0], ())
    if len(names) != 1 or len(shape) != 4 or tuple(shape[1:]) != (3, SIZE, SIZE):
        raise QuantscopeError(
            f"data '{SPEC}' is 224x224 RGB images but the model's inputs are "
            f"{', '.join(names)} {list(shape)}: it scores an image embedder's retrieval "
            "(one [B, 3, 224, 224] input, e.g. dinov2-s14); for another image model (a "
            f"detector, landmarks, a face or segmentation map) {MAKE_TENSORS} and declare its "
            "outputs with --layout")
    if isinstance(shape[0], int) and shape[0] > 0:  # a static export runs that many at a time
        batch_size = shape[0]
    head = _not_an_embedding(model)
    if head:
        raise QuantscopeError(
            f"data '{SPEC}' scores an image embedder's retrieval on the model's first output, "
            f"but {head}: {MAKE_TENSORS} and give --data data.npz (its outputs are then "
            "read as detections, class scores or plain tensors)")
    step = SMALL_STEP if spec == SMALL_SPEC else 1
    evaluation = make_views(step=step)
    calib = make_views(views=1, seed=CALIB_SEED, step=step)

    def batches(v: np.ndarray) -> tuple[dict[str, np.ndarray], ...]:
        return tuple({names[0]: preprocess_image(v[i:i + batch_size])}
                     for i in range(0, len(v), batch_size))

    task = ViewRetrievalTask(name=f"view-retrieval:{spec}", photo=evaluation.photo)
    subset = f" (every {step}th photo)" if step > 1 else ""
    notes = (f"{spec}: {evaluation.provenance}{subset}; calibration: 1 other view per photo "
             f"(seed {CALIB_SEED}); preprocessing: ImageNet mean/std",
             *filter(None, [embedding_note(model.proto, "view retrieval")]))
    return Dataset(name=spec, calibration=batches(calib.views),
                   evaluation=batches(evaluation.views), task=task, notes=notes)
