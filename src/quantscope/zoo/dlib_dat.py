"""Read dlib DNN files (``.dat``) with numpy: the layers of a ``loss_metric`` ResNet.

dlib's serialisation, as read here: integers are one control byte (low nibble = byte
count, bit 7 = sign) then little-endian magnitude bytes; floats/doubles are an integer
mantissa and an integer exponent; strings are a length then bytes; bools are '0'/'1';
tensors are version 2, four dims, then raw little-endian float32. A network is written
loss first, then version integers of every nested layer, then the layers from the
input upwards, each followed by bookkeeping (3 bools, 3 empty tensors).

Only the layer kinds of dlib's face ResNet are understood; anything else is a
one-line :class:`QuantscopeError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quantscope.types import QuantscopeError


@dataclass(frozen=True)
class Conv:
    weight: np.ndarray  # [out, in, kh, kw]
    bias: np.ndarray  # [out]
    stride: int
    pad: int


@dataclass(frozen=True)
class Affine:
    gamma: np.ndarray
    beta: np.ndarray


@dataclass(frozen=True)
class Pool:
    kind: str  # "max" | "avg"
    size: int  # 0 = over everything
    stride: int
    pad: int


@dataclass(frozen=True)
class Relu:
    pass


@dataclass(frozen=True)
class AddPrev:
    pass


@dataclass(frozen=True)
class Fc:
    weight: np.ndarray  # [in, out]; y = x @ weight


Layer = Conv | Affine | Pool | Relu | AddPrev | Fc


@dataclass(frozen=True)
class DlibNet:
    """The layers of a dlib metric-learning ResNet, from the input upwards."""

    mean_rgb: tuple[float, float, float]
    size: int
    layers: tuple[Layer, ...]
    loss_margin: float
    loss_threshold: float


class _Reader:
    def __init__(self, data: bytes, path: Path) -> None:
        self.data, self.pos, self.path = data, 0, path

    def fail(self, what: str) -> QuantscopeError:
        return QuantscopeError(
            f"{self.path.name}: not a readable dlib network file ({what} at byte {self.pos})"
        )

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail(f"truncated, wanted {n} bytes")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int(self) -> int:
        control = self.take(1)[0]
        size = control & 0x0F
        if size > 8 or control & 0x70:
            raise self.fail("bad integer")
        value = int.from_bytes(self.take(size), "little")
        return -value if control & 0x80 else value

    def float(self) -> float:
        mantissa = self.int()
        exponent = self.int()
        return float(np.ldexp(np.float64(mantissa), exponent))

    def string(self) -> str:
        n = self.int()
        if not 0 <= n <= 64:
            raise self.fail("bad string length")
        return self.take(n).decode("ascii", errors="replace")

    def bool(self) -> bool:
        ch = self.take(1)
        if ch not in (b"0", b"1"):
            raise self.fail("bad bool")
        return ch == b"1"

    def tensor(self) -> np.ndarray:
        if self.int() != 2:
            raise self.fail("bad tensor version")
        shape = tuple(self.int() for _ in range(4))
        if any(d < 0 for d in shape):
            raise self.fail("bad tensor shape")
        count = int(np.prod(shape))
        return np.frombuffer(self.take(4 * count), dtype="<f4").astype(np.float32).reshape(shape)

    def alias(self) -> tuple[int, ...]:
        if self.int() != 1:
            raise self.fail("bad alias_tensor version")
        return tuple(self.int() for _ in range(4))

    def expect(self, name: str) -> None:
        got = self.string()
        if got != name:
            raise self.fail(f"expected '{name}', found '{got}'")


def _read_con(r: _Reader) -> Conv:
    params = r.tensor().ravel()
    n_out, kh, kw, sy, sx, py, px = (r.int() for _ in range(7))
    filt, bias = r.alias(), r.alias()
    for _ in range(4):
        r.float()  # learning-rate and weight-decay multipliers
    n_w = int(np.prod(filt))
    if filt[0] != n_out or filt[2:] != (kh, kw) or sy != sx or py != px:
        raise r.fail("unsupported convolution")
    if params.size != n_w + int(np.prod(bias)):
        raise r.fail("convolution parameter size mismatch")
    b = params[n_w:] if bias[1] else np.zeros(n_out, np.float32)
    return Conv(params[:n_w].reshape(filt), b.copy(), sy, py)


def _read_affine(r: _Reader) -> Affine:
    params = r.tensor().ravel()
    gamma, beta = r.alias(), r.alias()
    if r.int() != 0:
        raise r.fail("only conv-mode affine layers are supported")
    n = int(np.prod(gamma))
    if n != int(np.prod(beta)) or params.size != 2 * n:
        raise r.fail("affine parameter size mismatch")
    return Affine(params[:n].copy(), params[n:].copy())


def _read_pool(r: _Reader, kind: str) -> Pool:
    nr, nc, sy, sx, py, px = (r.int() for _ in range(6))
    if nr != nc or sy != sx or py != px:
        raise r.fail("unsupported pooling")
    return Pool(kind, nr, sy, py)


def _read_fc(r: _Reader) -> Fc:
    n_out, n_in = r.int(), r.int()
    params = r.tensor().ravel()
    weights, _bias = r.alias(), r.alias()
    no_bias = r.int() == 1
    for _ in range(4):
        r.float()
    if not no_bias or params.size != n_in * n_out or weights[:2] != (n_in, n_out):
        raise r.fail("only fc_no_bias is supported")
    return Fc(params.reshape(n_in, n_out).copy())


def _read_layer(r: _Reader) -> Layer:
    name = r.string()
    readers = {
        "con_4": _read_con,
        "affine_": _read_affine,
        "max_pool_2": lambda rr: _read_pool(rr, "max"),
        "avg_pool_2": lambda rr: _read_pool(rr, "avg"),
        "relu_": lambda rr: Relu(),
        "add_prev_": lambda rr: AddPrev(),
        "fc_2": _read_fc,
    }
    if name not in readers:
        raise r.fail(f"unsupported dlib layer '{name}'")
    return readers[name](r)


def _skip_bookkeeping(r: _Reader) -> None:
    for _ in range(3):
        r.bool()
    for _ in range(3):
        r.tensor()


def parse_dlib_dat(path: Path) -> DlibNet:
    """Read a dlib ``loss_metric`` ResNet (``.dat``) into numpy arrays; no dlib needed."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise QuantscopeError(f"cannot read dlib model {path}: {exc.strerror}") from None
    r = _Reader(data, Path(path))
    if r.int() != 1:
        raise r.fail("not a dlib network")
    r.expect("loss_metric_2")
    margin, threshold = r.float(), r.float()
    while True:  # version integers of the nested layers, down to the input layer
        start, version = r.pos, r.int()
        if version == len("input_rgb_image_sized"):
            r.pos = start
            break
        if version not in (1, 2, 3):
            raise r.fail("bad layer version")
    r.expect("input_rgb_image_sized")
    mean = (r.float(), r.float(), r.float())
    size, size_c = r.int(), r.int()
    layers = [_read_layer(r)]
    _skip_bookkeeping(r)
    r.int()  # sample expansion factor of the bottom layer
    while r.pos < len(data):
        layers.append(_read_layer(r))
        _skip_bookkeeping(r)
    if size != size_c:
        raise r.fail(f"non-square input {size}x{size_c}")
    return DlibNet(mean, size, tuple(layers), margin, threshold)
