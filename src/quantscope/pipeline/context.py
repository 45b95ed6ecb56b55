"""What a run is asked for (:class:`RunOptions`) and the inputs its stages open lazily."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantscope import __version__, stages
from quantscope.finetune.engine import RANK_ENGINES, resolve_engine
from quantscope.pipeline.manifest import file_digest, model_file_digest
from quantscope.progress import say
from quantscope.repair import RepairError
from quantscope.repair.registry import DEFAULT_REPAIRS
from quantscope.rewrites.auto import AutoChoice
from quantscope.rewrites.base import Rewrite, run_rewrite
from quantscope.rewrites.registry import REWRITES
from quantscope.tasks.layout import LAYOUT_NOTE
from quantscope.tasks.text import TextPrefixes
from quantscope.types import QuantscopeError

if TYPE_CHECKING:
    from quantscope.model.load import Model
    from quantscope.pipeline.data import RunData
    from quantscope.targets.profile import Target
    from quantscope.tasks.headline import Headline
    from quantscope.types import Dataset


DEFAULT_BUDGET_S = 1800.0  # run --budget 30m


@dataclass(frozen=True)
class RunOptions:
    """``quantscope run``'s arguments. ``repairs``: the repairs the plan search may choose
    (measured); ``metric``: the measured metric (default: the data's task's)."""

    model: str
    data: str
    target: str
    out: str
    eval_data: str | None = None
    goal: float | None = None
    max_cost: float | None = None
    seq_len: int | None = None
    # --input-shape NAME=DxD…: concrete shapes of inputs with symbolic dims (plan, check)
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    input_shapes_from_data: bool = False  # input_shapes were taken from the data's sizes
    pairs: int | None = 300
    metric: str | None = None
    repairs: tuple[str, ...] = DEFAULT_REPAIRS
    repairs_given: bool = False  # --repairs was given (else the default repairs, which the
    # plan does not offer where the deploy stage chooses compiled lengths: steps.plan_scope)
    tokenizer: str | None = None
    prefixes: TextPrefixes | None = None  # --query-prefix/--doc-prefix of text data
    calib_texts: int | None = None  # --calib-texts: text data calibrates on its first N texts
    hn: str | None = None  # parsed Hailo HN JSON: exact layer names in the .alls
    method: str = "minmax"
    proxy: float = 0.125
    repair_batches: int = 8
    token_chunk: int | None = None  # tokensplit: token-wise layers in chunks of N tokens
    token_linears: bool = False  # tokensplit --linears
    heads: bool = False  # headsplit: each attention head a layer of its own
    rowscale: bool = False  # rowscale: attention weights scaled per row (after headsplit)
    outscale: bool = False  # outscale: residual-branch Linears write equalized channels
    peel: bool = False  # peel: each FFN's outlier hidden channels in a small FFN of their own
    whatif: bool = False  # evaluate also lifts each op kind of the plan to 16 bit (whatif)
    rank_engine: str = "auto"  # who ranks the plan search's candidates (ORT measures)
    race: float | None = None  # --race: the plan search races its batch at this confidence
    # --allow-warning: warning rule ids (or "all") the plan accepts, as given, sorted
    # (targets/accept.py resolves them on the target); in the plan, check and deploy keys
    allow_warnings: tuple[str, ...] = ()
    layout: tuple[Any, ...] = ()  # --layout: tasks.layout.LayoutSpec per declared output
    batch_axes: tuple[tuple[str, int], ...] = ()  # --batch-axis: (input or output, sample axis)
    # rewrites by registry name (quantscope.rewrites.registry), besides the legacy switches
    # above (token_chunk, heads, rowscale, outscale, peel), which stay accepted one release
    rewrites: tuple[str, ...] = ()
    # config values of the chosen rewrites that no legacy field carries: (rewrite, config
    # field, value), e.g. ("rowscale", "growth", 1.5) from run --rowscale-growth 1.5
    rewrite_options: tuple[tuple[str, str, Any], ...] = ()
    # seconds the plan search may spend measuring candidates (None: no bound); not in the
    # plan stage's key: a larger budget continues a search it stopped, a smaller one reuses
    budget: float | None = DEFAULT_BUDGET_S
    # --lengths: "off", "auto" (buckets where the data has short texts and the cost depends
    # on the length) or the lengths to choose from, "64,128" (pipeline/deploy.py)
    lengths: str = "auto"

    def length_choice(self) -> tuple[int, ...] | None:
        """``--lengths`` read: None when off, () for auto, else the lengths given."""
        if self.lengths == "off":
            return None
        if self.lengths == "auto":
            return ()
        try:
            given = tuple(sorted({int(x) for x in self.lengths.split(",")}))
        except ValueError:
            given = ()
        if not given or given[0] < 1:
            raise QuantscopeError(f"--lengths must be off, auto or a comma list of token "
                                  f"counts (e.g. 64,128), not '{self.lengths}'")
        return given
    # --rewrites auto (run's default): the run chooses the rewrites by measuring each one on
    # the fit data (quantscope.pipeline.auto); with the default repairs, it adds a repair
    # that answers a rule refusing the run's uniform a8_w8 plan (rank4 for q::linearclip)
    auto_rewrites: bool = False
    # --finetune: "auto" (when the goal is missed on the fit data and torch imports), "off",
    # "on" (pipeline/tune.py: the last part of the repair stage)
    finetune: str = "auto"

    def rewrite_configs(self) -> tuple[tuple[Rewrite, Any], ...]:
        """The rewrites this run applies, in the registry's order, each with its config:
        named in :attr:`rewrites` or turned on by a legacy switch field (an entry's
        ``CliOption.run_field``); config values from the legacy fields that carry them and
        from :attr:`rewrite_options`."""
        out = []
        for name, rw in REWRITES.items():
            on = any(getattr(self, o.run_field, None) not in (None, False)
                     for o in rw.switches() if o.run_field)
            if not on and name not in self.rewrites:
                continue
            values = {o.dest: getattr(self, o.run_field) for o in rw.cli_options
                      if o.dest and o.run_field and hasattr(self, o.run_field)}
            values.update({key: v for rw_name, key, v in self.rewrite_options if rw_name == name})
            out.append((rw, rw.configure(**values)))
        return tuple(out)

    def check(self) -> None:
        for name in ("max_cost", "proxy", "budget"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise QuantscopeError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        for name in ("seq_len", "pairs", "repair_batches", "token_chunk"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise QuantscopeError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.rank_engine not in RANK_ENGINES or self.rank_engine == "torch":
            resolve_engine(self.rank_engine)  # one line: unknown, or torch not installed
        self.length_choice()
        if self.finetune not in ("auto", "off", "on"):
            raise QuantscopeError(f"--finetune must be auto, off or on, not '{self.finetune}'")
        if self.auto_rewrites and self.rewrite_configs():
            raise QuantscopeError("--rewrites auto chooses the rewrites itself: name them "
                                  "instead (--rewrites a,b) or leave the rewrite flags out")
        unknown = [n for n in self.rewrites if n not in REWRITES]
        if unknown:
            raise QuantscopeError(f"unknown rewrite '{unknown[0]}': use one of "
                                  f"{', '.join(REWRITES)}")
        for name, key, _ in self.rewrite_options:
            if name not in REWRITES or key not in {f.name for f in fields(REWRITES[name].config)}:
                raise QuantscopeError(f"unknown option '{key}' of rewrite '{name}'")
        chosen = {rw.name for rw, _ in self.rewrite_configs()}
        for name, key, _ in self.rewrite_options:
            if name not in chosen:
                raise QuantscopeError(f"--{name}-{key.replace('_', '-')} needs --rewrites "
                                      f"{name}")
        if self.token_linears and "tokensplit" not in chosen:
            raise QuantscopeError("--tokensplit-linears needs --tokensplit N or --rewrites "
                                  "tokensplit")
        if self.token_chunk is not None and self.seq_len is not None \
                and self.token_chunk >= self.seq_len:
            raise QuantscopeError(
                f"--tokensplit {self.token_chunk} must be below --seq-len {self.seq_len} (the "
                "chunks are layers of fewer tokens), e.g. --seq-len 256 --tokensplit 128")


DATA_PATHS = ("data", "eval_data", "tokenizer")  # data options that name a file or folder


def _identity(spec: str | None) -> str | None:
    """Content digest of a data/model path, or the built-in name with the tool version."""
    if spec is None:
        return None
    p = Path(spec)
    return file_digest(p) if p.exists() else f"{spec}@quantscope-{__version__}"


@dataclass
class Context:
    """One run's folder, options and the inputs opened so far (each opened once)."""

    opts: RunOptions
    folder: Path
    progress: bool = True
    _cache: dict[str, Any] = field(default_factory=dict)

    def path(self, name: str) -> Path:
        return self.folder / name

    def model(self) -> Model:
        """The model every stage works on (:func:`open_run_model`; a rewrite reused from
        the run folder is loaded here, on the first stage that needs it)."""
        if "model" not in self._cache:
            made = self._cache.get("made")
            if made is None:
                made = rewrite_run_model(self.opts, progress=self.progress)
                if self.folder.is_dir():
                    keep_rewritten(self.folder, self.opts, made)
            self._cache["model"], self._cache["made"] = made.load(), made
        return self._cache["model"]

    def auto_choice(self) -> AutoChoice | None:
        """What ``--rewrites auto`` tried and kept (None: the rewrites were named)."""
        if not self.opts.auto_rewrites:
            return None
        if "made" not in self._cache:
            self._cache.pop("model", None)
            self.model()
        return self._cache["made"].auto

    def rewrite_configs(self) -> tuple[tuple[Rewrite, Any], ...]:
        """The rewrites the run's model carries, with their configs: those named
        (:meth:`RunOptions.rewrite_configs`), or those ``auto`` kept."""
        choice = self.auto_choice()
        return self.opts.rewrite_configs() if choice is None else choice.configs()

    def allowed_warnings(self) -> frozenset[str]:
        """``--allow-warning`` resolved on the run's target (:mod:`quantscope.targets.accept`)."""
        from quantscope.targets.accept import allowed_warnings

        return allowed_warnings(self.target(), self.opts.allow_warnings)

    def model_digest(self) -> str:
        """The model file's digest (and each rewrite's suffix: a rewrite changes every
        stage's model; with ``auto``, each rewrite it kept and each legality repair it
        applied)."""
        if "model_digest" not in self._cache:
            choice = self.auto_choice()
            self._cache["model_digest"] = model_digest(self.opts, self.rewrite_configs()) + (
                "".join(f"/repair:{r}" for r in choice.applied_repairs) if choice else "")
        return self._cache["model_digest"]

    def data_options(self) -> dict[str, Any]:
        """Every option the run's data is opened with: :meth:`data` reads them from here
        only, and every data-reading stage's resume key is built from them
        (:meth:`data_identity`), so an option that changes the data cannot be missed by
        the key. A new data option goes here (and into :data:`DATA_PATHS` if it names a
        file)."""
        from quantscope.pipeline.data import calibration_rule
        from quantscope.tasks.face_split import SPLIT_KEY
        from quantscope.tasks.registry import is_face_spec

        o = self.opts
        return {"data": o.data, "eval_data": o.eval_data, "pairs": o.pairs,
                "tokenizer": o.tokenizer, "seq_len": o.seq_len,
                **({"layout": o.layout} if o.layout else {}),
                **({"prefixes": o.prefixes} if o.prefixes else {}),
                **({"calib_texts": o.calib_texts} if o.calib_texts else {}),
                **calibration_rule(o.data),
                # absent when not given: the keys of earlier runs stay valid
                **({"batch_axes": o.batch_axes} if o.batch_axes else {}),
                # face data held out by person (pipeline.data): a run folder fitted on
                # every chip (before h55) must not be reused; other data's keys unchanged
                **({"held_out": SPLIT_KEY} if o.eval_data is None
                   and is_face_spec(o.data) else {})}

    def data_identity(self) -> dict[str, Any]:
        """:meth:`data_options` with every file named by its content digest (each
        ``--layout`` by its text, the batch axes as pairs)."""
        def ident(k: str, v: Any) -> Any:
            if k in DATA_PATHS:
                return _identity(v)
            if k == "layout":
                from quantscope.pipeline.auto import layout_identity

                return layout_identity(v, _identity)
            if k == "batch_axes":
                return [list(p) for p in v]
            if k == "prefixes":
                return v.to_dict()
            return v

        from quantscope.pipeline.auto import tokenizer_beside

        return {**{k: ident(k, v) for k, v in self.data_options().items()},
                **tokenizer_beside(self.opts, _identity)}

    def hn_identity(self) -> str | None:
        return _identity(self.opts.hn)

    def data(self) -> RunData:
        if "data" not in self._cache:
            from quantscope.pipeline.data import open_run_data

            d = self.data_options()
            model = self.model()
            run = open_run_data(model, d["data"], eval_data=d["eval_data"],
                                pairs=d["pairs"], tokenizer=d["tokenizer"], folder=self.folder,
                                layout=d.get("layout", ()),
                                batch_axes=dict(d.get("batch_axes", ())),
                                prefixes=d.get("prefixes"), calib_texts=d.get("calib_texts"),
                                fit=self._opened_fit(model))
            for note in run.fit.notes:
                if LAYOUT_NOTE in note:  # what each output was read as (--layout or found)
                    say(f"note: {note}", show=self.progress)
            if d["seq_len"] is not None:  # every stage measures what that length runs
                run = replace(run, fit=stages.at_length(run.fit, d["seq_len"]),
                              held_out=stages.at_length(run.held_out, d["seq_len"]))
            self._cache["data"] = run
        return self._cache["data"]

    def _opened_fit(self, model: Model) -> Dataset | None:
        """The text pairs' fit data the run opened with the given model before any stage
        (``_cache["given_fit"]``: :func:`reads_text_as` of it, data), when ``model`` reads text as that one does
        (the same inputs, outputs, metadata and source: a rewrite keeps them), so they
        are not tokenized again; else None."""
        given, fit = self._cache.get("given_fit", (None, None))
        if given is None or fit is None:
            return None
        from quantscope.pipeline.data import _is_pairs

        same = given == reads_text_as(model)
        return fit if same and _is_pairs(self.opts.data) else None

    def target(self) -> Target:
        if "target" not in self._cache:
            from quantscope.targets import load_target

            self._cache["target"] = load_target(self.opts.target)
        return self._cache["target"]

    def headline(self) -> Headline:
        """The measured metric (key, direction, goal range, unit): ``--metric``, else the
        data's task's headline (:func:`quantscope.stages.headline`)."""
        if "headline" not in self._cache:
            data = None if self.opts.metric else self.data().fit
            self._cache["headline"] = stages.headline(data, self.opts.metric)
        return self._cache["headline"]

    def metric(self) -> str:
        return self.headline().metric

    def check_goal(self, fit: Dataset | None = None) -> Headline | None:
        """Refuse a ``--goal`` the headline metric cannot take, before any work and before
        the run folder exists (the task comes from the fit data: ``fit`` when the caller
        opened it already, else opened here without the folder, :func:`stages.open_data`
        as ``open_run_data`` opens it)."""
        o = self.opts
        if o.goal is None:
            return None
        if o.metric:
            head = stages.headline(None, o.metric)
        else:
            d = self.data_options()
            fit = fit or stages.open_data(d["data"], self.model(), tokenizer=d["tokenizer"],
                                          max_pairs=d["pairs"], layout=d.get("layout", ()),
                                          batch_axes=dict(d.get("batch_axes", ())) or None,
                                          show=False, prefixes=d.get("prefixes"),
                                          calib_texts=d.get("calib_texts"))
            head = stages.headline(fit, None)
        head.check_goal(o.goal)
        return head

    def options(self) -> dict[str, Any]:
        return asdict(self.opts)


def model_digest(opts: RunOptions, chosen: tuple[tuple[Rewrite, Any], ...] | None = None
                 ) -> str:
    """The given model file's digest, followed by each chosen rewrite's suffix
    (``chosen``: default, the named ones)."""
    digest = model_file_digest(stages.resolve_model_path(opts.model))
    for rw, config in opts.rewrite_configs() if chosen is None else chosen:
        digest += rw.digest_of(config, opts.seq_len, opts.input_shapes)
    return digest


REWRITTEN, REWRITTEN_KEY = "rewritten.onnx", "rewritten.json"
REWRITTEN_FORMAT = "quantscope.rewritten/1"
# rewritten.json "loaded": rewritten.onnx is the model as the run worked on it (checked,
# nodes named, opset raised, shapes inferred: model.load.load_proto's output), so a rerun
# reads it back as it is instead of loading it again (checker, shape inference: seconds
# on a 12-layer encoder). Absent in folders written before: those are loaded in full.
LOADED = "loaded"


def rewritten_key(opts: RunOptions) -> dict[str, Any]:
    """What the rewritten model is a function of: the given model's contents, the rewrite
    choice (:func:`model_digest`), the tool's version and, when a rewrite reads channel
    ranges, what the given model was calibrated on."""
    chosen = opts.rewrite_configs()
    key: dict[str, Any] = {"format": REWRITTEN_FORMAT, "model": model_digest(opts),
                           "version": __version__}
    if opts.auto_rewrites:  # the choice is a function of the data it was measured on
        from quantscope.pipeline.auto import auto_digest, auto_key

        auto = auto_key(opts, _identity)
        key["model"] += f"/auto:{auto_digest(auto)}"
        key["auto"] = auto
    if any(rw.needs_stats for rw, _ in chosen):
        key["stats"] = {"data": _identity(opts.data), "tokenizer": _identity(opts.tokenizer),
                        "pairs": opts.pairs, "seq_len": opts.seq_len, "method": opts.method,
                        "batch_axes": [list(p) for p in opts.batch_axes],
                        **({"prefixes": opts.prefixes.to_dict()} if opts.prefixes else {}),
                        **({"calib_texts": opts.calib_texts} if opts.calib_texts else {})}
    return key


def _reused_rewrite(opts: RunOptions, given: Model, progress: bool) -> RunModel | None:
    """The rewritten model a run in ``opts.out`` kept (:func:`keep_rewritten`), when its
    key matches this run's and its file is the one recorded (an ``auto`` choice that kept
    nothing records no file: the given model); else None."""
    import json

    folder = Path(opts.out)
    meta, path = folder / REWRITTEN_KEY, folder / REWRITTEN
    if not meta.is_file():
        return None
    try:
        kept = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("key") != json.loads(
            json.dumps(rewritten_key(opts))):
        return None
    auto = AutoChoice.from_dict(kept["auto"]) if opts.auto_rewrites and "auto" in kept \
        else None
    if kept.get("file") is None and auto is not None and not auto.kept:
        made = RunModel(given, auto=auto)
    elif path.is_file() and kept.get("file") == file_digest(path):
        notes = kept.get("notes", [])
        made = RunModel(None, auto=auto, file=str(path), source=given.source,
                        loaded=kept.get(LOADED) is True,
                        notes=tuple(str(n) for n in notes) if isinstance(notes, list) else ())
    else:
        return None
    for reason in kept.get("reasons", []):
        say(reason, show=progress)
    say(f"rewritten model reused from {path} (same model, rewrites and data)" if made.model
        is None else f"rewrite choice reused from {meta} (auto: none kept)", show=progress)
    return made


@dataclass(frozen=True)
class RunModel:
    """The model a run works on; ``proto``: the last rewrite's own output when rewritten
    now (None without rewrites or when reused from the run folder), with the lines said.
    A rewritten model reused from the run folder is not loaded (``model`` None, ``file``
    its path): a rerun whose stages are all done never needs it; :meth:`load` loads it."""

    model: Model | None
    proto: Any = None
    reasons: tuple[str, ...] = ()
    auto: AutoChoice | None = None  # --rewrites auto: what was tried and kept
    chosen_now: bool = False  # the auto choice was measured now (not reused)
    file: str | None = None  # the reused rewritten model's file (when ``model`` is None)
    source: str = ""  # the given model's source (the tokenizer it names or sits with)
    loaded: bool = False  # :attr:`file` holds the loaded form (:data:`LOADED`)
    notes: tuple[str, ...] = ()  # the loader's notes of that form

    def load(self) -> Model:
        """The model, loaded from :attr:`file` when it was reused (read as it is when the
        run wrote its loaded form, whose digest the reuse checked)."""
        if self.model is not None:
            return self.model
        import onnx

        from quantscope.model.load import Model

        assert self.file is not None
        if self.loaded:
            return Model(proto=onnx.load(self.file), source=self.source, notes=self.notes)
        return stages.load_proto(onnx.load(self.file), self.source)


def reads_text_as(model: Model) -> tuple[Any, ...]:
    """What decides whether two models read text alike (a rewrite keeps it): the inputs,
    outputs, metadata and source, as comparable values (the model itself is not held)."""
    return (tuple(i.SerializeToString() for i in model.graph.input),
            tuple(o.SerializeToString() for o in model.graph.output),
            tuple(p.SerializeToString() for p in model.proto.metadata_props), model.source)


def keep_rewritten(folder: Path, opts: RunOptions, made: RunModel) -> None:
    """Write a model rewritten now into the run folder with its key (what a rerun reuses:
    :func:`_reused_rewrite`); nothing without rewrites or when it was reused."""
    from quantscope.serde import write_json, write_onnx

    auto = {"auto": made.auto.to_dict()} if made.auto is not None else {}
    if made.proto is None:
        if made.chosen_now:  # auto kept nothing: the choice alone is the state
            (folder / REWRITTEN).unlink(missing_ok=True)
            write_json(folder / REWRITTEN_KEY, {"key": rewritten_key(opts), "reasons": [],
                                                "file": None, **auto})
        return
    # the loaded form (what every stage of this run works on), read back as it is
    loaded = made.model
    write_onnx(folder / REWRITTEN, made.proto if loaded is None else loaded.proto)
    form = {LOADED: True, "notes": list(loaded.notes)} if loaded is not None else {}
    write_json(folder / REWRITTEN_KEY, {"key": rewritten_key(opts), "reasons": list(made.reasons),
                                        "file": file_digest(folder / REWRITTEN), **form, **auto})


def open_run_model(opts: RunOptions, *, progress: bool = True) -> Model:
    """:func:`rewrite_run_model`'s model."""
    return rewrite_run_model(opts, progress=progress).load()


def rewrite_run_model(opts: RunOptions, *, progress: bool = True,
                      given: Model | None = None) -> RunModel:
    """The given model, or its rewritten form: each rewrite of
    :meth:`RunOptions.rewrite_configs` in the registry's order, through the one runner
    (FP32 checked each time; its source stays the given file, for the tokenizer it names
    or sits with). The rewrites that need stats read the given model's channel ranges,
    calibrated once (outscale changes only the down-projections' weights: the hidden
    tensors that peel reads keep their names and ranges). A run folder that kept the
    rewritten model under this run's key (:func:`rewritten_key`) gives it instead: no
    calibration and no rewrite on a rerun (and the model is not even loaded: the
    returned :class:`RunModel` loads it on :meth:`RunModel.load`). ``given``: the given
    model, when the caller opened it already."""
    model = given if given is not None else stages.open_model(opts.model)
    source = model.source
    chosen = opts.rewrite_configs()
    if not chosen and not opts.auto_rewrites:
        return RunModel(model)
    reused = _reused_rewrite(opts, model, progress)
    if reused is not None:
        return reused
    if opts.auto_rewrites:
        from quantscope.pipeline.auto import choose

        choice, proto = choose(opts, model, progress=progress)
        reasons = tuple([f"{t.name}: {t.reason}" for t in choice.trials if t.kept]
                        + [f"{r['name']}: {r['reason']}" for r in choice.repairs
                           if r.get("applied")])
        return RunModel(model if proto is None else stages.load_proto(proto, source), proto,
                        reasons, auto=choice, chosen_now=True)
    stats, reasons, proto = None, [], None
    if any(rw.needs_stats for rw, _ in chosen):
        fit = stages.open_data(opts.data, model, tokenizer=opts.tokenizer,
                               max_pairs=opts.pairs, batch_axes=dict(opts.batch_axes),
                               prefixes=opts.prefixes, calib_texts=opts.calib_texts)
        if opts.seq_len is not None:
            fit = stages.at_length(fit, opts.seq_len)
        say("calibrating the given model for its channel ranges", show=progress)
        stats = stages.calibrate_model(model, fit, method=opts.method, progress=progress)
    for rw, config in chosen:
        r = run_rewrite(rw, model, config, stats=stats if rw.needs_stats else None,
                        seq_len=opts.seq_len, input_shapes=opts.input_shapes)
        if r.failed is not None:
            raise RepairError(r.failed)
        if not r.changes:
            flag = next((o.run_flag for o in rw.switches() if o.run_flag),
                        f"--rewrites {rw.name}")
            raise QuantscopeError(f"{flag}: model '{opts.model}': {r.reason}"
                                  f"{rw.nothing_suffix}: run without it")
        reasons.append(f"{rw.name}: {r.reason}")
        say(reasons[-1], show=progress)
        model, proto = stages.load_proto(r.proto, source), r.proto
    return RunModel(model, proto, tuple(reasons))
