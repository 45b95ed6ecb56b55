"""What a graph rewrite is (:class:`Rewrite`), what it returns (:class:`RewriteResult`) and
its one runner (:func:`run_rewrite`).

A rewrite changes the model's graph so that it quantizes better (or fits a target rule)
while its FP32 function stays the same: the runner checks that on sample feeds
(``max|after - before| / max|before| <= 1e-5``, :data:`quantscope.repair.verify.FP32_RTOL`)
and, when the check fails, returns the input model untouched with a one-line note. Every
rewrite it applies is recorded in the model's metadata under :data:`RECORD_KEY` as a JSON
list (one object per rewrite, in the order they ran).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from quantscope.model.axes import softmax_facts
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.shapes import given_shapes, seq_len_shapes
from quantscope.plan.check import check
from quantscope.plan.start import blocks
from quantscope.repair import Change, RepairError
from quantscope.repair import Repair as GraphRepair
from quantscope.repair.tokens import sample_feeds
from quantscope.repair.verify import FP32_RTOL, check_function
from quantscope.targets.accept import accepted_words, binding_words
from quantscope.types import GroupKind, Plan, Precision, QuantscopeError, Stats

if TYPE_CHECKING:
    from quantscope.model.shapes import Shapes
    from quantscope.targets.profile import Target

RECORD_KEY = "quantscope.rewrites"  # model metadata: JSON list of the rewrites applied
InputShapes = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class CliOption:
    """One option of a rewrite, as data a parser is generated from.

    ``flags``: the rewrite command's own spelling (empty: the command has none, e.g. a
    switch that only ``run`` has); ``dest``: the config field it sets (None: a switch that
    only turns the rewrite on); ``kind``: ``"int"`` (>= 1), ``"float"`` (> 0),
    ``"float>=1"`` or ``"flag"``;
    ``run_flag`` / ``run_field``: the legacy ``quantscope run`` flag and the
    ``RunOptions`` field it fills (kept one release beside ``run --rewrites``);
    ``switch``: setting it turns the rewrite on in a run."""

    flags: tuple[str, ...]
    dest: str | None
    kind: str
    default: Any
    help: str
    metavar: str | None = None
    run_flag: str | None = None
    run_field: str | None = None
    run_help: str = ""
    switch: bool = False


@dataclass(frozen=True)
class Precondition:
    """Does a rewrite apply to this model (on this target, at this length, with these
    stats)? ``reason`` says why in words, both ways."""

    holds: bool
    reason: str


@dataclass(frozen=True)
class RewriteInput:
    """What the bare graph rewrite may read besides the model and its config."""

    stats: Stats | None = None
    seq_len: int | None = None
    shapes: Shapes = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class RewriteResult:
    """One rewrite's outcome. ``proto`` is the input model's proto itself when nothing was
    changed or the FP32 check failed (``failed`` then says why in one line); ``lift``:
    the groups the plan should lift to 16 bit; ``record``: what went into the model's
    metadata (:data:`RECORD_KEY`); ``fp32_diff``: the largest relative output change."""

    name: str
    proto: onnx.ModelProto
    reason: str
    changes: tuple[Change, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    effect: tuple[tuple[str, float], ...] = ()
    notes: tuple[str, ...] = ()
    lift: tuple[str, ...] = ()
    record: Mapping[str, Any] | None = None
    fp32_diff: float = 0.0
    failed: str | None = None

    @property
    def applied(self) -> bool:
        return bool(self.changes) and self.failed is None

    def as_repair(self) -> GraphRepair:
        """The result in the form of :class:`quantscope.repair.Repair` (the commands' and
        the stage functions' return value)."""
        return GraphRepair(name=self.name, reason=self.reason, proto=self.proto,
                           changes=self.changes, skipped=self.skipped, effect=self.effect)


Transform = Callable[[Model, Any, RewriteInput], GraphRepair]
Applies = Callable[[Model, "Target | None", "int | None", "Stats | None"], Precondition]
Binds = Callable[[Model, "Target | None", "int | None"], Precondition]
# one phase graph made by a decoder step: phase -> (graph, what was done, in words)
PhaseMaker = Callable[[str], "tuple[onnx.ModelProto, str]"]


@dataclass(frozen=True)
class PhaseJob:
    """What a decoder step (a rewrite of a decoder's pair of phase graphs, prefill and
    decode: :attr:`Rewrite.phases`) is given by the stage that runs it
    (``stages_llm.recipe_phase_files``), which owns the files, the text and the KV prefix.

    ``spec``: the phase graphs it reads (a built-in decoder name or ``X.prefill.onnx``);
    ``seq_len``: the prompt tokens of the prefill graph (and the cache the decode graph
    is checked with); ``target``: the run's target (None: none given); ``open(phase)``:
    that phase graph of ``spec``; ``write(make)``: each phase graph ``make(phase)`` gives
    (one in memory at a time) written as the step's files, the graphs' shared weights
    checked equal, returning phase -> ``make``'s note; ``calibrate()``: the prefill
    graph's calibration with the run's KV prefix in the cache (stats a step shares
    across both phases, so both get the same weights)."""

    spec: str
    seq_len: int
    open: Callable[[str], Model]
    write: Callable[[PhaseMaker], dict[str, str]]
    calibrate: Callable[[], Stats]
    target: Target | None = None


# a decoder step's own way with both phase graphs: (job, config) -> phase -> note
PhaseStep = Callable[[PhaseJob, Any], dict[str, str]]


@dataclass(frozen=True)
class Rewrite:
    """One registry entry (:data:`quantscope.rewrites.registry.REWRITES`).

    ``config``: a frozen dataclass whose defaults are the rewrite's; ``transform``: the bare
    graph rewrite (``(model, config, RewriteInput) -> Repair``); ``applies``: its
    precondition in words; ``answers``: the target rule ids (a vendor prefix may precede
    them: ``super_defuse`` answers ``hailo.super_defuse``) and diagnoses it answers;
    ``hint``: the plan's goal-verdict hint when such a rule binds; ``what``: what every run
    stage works on with it (the verdict note); ``metadata_key``: the key the transform
    itself writes (a model carrying it was rewritten so already); ``check_lengths``:
    the token counts of the FP32 check's feeds; ``digest``: the run's model-digest
    suffix; ``verdict``: the verdict entry; ``lift``: the groups the plan should lift;
    ``verdict_rank``: the position of its key in ``verdict.json`` (kept from before the
    registry, so existing files stay byte-identical); ``nothing_suffix``: appended to
    the reason when nothing changed (a run's one-line error); ``summary`` and
    ``description``: the command's help line and its ``--help`` description.

    The command ``quantscope NAME`` is generated from the entry
    (:mod:`quantscope.cli.rewrites`): ``example`` is its recommended invocation (default:
    one built from the name), ``out_help`` the help of its ``--out``, ``left`` the word
    of its lines for the sites it left (``left: site: why``), ``site_kinds`` the change
    kinds it prints one line each for (``tensor: note``), and ``checked_on`` says what
    feeds the FP32 check ran on (``(config, seq_len, repair) -> "on ..."``; None: not
    said). ``rtol``: the FP32 check's bound (default :data:`FP32_RTOL`; a deep rotated
    decoder is checked within 1e-4). A rewrite that needs stats also tells the user to
    calibrate the new model.

    ``binds``: whether the target rule it ``answers`` binds on this model at this length
    (``run --rewrites auto`` tries a rewrite only where its precondition holds and this
    does); None: the precondition is the diagnosis itself (tokensplit's size rule, the
    stats rewrites' outlier channels).

    ``phases``: how the entry rewrites a decoder's pair of phase graphs (the decoder
    run's recipe steps, ``stages_llm.RECIPE``, are entries: ``rotate``, ``smooth``,
    ``gatedsplit``); None: its transform on each graph (:mod:`quantscope.rewrites.phases`).
    A decoder step's precondition says no, in words, on a graph it cannot rewrite (an
    encoder), so ``run --rewrites auto`` never tries it there.

    ``basis``: the graph inputs / outputs the rewrite stores in another basis (``vrotate``'s
    V cache, rotated per head): the FP32 check feeds the rewritten graph those inputs
    rotated and compares those outputs rotated back (None: none)."""

    name: str
    config: type[Any]
    summary: str
    unverified: str
    what: str
    metadata_key: str
    transform: Transform
    applies: Applies
    needs_stats: bool = False
    answers: tuple[str, ...] = ()
    hint: str | None = None
    cli_options: tuple[CliOption, ...] = ()
    check_lengths: Callable[[Any, int | None, GraphRepair], tuple[int, ...]] | None = None
    digest: Callable[[Any, int | None, InputShapes], str] | None = None
    verdict: Callable[[Any, int | None, str], dict[str, Any]] | None = None
    lift: Callable[[GraphRepair], tuple[str, ...]] | None = None
    verdict_rank: int = 100
    nothing_suffix: str = ""
    description: str = ""
    example: str = ""
    out_help: str = "rewritten FP32 model to write (.onnx)"
    left: str = "left as is"
    site_kinds: tuple[str, ...] = ()
    checked_on: Callable[[Any, int | None, GraphRepair], str] | None = None
    binds: Binds | None = None
    rtol: float = FP32_RTOL
    # a decoder's two phase graphs at once (:class:`PhaseJob`): None, the transform on
    # each graph, FP32 checked per phase (:func:`quantscope.rewrites.phases.on_phases`);
    # else the entry's own step (smooth: one calibration for both; gatedsplit: prefill
    # only, chunks by the target)
    phases: PhaseStep | None = None
    # the config ``run --rewrites auto`` tries, given the names of the rewrites applied
    # before it, the model it applies to, the target and the length (None: the default
    # config): e.g. tokensplit splits the Linears too, per head, on a head-split model,
    # in chunks that fit the target's size limit
    auto_config: Callable[[frozenset[str], Model, Target | None, int | None], Any] | None = None
    # the graph inputs / outputs the rewrite stores in another basis (R2's rotated V
    # cache): (model, config) -> name -> M (new = old M on the last axis); the FP32 check
    # feeds the rewritten graph x M and compares its outputs as y Mᵀ. None: none
    basis: Callable[[Model, Any], Mapping[str, np.ndarray]] | None = None

    def answers_rule(self, rule: str | None) -> bool:
        """Does this rewrite answer target rule ``rule`` (``vendor.id`` or ``id``)?"""
        return bool(rule) and any(rule == a or str(rule).endswith(f".{a}")
                                  for a in self.answers)

    def lengths(self, config: Any, seq_len: int | None, r: GraphRepair) -> tuple[int, ...]:
        if self.check_lengths is not None:
            return self.check_lengths(config, seq_len, r)
        return (seq_len,) if seq_len else (32, 7)

    def digest_of(self, config: Any, seq_len: int | None, input_shapes: InputShapes) -> str:
        """The run's model-digest suffix: the entry's own, else ``/NAME`` followed by each
        config value that is not the default (``:key=value``; the defaults add nothing,
        so a run folder made before config values could be given keeps its key)."""
        if self.digest is not None:
            return self.digest(config, seq_len, input_shapes)
        default = dataclasses.asdict(self.config())
        return f"/{self.name}" + "".join(f":{k}={v}" for k, v in dataclasses.asdict(config).items()
                                         if v != default.get(k))

    def verdict_of(self, config: Any, seq_len: int | None, repaired: str) -> dict[str, Any]:
        if self.verdict is not None:
            return self.verdict(config, seq_len, repaired)
        return {"note": f"{self.what} ({repaired} is the rewritten model); {self.unverified}"}

    def switches(self) -> tuple[CliOption, ...]:
        return tuple(o for o in self.cli_options if o.switch)

    def apply(self, model: Model, config: Any = None, *, stats: Stats | None = None,
              seq_len: int | None = None, input_shapes: InputShapes = ()) -> RewriteResult:
        """:func:`run_rewrite` of this entry (FP32 checked, recorded)."""
        return run_rewrite(self, model, config, stats=stats, seq_len=seq_len,
                           input_shapes=input_shapes)

    def configure(self, **values: Any) -> Any:
        """The entry's config with ``values`` set; a None value keeps the default (an
        option not given)."""
        return self.config(**{k: v for k, v in values.items() if v is not None})


def recorded(proto: onnx.ModelProto) -> list[dict[str, Any]]:
    """The rewrites recorded in a model's metadata (:data:`RECORD_KEY`), oldest first."""
    text = next((p.value for p in proto.metadata_props if p.key == RECORD_KEY), None)
    return list(json.loads(text)) if text else []


def _with_record(proto: onnx.ModelProto, record: Mapping[str, Any]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    records = [*recorded(proto), dict(record)]
    kept = [p for p in out.metadata_props if p.key != RECORD_KEY]
    del out.metadata_props[:]
    out.metadata_props.extend(kept)
    out.metadata_props.add(key=RECORD_KEY, value=json.dumps(records, sort_keys=True))
    return out


def require_stats(model: Model, stats: Stats | None, name: str) -> Stats:
    """The stats, refused when missing or when they know none of the model's Linear
    outputs (calibrated on another model)."""
    if stats is None:
        raise QuantscopeError(f"{name} needs the model's stats: run 'quantscope calibrate'")
    weighted = [g for g in find_groups(model).groups if g.kind is GroupKind.WEIGHTED]
    if weighted and not any(t in stats.tensors for g in weighted for t in g.outputs):
        raise QuantscopeError(
            "the stats file has no statistics for this model's Linear outputs: it was "
            "calibrated on another model; run 'quantscope calibrate' on this one")
    return stats


def outlier_channels(model: Model, stats: Stats | None, ratio: float, what: str
                     ) -> Precondition:
    """Whether the stats show outlier channels on the model's Linear outputs: a channel
    whose max |x| is at least ``ratio`` times the median channel's (``what``: which
    threshold, for the words)."""
    if stats is None:
        return Precondition(False, "needs the model's stats (quantscope calibrate) to see "
                                   "outlier channels")
    found: list[tuple[float, str]] = []
    for g in find_groups(model).groups:
        if g.kind is not GroupKind.WEIGHTED:
            continue
        for t in g.outputs:
            s = stats.tensors.get(t)
            if s is None or s.channel_absmax.size < 2:
                continue
            a = np.asarray(s.channel_absmax, np.float64)
            med = float(np.median(a))
            top = float(a.max()) / med if med > 0 else float("inf") if a.max() > 0 else 0.0
            found.append((top, t))
    if not found:
        return Precondition(False, "the stats know no Linear output of this model")
    over = sorted((f for f in found if f[0] >= ratio), reverse=True)
    if over:
        return Precondition(True, f"{len(over)} Linear output(s) have a channel at >= "
                                  f"{ratio:g} x the median channel max ({what}); largest "
                                  f"{over[0][0]:.3g} x on '{over[0][1]}'")
    top = max(found)
    return Precondition(False, f"no Linear output has a channel at >= {ratio:g} x the median "
                               f"channel max ({what}); largest {top[0]:.3g} x on '{top[1]}'")


def softmax_chains(model: Model) -> Precondition:
    """Whether the model has attention Softmax chains: a Softmax fed by an activation x
    activation MatMul (:func:`quantscope.model.axes.softmax_facts`, the fact legality reads
    too); a classifier's Softmax over its logits is none (human's ``faceres``: its age
    Softmax read as "1 attention Softmax chain(s)" before). The head count is found when
    the rewrite matches them."""
    soft = [node for node in model.graph.node if node.op_type == "Softmax"]
    n = sum(1 for node in soft if softmax_facts(model, node)[2])
    if n:
        return Precondition(True, f"{n} attention Softmax chain(s) to rewrite (each one's "
                                  "heads are matched when rewriting)")
    if soft:
        return Precondition(False, f"no attention to rewrite: the graph's {len(soft)} "
                                   "Softmax(es) read no activation x activation MatMul")
    return Precondition(False, "no Softmax in the graph: no attention to rewrite")


def rule_binds(model: Model, target: Target | None, seq_len: int | None,
               answers: tuple[str, ...], what: str) -> Precondition:
    """Whether a target rule among ``answers`` blocks a plan with every group at a16_w16
    on this model at ``seq_len`` tokens, as the planner judges it
    (:func:`quantscope.plan.start.blocks`: an error, or a warning that applies and that
    the run does not accept, :attr:`Target.accepted`): the rule binds, so the groups it
    names must stay below 16 bit (``what``: those groups, for the words)."""
    if target is None:
        return Precondition(False, "no target: no rule keeps any layer at 8 bit")

    def answered(rule: str) -> bool:
        return any(rule == a or rule.endswith(f".{a}") for a in answers)

    ids = {r.id for r in target.rules if answered(r.id)}
    if not ids:
        return Precondition(False, f"target {target.name} has no rule {', '.join(answers)}: "
                                   f"{what} may be 16 bit")
    live = ids - target.accepted
    if not live:
        return Precondition(False, f"{accepted_words(ids)}: {what} may be 16 bit")
    plan = Plan(default=Precision.A16_W16, target=target.name)
    hits = [p for p in check(plan, find_groups(model), model, target,
                             shapes=given_shapes(model, seq_len))
            if p.rule in live and blocks(p, target.accepted)]
    if not hits:
        return Precondition(False, f"{', '.join(sorted(live))} refuses no layer of this model: "
                                   f"{what} may be 16 bit")
    return Precondition(True, f"{binding_words(hits[0].rule, hits[0].severity)} keeps {what} "
                              f"at 8 bit ({len(hits)} layer(s), e.g. '{hits[0].group}')")


def shapes_seq_len(model: Model, input_shapes: InputShapes) -> int | None:
    """The token count that input shapes give (``--input-shape``, or the data's sizes that
    ``run`` takes): the second dim of the model's token inputs (the rank-2 inputs
    ``--seq-len`` would fix, :func:`~quantscope.model.shapes.seq_len_shapes`) when the
    shapes name them and agree; else None. What the preconditions judge at without
    ``--seq-len`` (they read a length, not shapes)."""
    if not input_shapes:
        return None
    try:
        tokens = seq_len_shapes(model, 1)
    except QuantscopeError:  # no rank-2 token input: no token count
        return None
    given = dict(input_shapes)
    lengths = {given[n][1] for n in tokens if len(given.get(n, ())) == 2}
    return lengths.pop() if len(lengths) == 1 else None


def _failed(rw: Rewrite, model: Model, r: GraphRepair, error: str) -> RewriteResult:
    note = f"{rw.name}: not applied: {error}"
    return RewriteResult(name=rw.name, proto=model.proto, reason=error, skipped=r.skipped,
                         notes=(note,), failed=error)


def run_rewrite(rw: Rewrite, model: Model, config: Any = None, *, stats: Stats | None = None,
                seq_len: int | None = None, input_shapes: InputShapes = (),
                rtol: float | None = None) -> RewriteResult:
    """Apply ``rw`` to ``model`` with ``config`` (default: the entry's), its FP32 function
    checked on sample feeds (token feeds of :meth:`Rewrite.lengths` tokens, or float inputs
    at their shapes) within ``rtol`` (None: the entry's). Nothing changed, or a failed
    check: the input model's proto comes back untouched (a failed check says why in
    ``failed`` and one note). Applied: the new proto carries its record under :data:`RECORD_KEY`."""
    config = rw.config() if config is None else config
    rtol = rw.rtol if rtol is None else rtol
    if rw.needs_stats:
        stats = require_stats(model, stats, rw.name)
    given = dict(given_shapes(model, None, input_shapes) or {})
    r = rw.transform(model, config, RewriteInput(stats=stats, seq_len=seq_len, shapes=given))
    if not r.changes:
        return RewriteResult(name=rw.name, proto=model.proto, reason=r.reason,
                             skipped=r.skipped, effect=r.effect, notes=(r.reason,))
    feeds = sample_feeds(model, rw.lengths(config, seq_len, r), shapes=given, what=rw.name)
    try:
        diff = check_function(model.proto, r.proto, feeds, what=rw.name, rtol=rtol,
                              basis=rw.basis(model, config) if rw.basis else None)
    except RepairError as e:
        return _failed(rw, model, r, str(e))
    record = {"name": rw.name, "config": dataclasses.asdict(config), "seq_len": seq_len,
              "changes": len(r.changes), "fp32_diff": float(diff)}
    return RewriteResult(name=rw.name, proto=_with_record(r.proto, record), reason=r.reason,
                         changes=r.changes, skipped=r.skipped, effect=r.effect,
                         notes=(f"{rw.name}: {r.reason}",),
                         lift=rw.lift(r) if rw.lift is not None else (),
                         record=record, fp32_diff=float(diff))


def legacy(result: RewriteResult) -> tuple[GraphRepair, float]:
    """``(Repair, fp32 diff)`` as the stage functions returned it; a failed FP32 check
    raises :class:`RepairError` with its one line, as before the registry."""
    if result.failed is not None:
        raise RepairError(result.failed)
    return result.as_repair(), result.fp32_diff


def new_nodes(r: GraphRepair, suffix: str) -> tuple[str, ...]:
    """Names of nodes of ``r.proto`` ending in ``suffix`` (groups the plan should lift)."""
    return tuple(n.name for n in r.proto.graph.node if n.name.endswith(suffix))
