"""The token split as a registry entry: :func:`quantscope.repair.tokens.split_tokens`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.shapes import given_shapes
from quantscope.plan.check import NOT_EVALUATED, check
from quantscope.plan.start import blocks
from quantscope.repair import Repair as GraphRepair
from quantscope.repair.tokens import KINDS, METADATA_KEY, UNVERIFIED, split_tokens
from quantscope.rewrites.base import CliOption, InputShapes, Precondition, Rewrite, RewriteInput
from quantscope.targets.accept import accepted_words, binding_words
from quantscope.targets.profile import op_kind
from quantscope.types import Plan, Precision, Problem, Stats

if TYPE_CHECKING:
    from quantscope.targets.profile import Target

SIZE_CHECK = "act16_wide_non_conv"  # the target check that limits a 16-bit layer's size
MAX_PARTS = 16  # auto tries chunks of seq_len / 2, / 3, … / MAX_PARTS tokens


@dataclass(frozen=True)
class TokensplitConfig:
    """``chunk``: tokens per chunk (None: half the token count, rounded up); ``linears``:
    split the token-wise Linears too; ``full_width``: on a head-split model with
    ``linears``, keep Q/K/V and the heads' context as full-width [T, C] Concats (the form
    before the per-head one, which is the default there:
    :func:`quantscope.repair.heads.keep_heads`); ``relay_values``: in the per-head form,
    each head's values pass through a [d, d] identity Linear so attention reads a 16-bit
    Linear output."""

    chunk: int | None = None
    linears: bool = False
    full_width: bool = False
    relay_values: bool = False


def _auto(before: frozenset[str], model: Model, target: Target | None,
          seq_len: int | None) -> TokensplitConfig:
    """What ``run --rewrites auto`` tries: on a head-split model the Linears in chunks too,
    Q/K/V and the heads' context per head (the per-head form: no full-width Concat left
    at 8 bit); else the default (residual Adds and LayerNorms only). The chunk is the
    largest that the target's size rule allows at 16 bit (:func:`fitting_chunk`; half the
    tokens where none is found or nothing can be judged)."""
    return TokensplitConfig(chunk=fitting_chunk(model, target, seq_len),
                            linears="headsplit" in before)


def fitting_chunk(model: Model, target: Target | None, seq_len: int | None) -> int | None:
    """The largest chunk of ``ceil(seq_len / k)`` tokens, ``k = 2 … MAX_PARTS``, at which the
    target's size rule (:data:`SIZE_CHECK`) refuses 16 bit on none of the token-wise layers
    (judged on ``model`` at that length: a chunk layer is the whole layer at fewer tokens).
    None (the default, half the tokens) without a target, a length or such a rule, or when
    no chunk up to ``seq_len / MAX_PARTS`` fits. E.g. hailo10h's 98,304 values: 128 tokens
    of minilm's 384 channels fit; of mpnet-base's 768, 86 (a third of 256)."""
    if target is None or not seq_len or not any(r.check == SIZE_CHECK for r in target.rules):
        return None
    for k in range(2, MAX_PARTS + 1):
        chunk = -(-seq_len // k)
        found = _refused(model, target, chunk)
        if found is None:
            return None  # the sizes are unknown: nothing to judge by
        if not found:
            return chunk
    return None


def needed_chunk(model: Model, target: Target | None, seq_len: int) -> int:
    """Tokens per chunk for a split made only for the size rule (the decoder recipe's
    ``gatedsplit``): ``seq_len`` (no split) when the rule refuses 16 bit on none of the
    token-wise layers at ``seq_len`` (an error rule, or a warning rule the run does not
    accept, :attr:`Target.accepted`); else :func:`fitting_chunk`, or half the tokens
    where it finds none (or there is no target to judge by)."""
    return sized_chunk(model, target, seq_len)[0]


def sized_chunk(model: Model, target: Target | None, seq_len: int) -> tuple[int, str]:
    """:func:`needed_chunk` and why, in the size rule's words ('' without a target): the
    rule that refuses the whole length (a warning one with the flag that accepts it), the
    rule accepted by ``--allow-warning``, or the rule that allows it."""
    if target is None:
        return -(-seq_len // 2), ""
    rules = [r for r in target.rules if r.check == SIZE_CHECK]
    taken = sorted({r.id for r in rules} & target.accepted)
    left = [r.id for r in rules if r.id not in target.accepted]
    real = _refused(model, target, seq_len)
    chunk = seq_len if real == [] else fitting_chunk(model, target, seq_len) or -(-seq_len // 2)
    if real:
        return chunk, (f"{binding_words(real[0].rule, real[0].severity)} refuses 16 bit on "
                       f"{len(real)} token-wise layer(s) at {seq_len} tokens, e.g. "
                       f"'{real[0].group}'")
    if real is None:
        return chunk, "the token-wise layers' size is unknown: half the tokens"
    if left:
        return chunk, (f"{', '.join(left)} allows 16 bit on every token-wise layer at "
                       f"{seq_len} tokens")
    if taken:
        return chunk, (f"{', '.join(taken)} accepted by --allow-warning: 16 bit on every "
                       f"token-wise layer passes the planner at {seq_len} tokens")
    return chunk, f"target {target.name} has no size rule on 16-bit non-conv layers"


def _refused(model: Model, target: Target, seq_len: int | None) -> list[Problem] | None:
    """The size rule's problems that block (:func:`quantscope.plan.start.blocks`: an error,
    or a warning the run does not accept, :attr:`Target.accepted`) with every token-wise
    layer at 16 bit at ``seq_len`` tokens ([] none); None when the sizes are not known
    (only not-evaluated problems)."""
    rules = [r for r in target.rules if r.check == SIZE_CHECK and r.id not in target.accepted]
    if not rules:
        return []
    groups = find_groups(model)
    wide = tuple((g.name, Precision.A16_W16) for g in groups.groups if op_kind(g) in KINDS)
    plan = Plan(default=Precision.A8_W8, overrides=wide, target=target.name)
    ids = {r.id for r in rules}
    found = [p for p in check(plan, groups, model, target, shapes=given_shapes(model, seq_len))
             if p.rule in ids and blocks(p, target.accepted)]
    real = [p for p in found if not p.reason.startswith(NOT_EVALUATED)]
    return None if found and not real else real


def _transform(model: Model, config: TokensplitConfig, inp: RewriteInput) -> GraphRepair:
    return split_tokens(model, shapes=inp.shapes, chunk=config.chunk, seq_len=inp.seq_len,
                        linears=config.linears, per_head=not config.full_width,
                        relay_values=config.relay_values)


def _applies(model: Model, target: Target | None, seq_len: int | None,
             stats: Stats | None) -> Precondition:
    """Holds when the target's size rule (``super_defuse``) blocks 16 bit on the
    token-wise layers (LayerNorms, residual Adds) at ``seq_len`` tokens: an error rule,
    or a warning rule the run does not accept (:func:`_refused`)."""
    if target is None:
        return Precondition(False, "no target: no rule limits 16-bit token-wise layers")
    rules = [r for r in target.rules if r.check == SIZE_CHECK]
    if not rules:
        return Precondition(False, f"target {target.name} has no size rule on 16-bit "
                                   "non-conv layers: the token-wise layers fit whole")
    if not any(op_kind(g) in KINDS for g in find_groups(model).groups):
        return Precondition(False, "no LayerNorm or elementwise layer to split")
    taken = {r.id for r in rules} & target.accepted
    if len(taken) == len(rules):
        return Precondition(False, f"{accepted_words(taken)}: 16 bit on the token-wise "
                                   "layers passes the planner: nothing to split")
    real = _refused(model, target, seq_len)
    at = f" at {seq_len} tokens" if seq_len else ""
    if real:
        return Precondition(True, f"{binding_words(real[0].rule, real[0].severity)} refuses "
                                  f"16 bit on {len(real)} token-wise layer(s){at}, e.g. "
                                  f"'{real[0].group}'")
    if real is None:
        return Precondition(False, "the token-wise layers' size is unknown: give --seq-len N "
                                   "or --input-shape")
    ids = {r.id for r in rules} - taken
    return Precondition(False, f"{', '.join(sorted(ids))} allows 16 bit on every token-wise "
                               f"layer{at}: nothing to split")


def _lengths(config: TokensplitConfig, seq_len: int | None, r: GraphRepair
             ) -> tuple[int, ...]:
    effect = dict(r.effect)  # a static token input runs at its own length only
    return ((seq_len, max(1, int(effect["chunk"]) // 2)) if seq_len
            else (int(effect["tokens"]),))


def _digest(config: TokensplitConfig, seq_len: int | None, input_shapes: InputShapes) -> str:
    return (f"/tokensplit:{seq_len}:{config.chunk}"
            + (":linears" if config.linears else "")
            + (":per_head" if config.linears and not config.full_width else "")
            + (":relay_values" if config.relay_values else "")
            + "".join(f":{k}={'x'.join(map(str, v))}" for k, v in input_shapes))


def _verdict(config: TokensplitConfig, seq_len: int | None, repaired: str) -> dict[str, object]:
    """The verdict entry; a chunk not given is the default's, half the tokens rounded up."""
    chunk = config.chunk or (-(-seq_len // 2) if seq_len else None)
    size = f"{chunk} tokens" if chunk else "half the tokens"
    heads = ("; on a head-split model Q/K/V and the heads' context are kept per head "
             "(no full-width Concat)" if config.linears and not config.full_width else "")
    return {"seq_len": seq_len, "chunk": chunk, "linears": config.linears,
            "note": "LayerNorms and residual Adds"
                    + (" and the token-wise Linears" if config.linears else "")
                    + f" split into layers of {size} ({repaired} "
                    f"is the split model){heads}; {UNVERIFIED}"}


def _checked_on(config: TokensplitConfig, seq_len: int | None, r: GraphRepair) -> str:
    """What the FP32 check fed (the command's words)."""
    chunk = int(dict(r.effect)["chunk"])
    return (f"on token feeds of {seq_len} and {max(1, chunk // 2)} tokens" if seq_len
            else "on random inputs")


HINT = (
    "hint: LayerNorms and residual Adds work token by token: 'quantscope tokensplit MODEL "
    "--seq-len N --out split.onnx' splits them into layers of fewer tokens, under the size "
    "limit (unverified on a device); calibrate, analyze and plan the split model")

REWRITE = Rewrite(
    name="tokensplit", config=TokensplitConfig,
    summary="split token-wise layers (residual Adds, LayerNorms) into chunks along the "
            "sequence so that 16 bit on them fits a per-layer size limit "
            "(hailo.super_defuse); FP32 unchanged",
    unverified=UNVERIFIED,
    what="LayerNorms and residual Adds split into layers of fewer tokens",
    metadata_key=METADATA_KEY, transform=_transform, applies=_applies,
    answers=("super_defuse",), hint=HINT,
    cli_options=(
        CliOption(("--chunk",), "chunk", "int", None, metavar="N", switch=True,
                  help="tokens per chunk (default: half the token count, rounded up)",
                  run_flag="--tokensplit", run_field="token_chunk",
                  run_help="work on the model with its LayerNorms and residual Adds split "
                  "into layers of N tokens (below --seq-len; 'quantscope tokensplit'): 16 bit "
                  "on them then fits hailo.super_defuse (unverified on a device)"),
        CliOption(("--linears",), "linears", "flag", False,
                  help="split the token-wise Linears (MatMul + bias + activation) too, so "
                  "they read the 16-bit chunks directly instead of a full-width Concat; "
                  "only attention reads a Concat",
                  run_flag="--tokensplit-linears", run_field="token_linears",
                  run_help="with --rewrites tokensplit (or --tokensplit N): the token-wise "
                  "Linears in chunks too "
                  "('quantscope tokensplit --linears')"),
        CliOption(("--full-width",), "full_width", "flag", False,
                  help="with --linears on a head-split model: keep Q/K/V and the heads' "
                  "context as full-width [T, C] Concats (by default they are kept per head, "
                  "so no Concat there exceeds a size limit that the chunks stay under)"),
        CliOption(("--relay-values",), "relay_values", "flag", False,
                  help="in the per-head form: pass each head's values through a [d, d] "
                  "identity Linear (FP32 exact), so the attention MatMul reads a Linear's "
                  "output, which hailo.attention_16bit lets be 16 bit, instead of a "
                  "Concat's, which it keeps at 8 bit; costs T*d*d MACs per head"),
    ),
    check_lengths=_lengths, digest=_digest, verdict=_verdict, verdict_rank=0,
    nothing_suffix=" to split",
    example="quantscope tokensplit minilm-l6 --seq-len 256 --out split.onnx",
    out_help="split FP32 model to write (.onnx); analyze, plan, repair and export it like any "
             "model (its chunk groups are '<group>/tok<i>')",
    left="left whole", checked_on=_checked_on, auto_config=_auto,
    description="Text encoders need --seq-len (the deployment's length); image models (a "
                "ViT's [B, patches + 1, C]) use their static input shape or --input-shape.",
)
