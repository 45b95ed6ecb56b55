"""Console forms of results: an evaluation, a planner result, a whatif.

Moved here from ``quantscope.stages`` (which re-exports every name).
"""

from __future__ import annotations

from typing import Any

from quantscope.analyze.whatif import WHATIF_KEYS
from quantscope.emulate.class_axes import read_words
from quantscope.report import fmt

OUTPUT_LINE = ("sqnr_db", "sqnr_db_channel_min", "collapsed_channels", "cosine_mean",
               "abs_err_max", "decision_agreement", "exact_agreement")
"""What the console shows per output (those an output has: one-value outputs have no
cosine, tensors without channels no channel figures)."""


def format_result(result: dict[str, Any]) -> str:
    m = result["metrics"]
    lines = [f"model {result['model']}  data {result['data']}  plan default "
             f"{result['plan']['default']} (+{len(result['plan'].get('groups', {}))} overrides)"]
    # shares in percent, each with the items it counted (the counts are no rows)
    lines += [f"  {k:<24} {fmt.counted(k, m)}" for k in m if not fmt.is_count(k)]
    outs = {k: v for k, v in result.get("outputs", {}).items()
            if "sqnr_db" in v or "exact_agreement" in v}
    if len(outs) > 1 or any("sqnr_db_channel_min" in v for v in outs.values()):
        lines += [f"  output {k}: {output_line(v)}" for k, v in outs.items()]
    if "coverage" in result:
        lines += ["  " + line for line in _coverage_lines(result["coverage"])]
    if result.get("saturation_note"):
        lines.append(f"  {result['saturation_note']}")
    lines += [f"  note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)


def output_line(entry: dict[str, Any]) -> str:
    """An output's figures (:data:`OUTPUT_LINE`), the per-channel ones followed by the
    axis they are over (the entry's one line, :func:`read_words`): ``sqnr_db_channel_min
    0.0 dB, collapsed_channels 1 (per channel on axis 2, 20 channels: the classes of the
    declared ctc layout)``."""
    read = read_words(entry)
    last = next((k for k in ("collapsed_channels", "sqnr_db_channel_min") if k in entry), "")
    return ", ".join(f"{key} {fmt.value(key, entry[key])}"
                     + (f" ({read})" if read and key == last else "")
                     for key in OUTPUT_LINE if key in entry)


def _coverage_lines(cov: dict[str, Any]) -> list[str]:
    from quantscope.emulate.coverage import Coverage

    return Coverage(
        weights_quantized=cov["weights_quantized"],
        activations_quantized=cov["activations_quantized"],
        weights_float=tuple((r["tensor"], r["op_type"], r["why"]) for r in cov["weights_float"]),
        lookup_tables=tuple(cov["lookup_tables"]),
        ops_float=tuple((r["node"], r["op_type"], r["why"]) for r in cov["ops_float"]),
    ).lines()

def format_whatif(result: dict[str, Any]) -> str:
    """The console form of :func:`whatif_families`."""
    m = result["metric"]

    def line(label: str, r: dict[str, Any]) -> str:
        extra = "  ".join(f"{k} {fmt.value(k, r[k])}" for k in WHATIF_KEYS if k in r)
        return f"  {label:<34} {m} {fmt.value(m, r[m])} ({fmt.gain(m, r['gain'])})  {extra}"

    out = [f"where the plan's error is ({result['note']}):", line("the plan", result["plan"])]
    out += [line(f"{r['kind']} ({r['groups']} groups) at a16_w16", r) for r in result["kinds"]]
    out.append(line(f"all {result['all']['groups']} at a16_w16", result["all"]))
    h = result.get("headroom")
    if result.get("headroom_note"):
        out.append(f"note: {result['headroom_note']}")
    if h:
        out.append(f"how far the goal is ({h['note']}):")
        out += ["  error x" + f"{r['scale']:<5g} " + "  ".join(
            f"{k} {fmt.value(k, r[k])}" for k in r if k != "scale") for r in h["rows"]]
        if "goal" in h:
            out.append(f"  {h['sentence']}")
    return "\n".join(out)

def race_lines(race: dict[str, Any] | None) -> list[str]:
    """The plan file's ``race`` entry in words: what stopped where, estimate +- interval."""
    if not race:
        return []
    if race.get("unsupported"):
        return [race["unsupported"]]
    lines = []
    for r in race.get("races", []):
        stopped = [c for c in r["candidates"] if c["stopped"]]
        lines.append(f"race ({race['metric']}, {r['samples']} pairs, looks at "
                     f"{', '.join(map(str, r['looks']))}): {len(stopped)} of "
                     f"{len(r['candidates'])} candidate(s) stopped, the rest measured in full")
        m = race["metric"]
        lines += [f"  {c['name']} stopped at {c['n']} pairs: {fmt.gain(m, c['difference'])} "
                  f"({fmt.gain(m, c['half_width'])}) vs {c['rival']}" for c in stopped]
    if lines:
        lines.append(f"race rule: {race['races'][0]['rule']}; {race['note']}")
    return lines


def format_search(result: dict[str, Any]) -> str:
    """Console form of a planner result (the plan JSON's ``pareto`` entry)."""
    c = result.get("chosen", {})
    m = str(result.get("metric"))
    mq = str(result.get("measured_metric") or m)  # the measured (and ranked) figures' metric

    def pred(v: Any) -> str:  # a prediction in its metric's unit (shares in percent)
        return fmt.value(m, v)

    def fig(v: Any) -> str:  # a measured or ranked figure in the measured metric's unit
        return fmt.value(mq, v)

    budget = fmt.budget(m, result.get("budget"), result.get("higher_is_better", True))
    lines = [f"metric {m} (predicted)" + (f", {mq} (measured)" if mq != m else "")
             + f"; budget {budget}; "
             f"chosen: cost {c.get('cost')}, predicted {pred(c.get('predicted'))}, measured "
             f"{fig(c.get('measured'))}; budget met: {result.get('met')}"]
    if result.get("measured_on"):
        lines.append(f"measured on: {result['measured_on']}")
    e = result.get("engines")
    if e:  # which engine ranked the candidates, which measured (stages/rank.py)
        lines.append(f"search: {e['line']}" + (
            f"; chosen plan: {fig(e['measured'])} in {e['measured_by']}, {fig(e['ranked'])} "
            f"ranked by {e['ranked_by']} (difference {fmt.gain(mq, e['difference'])})"
            if "ranked" in e else ""))
    if (result.get("choice") or {}).get("line"):  # no quality goal: how noise chose
        lines.append(f"chosen (fit data): {result['choice']['line']}")
    for p in result.get("points", []):
        ranked = f" ranked {fig(p['ranked'])}" if p.get("ranked") is not None else ""
        lines.append(f"  front: cost {p['cost']:<9} predicted {pred(p['predicted']):<10} measured "
                     f"{fig(p.get('measured')):<10}{ranked} ({len(p.get('groups', {}))} "
                     f"promoted, {p.get('origin')})")
    for b in result.get("blockers", [])[:4]:
        lines.append(f"  blocked by {b['rule']}: {len(b['groups'])} group(s), "
                     f"{fmt.gain(m, b['gain'])} predicted gain forgone")
    if result.get("binding"):
        lines.append(f"binding: {result['binding']}")
    ft = result.get("finetune")
    if ft:
        drift = ", ".join(f"{k} {fmt.value(k, v)}" for k, v in ft.get("fp32_drift", {}).items())
        fm = ft["metric"]
        lines.append(f"finetune ({'+'.join(ft['repairs'])}, {ft['seconds']} s): {fm} "
                     f"{fmt.value(fm, ft['before'])} -> {fmt.value(fm, ft['after'])} (measured "
                     "in ORT); fine-tuned FP32 vs "
                     f"original FP32: {drift}" + (f"; skipped: {ft['skipped']}"
                                                  if ft.get("skipped") else "")
                     + (f"; DROPPED: {ft['dropped']}" if ft.get("dropped") else ""))
    lines += race_lines(result.get("race"))
    for r in result.get("seq_lens", []):
        fit = f", {r['texts_fit']:.0%} of the texts fit" if "texts_fit" in r else ""
        lines.append(f"  seq {r['seq_len']}: cost {r['cost']}, predicted {pred(r['predicted'])}, "
                     f"measured {fig(r['measured'])}, {r['promoted']} promoted, binding "
                     f"{r['binding'] or '-'}{fit}"
                     + ("   <- chosen" if r["seq_len"] == result.get("seq_len") else ""))
    if result.get("goal"):
        lines.append(result["goal"]["verdict"])
        if result["goal"].get("hint"):
            lines.append(result["goal"]["hint"])
    lines += [f"note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)
