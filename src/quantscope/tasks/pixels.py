"""Images you bring -> tensor data (``quantscope images``).

A detector, classifier or segmenter is calibrated and scored on tensor data (``.npz``),
and until now the user turned a folder of photos into it by hand. :func:`images_to_arrays`
does it by a preprocessing the user **declares** (:class:`Pixels`, ``--pixels``): how a
model was trained to see pixels is not in the ONNX file, and a wrong normalisation is a
deployment bug of its own (field report 002: std 127.5 for 128), so nothing is guessed.

=====================  ============================================================
``scale=S``            pixel values (0..255) are divided by S first (YOLO: 255)
``mean=M`` ``std=D``   then ``(x - M) / D``; one value or one per channel, ``/``
                       between them (ImageNet: ``scale=255,mean=0.485/0.456/0.406,
                       std=0.229/0.224/0.225``; ArcFace: ``mean=127.5,std=128``)
``bgr``                channels in BGR order (OpenCV-trained models: PaddleOCR)
``resize=R``           ``stretch`` (default: to H×W, the aspect ratio lost),
                       ``letterbox`` (aspect kept, padded with ``pad=114`` at the
                       bottom/right, YOLO style), ``crop`` (short side to the size,
                       centre crop)
``raw``                the pixels as they are (0..255): an integer input (uint8, or
                       TF MoveNet's int32), or a graph that normalises them itself
=====================  ============================================================

The input (its name, channels first or last, 1 or 3 channels, H and W) is read from the
model: the one rank-4 input with a channel axis of 1 or 3, at its declared size or the
``--input-shape`` given. Images are read with Pillow, turned upright by their EXIF
orientation, converted to RGB (or grey for one channel) and resized bilinearly.
The description (:meth:`Pixels.describe`) is written beside the arrays
(``NAME.pixels.json``), and every command given that ``.npz`` says it (:func:`pixels_note`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quantscope.model.load import Model
from quantscope.types import QuantscopeError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
RESIZES = ("stretch", "letterbox", "crop")
PIXELS_EXAMPLES = ("scale=255 (YOLO), scale=255,mean=0.485/0.456/0.406,std=0.229/0.224/0.225 "
                   "(ImageNet), mean=127.5,std=128 (ArcFace), raw (0..255 as they are)")
MAKE_TENSORS = ("make tensor data of your images with 'quantscope images FOLDER --model MODEL "
                "--pixels SPEC --out data.npz' (their preprocessing declared)")
"""How a refusal of image data says to make tensors of a user's images (one place)."""
SIDECAR = ".pixels.json"  # NAME.npz -> NAME.pixels.json
PIXELS_FORMAT = "quantscope.pixels/1"


@dataclass(frozen=True)
class Pixels:
    """How a pixel (0..255) becomes an input value: ``(p / scale - mean) / std``."""

    scale: float = 1.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    bgr: bool = False
    resize: str = "stretch"
    pad: int = 114
    raw: bool = False

    def describe(self, height: int, width: int, channels: int = 3) -> str:
        """How a pixel became an input value; a 1-channel input's images are made grey
        (Pillow's ``L``), which is said: a host feeding it another grey conversion, or
        colour, does not feed what was measured."""
        order = ("grey (Pillow's L: 0.299 R + 0.587 G + 0.114 B)" if channels == 1 else
                 "BGR" if self.bgr else "RGB")
        size = {"stretch": f"stretched to {width}x{height}",
                "letterbox": f"letterboxed to {width}x{height} (aspect kept, pad {self.pad})",
                "crop": f"short side to {min(height, width)}, centre crop {width}x{height}",
                }[self.resize]
        return f"{order}, {size}, {self.formula()}"

    def formula(self) -> str:
        """How a pixel's value becomes the input's, in words (no order, no size)."""
        if self.raw:
            return "pixels 0..255 as they are"
        x = "x" if self.scale == 1 else f"x / {self.scale:g}"
        if any(self.mean):
            x = f"({x} - {'/'.join(f'{m:g}' for m in self.mean)})"
        if any(s != 1 for s in self.std):
            x = f"{x} / {'/'.join(f'{s:g}' for s in self.std)}"
        return f"x = pixel 0..255, input = {x}"


def _floats(key: str, text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split("/"))
    except ValueError:
        values = ()
    if not values or len(values) not in (1, 3) or not all(np.isfinite(values)):
        raise QuantscopeError(f"--pixels {key}={text}: give one number or three with '/' "
                              f"between them (e.g. {key}=0.485/0.456/0.406)")
    return values


def parse_pixels(text: str) -> Pixels:
    """``--pixels``: comma-separated ``scale=``, ``mean=``, ``std=``, ``resize=``, ``pad=``,
    ``bgr``/``rgb``, ``raw`` (module docstring)."""
    fields: dict[str, object] = {}
    for part in (p.strip() for p in text.split(",")):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        field = "bgr" if key == "rgb" else key
        if field in fields:  # the last would win, silently (scale=255,scale=1)
            raise QuantscopeError(f"--pixels '{text}' gives {'bgr/rgb' if field == 'bgr' else key}"
                                  " twice: give it once")
        if not sep and key in ("bgr", "rgb", "raw"):
            fields["bgr" if key != "raw" else "raw"] = key != "rgb"
        elif sep and key == "scale":
            (scale,) = _floats(key, value)[:1]
            if scale <= 0:
                raise QuantscopeError(f"--pixels scale={value}: give a number above 0 "
                                      "(255 maps 0..255 to 0..1)")
            fields["scale"] = scale
        elif sep and key in ("mean", "std"):
            fields[key] = _floats(key, value)
        elif sep and key == "resize":
            if value not in RESIZES:
                raise QuantscopeError(f"--pixels resize={value}: give one of "
                                      f"{', '.join(RESIZES)}")
            fields["resize"] = value
        elif sep and key == "pad":
            if not value.isdigit() or int(value) > 255:
                raise QuantscopeError(f"--pixels pad={value}: give a pixel value 0..255")
            fields["pad"] = int(value)
        else:
            raise QuantscopeError(f"--pixels '{part}' is not understood: give scale=, mean=, "
                                  f"std=, resize=, pad=, bgr or raw, e.g. {PIXELS_EXAMPLES}")
    pixels = Pixels(**fields)  # type: ignore[arg-type]
    if any(s == 0 for s in pixels.std):
        raise QuantscopeError("--pixels std=0 would divide by zero: give the std the model "
                              "was trained with")
    if pixels.raw and ({"scale", "mean", "std"} & fields.keys()):
        raise QuantscopeError("--pixels raw keeps the pixels as they are: leave out scale=, "
                              "mean= and std= (or leave out raw)")
    return pixels


@dataclass(frozen=True)
class ImageInput:
    """The model input images fill."""

    name: str
    channels_first: bool
    channels: int
    height: int
    width: int
    dtype: str  # numpy dtype name


# Integer input types that hold a pixel's 0..255 exactly: a graph that takes the pixels
# as they are and casts them itself (uint8; TF MoveNet's int32 ``input [1, 192, 192, 3]``).
INTEGER_PIXELS = ("uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")


def _dtype(model: Model, name: str) -> str:
    import onnx

    elem = model.value_types().get(name, onnx.TensorProto.FLOAT)
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name
    except (KeyError, TypeError, ValueError):
        return "unknown"


def image_input(model: Model, shapes: Mapping[str, tuple[int, ...]] | None = None
                ) -> ImageInput:
    """The one rank-4 input with 1 or 3 channels first or last; its H and W from
    ``shapes`` (``--input-shape``) or as declared."""
    shapes = shapes or {}
    declared = model.value_shapes()
    names = model.input_names()
    found: list[ImageInput] = []
    for name in names:
        shape = tuple(shapes.get(name) or declared.get(name) or ())
        if len(shape) != 4:
            continue
        first, last = shape[1] in (1, 3), shape[3] in (1, 3)
        if first == last:  # neither, or both (ambiguous)
            if first:
                raise QuantscopeError(
                    f"input '{name}' {_shape(shape)}: both axis 1 and axis 3 could hold the "
                    "channels: give the images as a .npz you make yourself")
            continue
        h, w = (shape[2], shape[3]) if first else (shape[1], shape[2])
        if not (isinstance(h, int) and isinstance(w, int)):
            c = shape[1] if first else shape[3]
            example = f"1x{c}x640x640" if first else f"1x640x640x{c}"
            raise QuantscopeError(
                f"input '{name}' {_shape(shape)} has no fixed height and width: give the "
                f"size the model runs at, --input-shape {name}={example}")
        found.append(ImageInput(name, first, int(shape[1] if first else shape[3]), h, w,
                                _dtype(model, name)))
    if not found:
        shown = ", ".join(f"'{n}' {_shape(tuple(declared.get(n) or ()))}" for n in names)
        raise QuantscopeError(f"no model input takes images (a rank-4 input with 1 or 3 "
                              f"channels first or last; inputs: {shown}): give tensor data "
                              "(.npz) instead")
    if len(names) > 1:
        others = [n for n in names if n != found[0].name]
        raise QuantscopeError(
            f"the model has inputs besides '{found[0].name}' ({', '.join(others)}): images fill "
            "one input; make a .npz with every input yourself")
    inp = found[0]
    if inp.dtype not in ("float32", "float16", "float64", *INTEGER_PIXELS):
        raise QuantscopeError(f"input '{inp.name}' takes {inp.dtype}, not pixels: give tensor "
                              "data (.npz) instead")
    return inp


def _shape(shape: tuple) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def image_files(folder: Path) -> list[Path]:
    """The images in ``folder`` (not its sub-folders), sorted by name."""
    if not folder.is_dir():
        raise QuantscopeError(f"images folder '{folder}' does not exist or is not a folder: "
                              "check the path")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    special = [p for p in files if not p.is_file()]
    if special:
        raise QuantscopeError(f"images folder '{folder}' holds '{special[0].name}', which is "
                              "not a regular file: remove it or move the images elsewhere")
    if not files:
        if any(p.is_dir() for p in folder.iterdir()):
            raise QuantscopeError(
                f"images folder '{folder}' has no images of its own, only sub-folders: give "
                "the folder that holds the images (a folder of identity folders is face "
                "data: give it to --data directly)")
        raise QuantscopeError(f"images folder '{folder}' has no images "
                              f"({', '.join(IMAGE_SUFFIXES)}): add some")
    return files


def _resized(img: object, inp: ImageInput, pixels: Pixels) -> object:
    from PIL import Image

    w, h = img.size  # type: ignore[attr-defined]
    bilinear = Image.Resampling.BILINEAR
    if pixels.resize == "stretch":
        return img.resize((inp.width, inp.height), bilinear)  # type: ignore[attr-defined]
    if pixels.resize == "letterbox":
        r = min(inp.width / w, inp.height / h)
        nw, nh = max(1, round(w * r)), max(1, round(h * r))
        fill = pixels.pad if img.mode == "L" else (pixels.pad,) * 3  # type: ignore[attr-defined]
        canvas = Image.new(img.mode, (inp.width, inp.height), fill)  # type: ignore[attr-defined]
        canvas.paste(img.resize((nw, nh), bilinear), (0, 0))  # type: ignore[attr-defined]
        return canvas
    r = max(inp.width / w, inp.height / h)  # crop: cover, then the centre
    nw, nh = max(inp.width, round(w * r)), max(inp.height, round(h * r))
    big = img.resize((nw, nh), bilinear)  # type: ignore[attr-defined]
    left, top = (nw - inp.width) // 2, (nh - inp.height) // 2
    return big.crop((left, top, left + inp.width, top + inp.height))


def skipped_files(folder: Path) -> list[str]:
    """The regular files of ``folder`` that are not images by their suffix (not hidden
    ones): left out by :func:`image_files`, and said."""
    return sorted(p.name for p in folder.iterdir() if p.is_file() and not
                  p.name.startswith(".") and p.suffix.lower() not in IMAGE_SUFFIXES)


def see_through(img: object) -> float:
    """The share of a Pillow image's pixels that are not opaque (an alpha channel or a
    palette's transparent colour; 0.0 without): converting it to RGB or grey drops it."""
    if getattr(img, "mode", "") not in ("RGBA", "LA", "PA") and \
            "transparency" not in getattr(img, "info", {}):
        return 0.0
    a = np.asarray(img.convert("RGBA").getchannel("A"))  # type: ignore[attr-defined]
    return float(np.mean(a < 255)) if a.size else 0.0


def read_image(path: Path, inp: ImageInput, pixels: Pixels,
               alpha: list[str] | None = None) -> np.ndarray:
    """One image as the input's sample: ``[C, H, W]`` or ``[H, W, C]``; its name and the
    share of its pixels that are not opaque added to ``alpha`` when it has transparency
    (dropped: the colours stored under it are read)."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            if alpha is not None and (share := see_through(opened)) > 0.0:
                alpha.append(f"{path.name}: {share:.2%} of its pixels")
            img = ImageOps.exif_transpose(opened).convert("L" if inp.channels == 1 else "RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise QuantscopeError(f"image '{path}' cannot be read ({type(exc).__name__}: "
                              f"{str(exc)[:80]}): remove it or save it again") from None
    a = np.asarray(_resized(img, inp, pixels), dtype=np.float32)
    a = normalised(a[:, :, None] if a.ndim == 2 else a, pixels)
    return np.ascontiguousarray(a.transpose(2, 0, 1) if inp.channels_first else a)


def normalised(pixels_hwc: np.ndarray, pixels: Pixels) -> np.ndarray:
    """Pixel values 0..255, channels last (``[..., H, W, C]``, RGB), as ``pixels`` makes
    them an input's values: float32, channels still last (BGR when it says so)."""
    a = np.asarray(pixels_hwc, dtype=np.float32)
    if pixels.bgr and a.shape[-1] == 3:
        a = a[..., ::-1]
    if not pixels.raw:
        a = (a / np.float32(pixels.scale) - np.asarray(pixels.mean, np.float32)) \
            / np.asarray(pixels.std, np.float32)
    return a


def check_pixels(pixels: Pixels, inp: ImageInput) -> None:
    """An integer input takes raw pixels; per-channel values match the channels."""
    if inp.dtype in INTEGER_PIXELS and not pixels.raw:
        raise QuantscopeError(f"input '{inp.name}' takes {inp.dtype} pixels (the graph "
                              "normalises them itself): give --pixels raw")
    for key, values in (("mean", pixels.mean), ("std", pixels.std)):
        if len(values) not in (1, inp.channels):
            raise QuantscopeError(f"--pixels {key}= gives {len(values)} values; input "
                                  f"'{inp.name}' has {inp.channels} channel(s): give one value "
                                  f"or {inp.channels}")


@dataclass(frozen=True)
class Images:
    """What :func:`images_to_arrays` made: the arrays and how."""

    arrays: dict[str, np.ndarray]
    input: ImageInput
    files: tuple[Path, ...]
    description: str
    skipped: tuple[str, ...] = ()  # files of the folder that are no image by their suffix
    alpha: tuple[str, ...] = ()  # images whose transparency was dropped (and how much)

    def record(self, folder: Path) -> dict[str, object]:
        """The sidecar's content (``NAME.pixels.json``)."""
        a = self.arrays[self.input.name]
        return {"format": PIXELS_FORMAT, "folder": str(folder), "input": self.input.name,
                "shape": list(a.shape), "dtype": a.dtype.name,
                "preprocess": self.description,
                "range": [float(a.min()), float(a.max())],
                "images": [{"file": p.name, "sha256": hashlib.sha256(p.read_bytes())
                            .hexdigest()[:16]} for p in self.files],
                "skipped": list(self.skipped), "transparency_dropped": list(self.alpha)}

    def said(self, folder: Path) -> str:
        a = self.arrays[self.input.name]
        text = (f"{len(self.files)} image(s) of '{folder}' -> input '{self.input.name}' "
                f"{list(a.shape)} {a.dtype.name}: {self.description}; values "
                f"{float(a.min()):.4g} .. {float(a.max()):.4g}")
        if self.skipped:
            text += (f"\nnote: {len(self.skipped)} file(s) of the folder skipped, not "
                     f"{'/'.join(s.lstrip('.') for s in IMAGE_SUFFIXES)} by their name: "
                     f"{_names(self.skipped)} (convert them to include them)")
        if self.alpha:
            text += (f"\nnote: {len(self.alpha)} image(s) have transparency, dropped: the "
                     f"model sees the colours stored under their transparent pixels "
                     f"({_names(self.alpha)}); flatten them onto the background you deploy "
                     "with to measure that")
        return text


def _names(names: tuple[str, ...], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f", … ({len(names) - most} more)" if len(names) > most
                                      else "")


def images_to_arrays(folder: str | Path, model: Model, pixels: Pixels, *,
                     shapes: Mapping[str, tuple[int, ...]] | None = None,
                     limit: int | None = None, show: bool = False) -> Images:
    """The images of ``folder`` (the first ``limit`` by name) as the model's image input,
    samples on axis 0; ``show``: a progress bar while they are read."""
    from quantscope.progress import track

    folder = Path(folder)
    inp = image_input(model, shapes)
    check_pixels(pixels, inp)
    files = image_files(folder)[:limit]
    alpha: list[str] = []
    samples = [read_image(p, inp, pixels, alpha)
               for p in track(files, "images", unit="image", show=show)]
    dtype = np.dtype(inp.dtype)  # an integer input: the pixels 0..255 exactly (raw)
    stacked = np.stack(samples).astype(dtype)
    return Images({inp.name: stacked}, inp, tuple(files),
                  pixels.describe(inp.height, inp.width, inp.channels), tuple(skipped_files(folder)),
                  tuple(alpha))


def sidecar(npz: str | Path) -> Path:
    """``NAME.npz`` -> ``NAME.pixels.json``."""
    p = Path(npz)
    return p.with_name(p.name.removesuffix(p.suffix) + SIDECAR)


def pixels_note(spec: str | Path) -> str | None:
    """How tensor data ``spec`` was made from images, when ``quantscope images`` wrote it
    (its sidecar beside it); None otherwise (or when the sidecar cannot be read: the note
    is a record, not an input)."""
    side = sidecar(spec)
    if not (Path(spec).is_file() and side.is_file()):
        return None
    try:
        rec = json.loads(side.read_text(encoding="utf-8"))
        return (f"{Path(spec).name}: made by 'quantscope images' from {len(rec['images'])} "
                f"image(s) of '{rec['folder']}' ({rec['preprocess']})")
    except (OSError, ValueError, KeyError, TypeError):
        return None


__all__ = ["IMAGE_SUFFIXES", "MAKE_TENSORS", "ImageInput", "Images", "Pixels", "image_files", "image_input",
           "images_to_arrays", "parse_pixels", "pixels_note", "read_image", "sidecar"]
