"""Face alignment to the ArcFace 5-point 112x112 template (numpy + Pillow).

=================  ================================================================
template           :data:`ARCFACE_TEMPLATE`, insightface's ``arcface_dst``: eye
                   centres, nose tip, mouth corners (image-left first) in a
                   112x112 chip
landmarks          five points from dlib's 68-point shape predictor
                   (:func:`five_points_from_68`: mean of each eye's six points,
                   nose tip 30, mouth corners 48 and 54)
transform          least-squares similarity (rotation, uniform scale, shift;
                   Umeyama 1991, as insightface's ``estimate_norm``)
warp               Pillow affine resampling, bilinear, black outside the photo
=================  ================================================================
"""

from __future__ import annotations

import numpy as np

from quantscope.types import QuantscopeError

__all__ = [
    "ARCFACE_TEMPLATE",
    "align_arcface",
    "five_points_from_68",
    "similarity_transform",
    "warp_affine",
]

ARCFACE_SIZE = 112
ARCFACE_TEMPLATE = np.array(
    [[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366],
     [41.5493, 92.3655], [70.7299, 92.2041]], dtype=np.float64,
)  # fmt: skip


def five_points_from_68(points: np.ndarray) -> np.ndarray:
    """dlib 68-point landmarks [68, 2] (x, y) -> ArcFace's five points [5, 2]."""
    p = np.asarray(points, np.float64)
    if p.shape != (68, 2):
        raise QuantscopeError(f"expected 68 landmarks (x, y), got shape {p.shape}")
    return np.stack([p[36:42].mean(0), p[42:48].mean(0), p[30], p[48], p[54]])


def similarity_transform(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The 2x3 similarity matrix ``M`` minimising ``sum |M [src; 1] - dst|^2`` (Umeyama)."""
    src, dst = np.asarray(src, np.float64), np.asarray(dst, np.float64)
    if src.shape != dst.shape or src.ndim != 2 or src.shape[1] != 2 or src.shape[0] < 2:
        raise QuantscopeError(f"need matching [K>=2, 2] point sets, got {src.shape} {dst.shape}")
    mu_s, mu_d = src.mean(0), dst.mean(0)
    s, d = src - mu_s, dst - mu_d
    cov = d.T @ s / len(src)
    u, sig, vt = np.linalg.svd(cov)
    sign = np.diag([1.0, np.sign(np.linalg.det(u) * np.linalg.det(vt)) or 1.0])
    rot = u @ sign @ vt
    var = (s**2).sum() / len(src)
    if var == 0:
        raise QuantscopeError("landmarks are all at one point")
    scale = float(np.trace(np.diag(sig) @ sign)) / var
    shift = mu_d - scale * rot @ mu_s
    return np.hstack([scale * rot, shift[:, None]])


def warp_affine(image: np.ndarray, matrix: np.ndarray, size: int) -> np.ndarray:
    """``image`` (uint8 HxWx3) resampled so that output(p) = image(M^-1 p), bilinear."""
    from PIL import Image

    full = np.vstack([np.asarray(matrix, np.float64), [0.0, 0.0, 1.0]])
    # Pillow puts pixel centres at i + 0.5, landmarks (and cv2) at i: shift in and out
    half, back = np.eye(3), np.eye(3)
    half[:2, 2], back[:2, 2] = 0.5, -0.5
    inv = np.linalg.inv(half @ full @ back)[:2]
    coeffs = tuple(float(v) for v in inv.ravel())
    warped = Image.fromarray(np.asarray(image, np.uint8)).transform(
        (size, size), Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR
    )
    return np.asarray(warped)


def align_arcface(image: np.ndarray, five: np.ndarray, size: int = ARCFACE_SIZE) -> np.ndarray:
    """Aligned RGB chip [size, size, 3]: the five points moved onto the ArcFace template."""
    template = ARCFACE_TEMPLATE * (size / ARCFACE_SIZE)
    return warp_affine(image, similarity_transform(five, template), size)
