"""Text tasks: retrieval pairs, calibration texts, sentence-encoder detection, batching, pooling.

==================  ====================================================================
``stdlib-docs``     built-in retrieval data: query = summary of a Python stdlib docstring,
                    document = the rest (1,500 pairs, frozen in ``quantscope/data``), plus
                    512 calibration texts disjoint from every pair
user pairs          JSONL, one ``{"query": ..., "document": ...}`` object per line
user calibration    a text file, one sentence per line (blank lines skipped)
text prefixes       ``TextPrefixes`` (``--query-prefix``, ``--doc-prefix``): what an encoder
                    trained with prefixes sees first (e5 ``query: `` / ``passage: ``, bge's
                    query instruction): the query prefix on queries (and on both sentences
                    of similarity pairs), the document prefix on documents and on
                    calibration texts (calibration text is documents)
encoder             inputs matched by name: ``input_ids``, ``attention_mask``, optional
                    ``token_type_ids``; output: token embeddings [B,S,H] (preferred; mean
                    pooled over the attention mask, as sentence-transformers does) or a
                    pooled [B,H] embedding; then L2 normalisation
batches             sorted by token length, each padded to its own longest text, so batch
                    sequence lengths differ; ``TextBatches.order`` maps rows back to input order
==================  ====================================================================
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import onnx
import tokenizers

from quantscope.model.phases import refuse_language_model
from quantscope.tasks.tokenizer_files import read_tokenizer, untruncated
from quantscope.threads import default_threads
from quantscope.types import QuantscopeError

Runner = Callable[[dict[str, np.ndarray]], Sequence[np.ndarray]]
"""``run(feeds) -> outputs`` in graph output order, like ``session.run(None, feeds)``."""

STDLIB_DOCS = "stdlib-docs"
TOKENIZER_FILE, TOKENIZER_BESIDE = "bert-uncased-tokenizer.json", "tokenizer.json"  # beside a model
DEFAULT_MAX_LENGTH = 256
INPUT_ROLES = ("input_ids", "attention_mask", "token_type_ids")
_INT_TYPES = {onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32"}
_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)


def _data_file(name: str) -> Path:
    return Path(str(resources.files("quantscope") / "data" / name))


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class RetrievalPairs:
    """Query i is answered by document i."""

    queries: tuple[str, ...]
    documents: tuple[str, ...]
    source: str

    def __len__(self) -> int:
        return len(self.queries)


def load_pairs(name_or_path: str | Path) -> RetrievalPairs:
    """``stdlib-docs`` or a JSONL file of ``{"query": str, "document": str}`` objects."""
    if str(name_or_path) == STDLIB_DOCS:
        path = _data_file("stdlib_docs.jsonl.gz")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return _parse_pairs(f.read().splitlines(), STDLIB_DOCS)
    path = _existing(name_or_path, "retrieval pairs")
    return _parse_pairs(path.read_text(encoding="utf-8-sig").splitlines(), str(path))


def _parse_pairs(lines: list[str], source: str) -> RetrievalPairs:
    queries, documents = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise QuantscopeError(f"{source} line {number}: not JSON ({err.msg})") from None
        ok = isinstance(row, dict) and all(
            isinstance(row.get(k), str) for k in ("query", "document")
        )
        if not ok:
            raise QuantscopeError(
                f"{source} line {number}: expected an object with string fields "
                "'query' and 'document'"
            )
        queries.append(row["query"])
        documents.append(row["document"])
    if len(queries) < 2:  # top-1 retrieval among one document is always right
        raise QuantscopeError(f"{source}: {'one' if queries else 'no'} query/document pair"
                              f"{'' if queries else 's (empty file)'}: give 2 or more")
    return RetrievalPairs(tuple(queries), tuple(documents), source)


@dataclass(frozen=True)
class StsPairs:
    """Sentence-similarity pairs with a human score each (STS-style)."""

    first: tuple[str, ...]
    second: tuple[str, ...]
    scores: tuple[float, ...]
    source: str

    def __len__(self) -> int:
        return len(self.first)


def is_sts_file(path: str | Path) -> bool:
    """A ``.tsv``, or a ``.jsonl`` whose first object has a ``score``."""
    p = Path(path)
    if p.suffix == ".tsv":
        return True
    if p.suffix != ".jsonl" or not p.is_file():
        return False
    with p.open(encoding="utf-8-sig") as f:
        first = next((line for line in f if line.strip()), "")
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(row, dict) and "score" in row


def load_sts(path: str | Path) -> StsPairs:
    """``sentence1 <TAB> sentence2 <TAB> score`` lines (a header line is skipped), or JSONL
    objects ``{"sentence1", "sentence2", "score"}``."""
    p = _existing(path, "sentence-similarity pairs")
    rows: list[tuple[str, str, float]] = []
    for number, line in enumerate(p.read_text(encoding="utf-8-sig").splitlines(), start=1):
        if not line.strip():
            continue
        row = _sts_row(line, p.suffix == ".tsv", number, str(p))
        if row is not None:
            rows.append(row)
    if len(rows) < 3:
        raise QuantscopeError(f"{p}: {len(rows)} scored sentence pair(s); give at least 3 "
                              "(a rank correlation needs them)")
    a, b, s = zip(*rows, strict=True)
    return StsPairs(tuple(a), tuple(b), tuple(s), str(p))


def _sts_row(line: str, tsv: bool, number: int, source: str) -> tuple[str, str, float] | None:
    try:
        if tsv:
            parts = line.split("\t")
            if len(parts) != 3:
                raise ValueError("expected 3 tab-separated fields")
            try:
                score = float(parts[2])
            except ValueError:
                if number == 1:
                    return None  # a header line
                raise
            a, b = parts[0], parts[1]
        else:
            row = json.loads(line)
            a, b, score = row["sentence1"], row["sentence2"], float(row["score"])
            if not isinstance(a, str) or not isinstance(b, str):
                raise ValueError("sentences must be strings")
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as err:
        raise QuantscopeError(
            f"{source} line {number}: expected sentence1, sentence2 and a numeric score "
            f"({err})") from None
    if not math.isfinite(score):
        raise QuantscopeError(f"{source} line {number}: the score is not a finite number")
    return a, b, score


def load_calibration_texts(name_or_path: str | Path) -> tuple[str, ...]:
    """``stdlib-docs`` (512 texts disjoint from its pairs) or a text file, one text per line."""
    if str(name_or_path) == STDLIB_DOCS:
        with gzip.open(_data_file("stdlib_docs_calib.txt.gz"), "rt", encoding="utf-8") as f:
            lines, source = f.read().splitlines(), STDLIB_DOCS
    else:
        path = _existing(name_or_path, "calibration texts")
        lines, source = path.read_text(encoding="utf-8-sig").splitlines(), str(path)
    texts = tuple(line.strip() for line in lines if line.strip())
    if not texts:
        raise QuantscopeError(f"{source}: no calibration texts (empty file)")
    return texts


def _existing(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise QuantscopeError(f"{what} file not found: {path}")
    return path


@dataclass(frozen=True)
class TextPrefixes:
    """Text put before every query and every document (and calibration text) before
    tokenizing, as the encoder was trained: e5's ``query: `` / ``passage: ``, bge's query
    instruction. Empty strings: no prefix (the default)."""

    query: str = ""
    document: str = ""

    def __bool__(self) -> bool:
        return bool(self.query or self.document)

    def queries(self, texts: Sequence[str]) -> tuple[str, ...]:
        return tuple(self.query + t for t in texts)

    def documents(self, texts: Sequence[str]) -> tuple[str, ...]:
        return tuple(self.document + t for t in texts)

    def describe(self) -> str:
        """One clause for the data notes and the provenance."""
        if not self:
            return "no text prefixes"
        return (f"text prefixes: queries {self.query!r}, documents and calibration texts "
                f"{self.document!r} (prepended before tokenizing)")

    def to_dict(self) -> dict[str, str]:
        return {"query": self.query, "document": self.document}


NO_PREFIXES = TextPrefixes()


# --------------------------------------------------------------------------- tokenizer


def load_tokenizer(
    path: str | Path | None = None, *, max_length: int = DEFAULT_MAX_LENGTH
) -> tokenizers.Tokenizer:
    """A ``tokenizer.json`` file, a Hugging Face model folder holding one, or None (packaged).

    The packaged one is the uncased BERT tokenizer of all-MiniLM-L6-v2 (fits both built-in
    models). Padding is turned off (batches pad themselves); truncation at ``max_length``.
    Read once per content and length (:mod:`quantscope.tasks.tokenizer_files`): the
    tokenizer returned may be shared, so never change it.
    """
    file = _data_file(TOKENIZER_FILE) if path is None else Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise QuantscopeError(
            f"tokenizer not found: {file} (pass --tokenizer a tokenizer.json or a model folder)"
        )
    return read_tokenizer(file, max_length)


TOKENIZER_PROP = "quantscope.tokenizer"


def model_tokenizer(model_file: str | Path, proto: onnx.ModelProto) -> Path | None:
    """The tokenizer a model file names or sits with, or None (the packaged default).

    A built-in model names its tokenizer in the metadata property ``quantscope.tokenizer``
    (a file next to the ONNX file); a user's model exported into a Hugging Face folder has
    a ``tokenizer.json`` beside it. ``--tokenizer`` overrides both.
    """
    folder = Path(model_file).parent
    named = {p.key: p.value for p in proto.metadata_props}.get(TOKENIZER_PROP)
    if named:
        path = folder / named
        if not path.is_file():
            raise QuantscopeError(f"model '{model_file}' names tokenizer {named}, which is not "
                                  f"in {folder}: rebuild the model or pass --tokenizer")
        return path
    beside = folder / TOKENIZER_BESIDE
    return beside if Path(model_file).is_file() and beside.is_file() else None


def text_tokenizer(model_file: str | Path, proto: onnx.ModelProto,
                   given: str | Path | None) -> str | Path | None:
    """The tokenizer text data is read with: ``given`` (``--tokenizer``), else the one the
    model names or sits with (:func:`model_tokenizer`), else the packaged one (None) when
    it fits: when the table that the model's ``input_ids`` index has another number of
    rows than the packaged vocabulary, one line asks for ``--tokenizer`` (the packaged ids
    would index the wrong rows, in range and silently)."""
    if given:
        return given
    found = model_tokenizer(model_file, proto)
    if found is not None:
        return found
    from quantscope.model.host_gather import host_gathers

    ids = detect_encoder(proto).input_name("input_ids")
    rows = {g.shape[0] for g in host_gathers(proto, 1) if g.indices == ids}
    packaged = load_tokenizer().get_vocab_size(with_added_tokens=True)
    if rows and packaged not in rows:
        raise QuantscopeError(
            f"model '{Path(model_file).name}' names no tokenizer and has no tokenizer.json "
            f"beside it, and its {ids} index a table of {min(rows):,} rows, not the "
            f"{packaged:,} of the packaged one (uncased BERT): pass --tokenizer "
            "TOKENIZER.json (the model's own, e.g. from its Hugging Face folder)")
    return None


def describe_tokenizer(path: str | Path | None) -> str:
    return f"tokenizer {Path(path).name}" if path else f"tokenizer {TOKENIZER_FILE} (packaged)"


FIT_LENGTHS = (64, 128, 256)


def token_lengths(texts: Sequence[str], tokenizer: tokenizers.Tokenizer) -> np.ndarray:
    """Untruncated token count of every text (special tokens included)."""
    full = untruncated(tokenizer)
    return np.array([len(e.ids) for e in full.encode_batch(list(texts))], dtype=np.int64)


def length_profile(lengths: np.ndarray, fits: Sequence[int] = FIT_LENGTHS) -> dict[str, float]:
    """Token-length distribution and the fraction of texts that fit each sequence length.

    Sequence length is a deployment decision (legality on the NPU depends on it): this
    says what a shorter one costs in truncated texts.
    """
    if lengths.size == 0:
        return {}
    out = {"texts": float(lengths.size), "median": float(np.median(lengths)),
           "p95": float(np.percentile(lengths, 95)), "max": float(lengths.max())}
    out.update({f"fit_{n}": float(np.mean(lengths <= n)) for n in fits})
    return out


def describe_lengths(profile: dict[str, float]) -> str:
    fits = ", ".join(f"{k[4:]}: {v:.0%}" for k, v in profile.items() if k.startswith("fit_"))
    return (f"token lengths over {int(profile['texts'])} texts: median {profile['median']:.0f}, "
            f"p95 {profile['p95']:.0f}, max {profile['max']:.0f}; texts that fit {fits}")


# --------------------------------------------------------------------------- encoder detection


@dataclass(frozen=True)
class TextEncoder:
    """What :func:`detect_encoder` found in a sentence-encoder ONNX graph."""

    inputs: tuple[tuple[str, str, str], ...]  # (role, graph input name, dtype)
    output: str  # the output used
    output_index: int  # its position among the graph outputs
    output_kind: str  # "tokens" [B,S,H] (mean pooled), "pooled" [B,H], "auto" (rank unstated)
    hidden_size: int | None  # H when the graph states it

    def input_name(self, role: str) -> str | None:
        return next((name for r, name, _ in self.inputs if r == role), None)

    def describe(self) -> str:
        feeds = ", ".join(
            name if role == name else f"{role}={name}" for role, name, _ in self.inputs
        )
        size = self.hidden_size or "?"
        if self.output_kind == "tokens":
            out = f"token embeddings '{self.output}' [B,S,{size}] -> mean pooling over the mask"
        elif self.output_kind == "pooled":
            out = f"pooled embedding '{self.output}' [B,{size}]"
        else:
            out = f"'{self.output}' of unstated shape: [B,S,H] is mean pooled, [B,H] used as is"
        return f"sentence encoder: inputs {feeds}; output {out} -> L2 normalisation"


def detect_encoder(
    model: onnx.ModelProto | str | Path, *, output: str | None = None
) -> TextEncoder:
    """Detect a sentence encoder's inputs and output (``output`` forces an output by name)."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    feeds = [i for i in graph.input if i.name not in initializers]
    refuse_language_model(model, output)
    inputs = _match_inputs(feeds)
    index, kind, hidden = _pick_output(list(graph.output), output)
    return TextEncoder(inputs, graph.output[index].name, index, kind, hidden)


def _match_inputs(feeds: list[onnx.ValueInfoProto]) -> tuple[tuple[str, str, str], ...]:
    names = [f.name for f in feeds]
    matched: list[tuple[str, str, str]] = []
    for role in INPUT_ROLES:
        info = next((f for f in feeds if f.name == role), None)
        info = info or next((f for f in feeds if _fuzzy_role(f.name) == role), None)
        if info is None:
            continue
        dtype = _INT_TYPES.get(info.type.tensor_type.elem_type)
        if dtype is None:
            raise QuantscopeError(f"model input '{info.name}' ({role}) is not an integer tensor")
        matched.append((role, info.name, dtype))
    roles = {role for role, _, _ in matched}
    unmatched = [n for n in names if n not in {name for _, name, _ in matched}]
    if not {"input_ids", "attention_mask"} <= roles or unmatched:
        raise QuantscopeError(
            f"model inputs ({', '.join(names) or 'none'}) do not look like a sentence encoder: "
            "need input_ids and attention_mask, optionally token_type_ids"
        )
    return tuple(matched)


def _fuzzy_role(name: str) -> str | None:
    low = name.lower()
    if "token_type" in low or "segment" in low:
        return "token_type_ids"
    if "mask" in low:
        return "attention_mask"
    if "ids" in low:
        return "input_ids"
    return None


def _pick_output(
    outputs: list[onnx.ValueInfoProto], wanted: str | None
) -> tuple[int, str, int | None]:
    """(index, kind, hidden size): token embeddings first, then pooled, then rank unstated."""
    shaped = []
    for index, info in enumerate(outputs):
        tensor = info.type.tensor_type
        if tensor.elem_type in _FLOAT_TYPES and (wanted is None or info.name == wanted):
            dims = (
                [d.dim_value or None for d in tensor.shape.dim] if tensor.HasField("shape") else []
            )
            shaped.append((index, dims))
    for rank, kind in ((3, "tokens"), (2, "pooled"), (0, "auto")):
        for index, dims in shaped:
            if len(dims) == rank:
                return index, kind, dims[-1] if dims else None
    listing = ", ".join(f"{o.name}{_shape_text(o)}" for o in outputs)
    target = f"output '{wanted}'" if wanted else "an output"
    raise QuantscopeError(
        f"no float {target} shaped [B,S,H] or [B,H] among the model outputs ({listing})"
    )


def _shape_text(info: onnx.ValueInfoProto) -> str:
    dims = info.type.tensor_type.shape.dim
    return "[" + ",".join(d.dim_param or str(d.dim_value) for d in dims) + "]"


# --------------------------------------------------------------------------- batching


@dataclass(frozen=True)
class TextBatches:
    """Feeds in length order; row k over all batches is input text ``order[k]``."""

    batches: tuple[dict[str, np.ndarray], ...]
    order: np.ndarray

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def make_batches(
    texts: Sequence[str],
    tokenizer: tokenizers.Tokenizer,
    encoder: TextEncoder,
    *,
    batch_size: int = 32,
) -> TextBatches:
    """Tokenize, sort by length, pad each batch to its own longest text."""
    if not texts:
        raise QuantscopeError("no texts to embed")
    encodings = tokenizer.encode_batch(list(texts))
    lengths = np.array([len(e.ids) for e in encodings])
    order = np.argsort(lengths, kind="stable")
    pad_id = pad_token_id(tokenizer)
    batches = tuple(
        _pad([encodings[i] for i in order[start : start + batch_size]], encoder, pad_id)
        for start in range(0, len(order), batch_size)
    )
    return TextBatches(batches, order)


def truncate_feeds(feeds: dict[str, np.ndarray], max_length: int, encoder: TextEncoder
                   ) -> dict[str, np.ndarray]:
    """One padded batch as a tokenizer truncating at ``max_length`` makes it: a longer text
    keeps its first ``max_length - 1`` tokens and its own last token (the end token: [SEP]
    for BERT tokenizers, </s> for RoBERTa-style ones), exactly what ``tokenizers``'
    truncation gives; shorter texts are unchanged."""
    ids_name, mask_name = encoder.input_name("input_ids"), encoder.input_name("attention_mask")
    if ids_name is None or mask_name is None:
        raise QuantscopeError("truncating texts needs the encoder's input_ids and "
                              "attention_mask inputs")
    ids = feeds[ids_name]
    if ids.shape[1] <= max_length:
        return feeds
    lengths = feeds[mask_name].astype(np.int64).sum(axis=1)
    out = {k: np.ascontiguousarray(v[:, :max_length]) for k, v in feeds.items()}
    long = lengths > max_length
    out[ids_name][long, max_length - 1] = ids[long, lengths[long] - 1]
    return out


def truncate_batches(batches: TextBatches, max_length: int, encoder: TextEncoder
                     ) -> TextBatches:
    """Every batch truncated at ``max_length`` tokens; the length order stays valid."""
    return TextBatches(tuple(truncate_feeds(b, max_length, encoder) for b in batches),
                       batches.order)


PAD_TOKENS = ("[PAD]", "<pad>")


def pad_token_id(tokenizer: tokenizers.Tokenizer) -> int:
    """The id padding takes: the special (added) token [PAD] (BERT: 0) or <pad>
    (RoBERTa/MPNet: 1); else the first of them in the vocabulary; else 0. Special tokens
    come first because a vocabulary may hold both (MPNet's has a plain "[PAD]" at 4)."""
    special = sorted((i, t.content) for i, t in tokenizer.get_added_tokens_decoder().items()
                     if t.special and t.content in PAD_TOKENS)
    if special:
        return int(special[0][0])
    for token in PAD_TOKENS:
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return 0


def _pad(encodings: list[tokenizers.Encoding], encoder: TextEncoder, pad_id: int = 0
         ) -> dict[str, np.ndarray]:
    width = max(len(e.ids) for e in encodings)
    arrays = {role: np.zeros((len(encodings), width), np.int64) for role in INPUT_ROLES}
    arrays["input_ids"][:] = pad_id
    for row, enc in enumerate(encodings):
        n = len(enc.ids)
        arrays["input_ids"][row, :n] = enc.ids
        arrays["attention_mask"][row, :n] = enc.attention_mask
        arrays["token_type_ids"][row, :n] = enc.type_ids
    return {name: arrays[role].astype(dtype) for role, name, dtype in encoder.inputs}


# --------------------------------------------------------------------------- embedding


def pool(output: np.ndarray, attention_mask: np.ndarray, *, normalize: bool = True) -> np.ndarray:
    """Mean pooling over the mask for [B,S,H] (sentence-transformers), then optional L2."""
    output = np.asarray(output, dtype=np.float32)
    if output.ndim == 3:
        mask = attention_mask.astype(np.float32)[:, :, None]
        output = (output * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
    elif output.ndim != 2:
        raise QuantscopeError(f"encoder output has shape {output.shape}: expected [B,S,H] or [B,H]")
    if normalize:
        norms = np.linalg.norm(output, axis=1, keepdims=True)
        output = output / np.maximum(norms, 1e-12)
    return output


def embed(
    run: Runner, batches: TextBatches, encoder: TextEncoder, *, normalize: bool = True
) -> np.ndarray:
    """Run every batch, pool, (L2-normalise) and return [N,H] float32 in input order."""
    mask_name = encoder.input_name("attention_mask")
    pooled = [
        pool(run(feeds)[encoder.output_index], feeds[mask_name], normalize=normalize)
        for feeds in batches
    ]
    stacked = np.concatenate(pooled, axis=0)
    result = np.empty_like(stacked)
    result[batches.order] = stacked
    return result


def ort_runner(model: str | Path | bytes) -> Runner:
    """An FP32 onnxruntime CPU session as a :data:`Runner` (graph optimisations on)."""
    import onnxruntime as ort

    source = model if isinstance(model, bytes) else str(model)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = default_threads()
    session = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
    return lambda feeds: session.run(None, feeds)
