"""``run --rewrites auto`` (run's default): each rewrite tried where its precondition holds
and its rule binds, kept only when it measures better on the fit data; rank4 applied where
q::linearclip refuses the plan; the choice recorded and reused by a rerun."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_vit
from test_repair_heads import SEQ as HEAD_SEQ
from test_repair_heads import _encoder as attention_encoder
from test_repair_tokens import SEQ, SMALL, H
from test_repair_tokens import _encoder as token_encoder

from quantscope import stages
from quantscope.cli import main
from quantscope.kept import Kept
from quantscope.model.load import load_proto
from quantscope.pipeline.auto import binding_repairs, max_legal_measure
from quantscope.rewrites.auto import TIE_MARGIN, AutoChoice, choose_rewrites, should_try
from quantscope.rewrites.base import recorded
from quantscope.rewrites.registry import REWRITES
from quantscope.targets import load_target


def test_attention_rewrites_bind_where_the_target_keeps_attention_at_8_bit():
    attention, ffn = load_proto(attention_encoder()), load_proto(token_encoder())
    for name in ("headsplit", "rowscale"):
        rw = REWRITES[name]
        yes = should_try(rw, attention, load_target("hailo10h"), HEAD_SEQ, None)
        assert yes.holds and "hailo.attention_16bit keeps attention at 8 bit" in yes.reason
        cpu = should_try(rw, attention, load_target("ort_cpu"), HEAD_SEQ, None)
        assert not cpu.holds and "has no rule attention_16bit" in cpu.reason
        assert not should_try(rw, attention, None, HEAD_SEQ, None).holds  # no target
        no = should_try(rw, ffn, load_target("hailo10h"), SEQ, None)
        assert not no.holds and "no Softmax" in no.reason


def _fit(tmp_path: Path, model, length: int):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (16, SEQ)).astype(np.int64),
             attention_mask=np.ones((16, SEQ), np.int64))
    return stages.at_length(stages.open_data(tmp_path / "x.npz", model, show=False), length)


def _choose(model, fit, length, measure, **kw):
    return choose_rewrites(model, SMALL, length,
                           calibrate=lambda m: stages.calibrate_model(m, fit),
                           measure=measure, reload=lambda p: load_proto(p, "enc"),
                           metric="sqnr_db", **kw)


def test_auto_picks_tokensplit_exactly_when_super_defuse_binds_at_the_length(tmp_path):
    model = load_proto(token_encoder(), "enc")
    for length, binds in ((SEQ, True), (SEQ // 2, False)):  # SMALL's limit: SEQ x H values
        fit = _fit(tmp_path, model, length)
        choice, proto = _choose(model, fit, length,
                                max_legal_measure(fit, SMALL, "sqnr_db", seq_len=length))
        split = next(t for t in choice.trials if t.name == "tokensplit")
        assert split.tried is binds and split.kept is binds, split
        others = [t for t in choice.trials if t.name != "tokensplit"]
        assert not any(t.tried for t in others)  # no Softmax, no outlier channel
        if binds:
            assert "hailo.super_defuse refuses 16 bit" in split.reason
            assert split.after > split.before and choice.final == split.after
            assert choice.baseline == split.before and choice.kept == ("tokensplit",)
            assert [r["name"] for r in recorded(proto)] == ["tokensplit"]
        else:
            assert "allows 16 bit on every token-wise layer at 4 tokens" in split.reason
            assert proto is None and choice.baseline is None and choice.kept == ()


@pytest.mark.parametrize("higher", [True, False])
def test_a_rewrite_that_does_not_measure_better_is_dropped(tmp_path, higher):
    """Measured by graph size (fewer nodes better; then more nodes better, read as
    lower-is-better): tokensplit adds nodes, so it is kept only in the second case; a tie
    (the same figure with and without) is dropped too, unless the measure's second figure
    (the tiebreak) is better."""
    model = load_proto(token_encoder(), "enc")
    fit = _fit(tmp_path, model, SEQ)

    def nodes(m, s):
        return -float(len(m.graph.node))

    choice, proto = _choose(model, fit, SEQ, nodes, higher_is_better=higher)
    split = next(t for t in choice.trials if t.name == "tokensplit")
    assert split.tried and split.after < split.before
    assert split.kept is (not higher) and (proto is None) is higher
    assert "measured not better" in split.reason if higher else "measured better" in split.reason
    tie, proto = _choose(model, fit, SEQ, lambda m, s: 1.0)
    tied = next(t for t in tie.trials if t.name == "tokensplit")  # rotate comes after it
    assert tie.kept == () and proto is None and tied.tried and tied.after == tied.before
    # a tie decided by the second figure (here: more nodes), when it gains > TIE_MARGIN
    more, proto = _choose(model, fit, SEQ, lambda m, s: (1.0, float(len(m.graph.node))),
                          tiebreak="nodes")
    split = next(t for t in more.trials if t.name == "tokensplit")
    assert more.kept == ("tokensplit",) and proto is not None and more.tiebreak == "nodes"
    assert "measured equal, better on nodes" in split.reason
    assert split.tiebreak_after > split.tiebreak_before + TIE_MARGIN
    less, _ = _choose(model, fit, SEQ, lambda m, s: (1.0, -float(len(m.graph.node))))
    assert less.kept == ()


def test_the_choice_round_trips_through_its_record(tmp_path):
    model = load_proto(token_encoder(), "enc")
    fit = _fit(tmp_path, model, SEQ)
    choice, _ = _choose(model, fit, SEQ, max_legal_measure(fit, SMALL, "sqnr_db", seq_len=SEQ),
                        n=16, unit="fit samples")
    again = AutoChoice.from_dict(json.loads(json.dumps(choice.to_dict())))
    assert again == choice
    assert [rw.name for rw, _ in again.configs()] == ["tokensplit"]


def test_rank4_binds_where_linearclip_refuses_the_plan():
    vit = load_proto(tiny_vit.vit_block())
    qnn = binding_repairs(vit, load_target("qnn-htp-v73"), seq_len=None)
    assert [(r["name"], r["binds"]) for r in qnn] == [("rank4", True)]
    assert "qnn.linearclip_5d refuses" in qnn[0]["reason"]
    assert binding_repairs(vit, load_target("hailo10h"), seq_len=None) == []  # no such rule
    from quantscope.repair.rank4 import rank4_linears

    fixed = load_proto(rank4_linears(vit).proto)
    again = binding_repairs(fixed, load_target("qnn-htp-v73"), seq_len=None)
    assert [(r["name"], r["binds"]) for r in again] == [("rank4", False)]


def _small_target(tmp_path: Path) -> str:
    text = (Path(stages.__file__).parents[1] / "targets" / "hailo10h.toml").read_text()
    path = tmp_path / "small.toml"
    path.write_text(text.replace("value = 98304", f"value = {SEQ * H}", 1)
                    .replace('name = "hailo10h"', 'name = "small10h"', 1))
    return str(path)


def test_run_chooses_by_default_records_the_choice_and_a_rerun_reuses_it(tmp_path, capsys,
                                                                         monkeypatch):
    from quantscope.serde import read_json

    onnx.save(token_encoder(), tmp_path / "enc.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (32, SEQ)).astype(np.int64),
             attention_mask=np.ones((32, SEQ), np.int64))
    out = tmp_path / "W"
    argv = ["run", str(tmp_path / "enc.onnx"), "--data", str(tmp_path / "x.npz"), "--target",
            _small_target(tmp_path), "--seq-len", str(SEQ), "--out", str(out)]
    assert main(argv) == 0
    said = capsys.readouterr()
    assert "rewrites auto: tokensplit: kept" in said.err
    # the calibrate stage reads the statistics the choice made of the graph it kept
    assert "calibrate: this graph's statistics on these batches, as calibrated before" in \
        said.err
    assert "rewrites: tokensplit (auto: kept 1 of 1 tried, sqnr_db_channel_min on n=16 fit " \
           "samples)" in said.out
    kept = read_json(out / "rewritten.json", "rewritten")
    assert kept["auto"]["kept"] == ["tokensplit"] and kept["key"]["auto"]["seq_len"] == SEQ
    assert json.loads((out / "plan.json").read_text())["rewrites"]["kept"] == ["tokensplit"]
    verdict = read_json(out / "verdict.json", "verdict")
    assert verdict["rewrites_applied"] == ["tokensplit"] and verdict["tokensplit"]["chunk"] == 4
    assert "split into layers of 4 tokens" in verdict["tokensplit"]["note"]  # the default's
    assert {r["rewrite"]: r["decision"] for r in verdict["rewrites_auto"]["rows"]} == {
        "outscale": "not tried", "peel": "not tried", "headsplit": "not tried",
        "rowscale": "not tried", "tokensplit": "kept", "rotate": "not tried",
        "vrotate": "not tried", "smooth": "not tried", "gatedsplit": "not tried"}
    assert "Rewrites chosen by the run (auto, fit data)" in (out / "report.html").read_text()
    compiled = onnx.load(out / "repaired.onnx")
    assert any(n.name.endswith("/tok1") for n in compiled.graph.node)
    # a rerun: the choice is reused (no measurement), every stage skipped; the given model
    # and the data are opened once (for the checks), the rewritten model not at all
    opened = {"open_model": 0, "load_proto": 0, "open_data": 0}

    def counted(name):
        real = getattr(stages, name)

        def call(*a, **k):
            opened[name] += 1
            return real(*a, **k)
        return call

    for name in opened:
        monkeypatch.setattr(stages, name, counted(name))
    assert main(argv) == 0
    said = capsys.readouterr()
    assert "rewritten model reused" in said.err and "rewrites auto:" not in said.err
    assert "stages run: none;" in said.out
    assert opened == {"open_model": 1, "load_proto": 0, "open_data": 1}, opened
    monkeypatch.undo()
    # --rewrites none: the given model, every stage again, no auto record
    assert main([*argv, "--rewrites", "none"]) == 0
    said = capsys.readouterr().out
    assert "stages run: calibrate," in said, said
    verdict = read_json(out / "verdict.json", "verdict")
    assert verdict["rewrites_applied"] == [] and "rewrites_auto" not in verdict
    assert "rewrites" not in json.loads((out / "plan.json").read_text())


def test_run_applies_rank4_by_itself_where_linearclip_fires(tmp_path, capsys):
    """rank4 applied before planning; the auto choice measures every model with it applied
    (on the unrepaired ViT linearclip refuses every plan, so nothing could be measured):
    an fc2 output channel 60x the others makes outscale and peel apply, and both are
    measured, not "not measurable"."""
    from quantscope.serde import read_json

    vit = tiny_vit.vit_block()
    for init in vit.graph.initializer:
        if init.name == "w_fc2":
            w = onnx.numpy_helper.to_array(init).copy()
            w[:, 3] *= 60.0
            init.CopyFrom(onnx.numpy_helper.from_array(w, init.name))
    onnx.save(vit, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", tiny_vit.tokens(16, seed=3)["x"])
    out = tmp_path / "Q"
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npy"),
                 "--target", "qnn-htp-v73", "--out", str(out)]) == 0
    assert "applied for legality: rank4" in capsys.readouterr().out
    rewrites = json.loads((out / "plan.json").read_text())["rewrites"]
    record = rewrites["repairs"]
    assert [(r["name"], r["applied"]) for r in record] == [("rank4", True)]
    tried = {t["name"]: t for t in rewrites["trials"]}
    assert tried["outscale"]["tried"] and tried["peel"]["tried"], rewrites["trials"]
    assert not any("not measurable" in t["reason"] for t in rewrites["trials"])
    assert rewrites["baseline"] is not None and "rank4 applied to every model measured" \
        in rewrites["measured_on"]
    verdict = read_json(out / "verdict.json", "verdict")
    # quantized, not kept in float (FP16 costs 3x a8_w8 on HTP; with no --max-cost the
    # planner may promote to a16_w8, 2x)
    assert verdict["legal"] and verdict["cost"] < 3.0
    assert "float" not in json.loads((out / "plan.json").read_text())["groups"].values()
    compiled = onnx.load(out / "repaired.onnx")
    assert any(n.name.endswith("/unsqueeze4d") for n in compiled.graph.node)  # rank4's edit
    # the analysis promotes to the target's [promotion]: W8A16 on HTP
    assert json.loads((out / "analysis.json").read_text())["high"] == "a16_w8"
    from quantscope.model.groups import find_groups
    from quantscope.model.load import load_proto
    from quantscope.types import GroupKind

    weighted = {g.name for g in find_groups(load_proto(compiled, "r")).groups
                if g.kind == GroupKind.WEIGHTED}
    groups = json.loads((out / "plan.json").read_text())["groups"]
    assert not {g for g, p in groups.items() if p == "a16_w16"} & weighted, groups


def _per_query(gained: int, lost: int, *, tiebreak_gain: float = 0.0):
    """A measure by per-query scores: 100 queries, 80 agreeing without the rewrite; the
    rewritten (split, more nodes) model gains ``gained`` queries and loses ``lost``."""
    from quantscope.rewrites.auto import Measured

    base = np.zeros(100)
    base[:80] = 1.0
    split = base.copy()
    split[80:80 + gained] = 1.0
    split[:lost] = 0.0

    def measure(m, s):
        rewritten = any(n.name.endswith("/tok1") for n in m.graph.node)
        got = split if rewritten else base
        return Measured(float(got.mean()), 10.0 + (tiebreak_gain if rewritten else 0.0), got)

    return measure


def test_a_rewrite_is_kept_only_when_its_gain_is_beyond_noise(tmp_path):
    """The paired interval over per-query scores: +15 queries of 100 is beyond noise,
    +1 (0.80 -> 0.81, outscale's gain on minilm-l3) is a tie decided by the tiebreak and
    said to be one, -15 is worse beyond noise even with a better tiebreak."""
    model = load_proto(token_encoder(), "enc")
    fit = _fit(tmp_path, model, SEQ)

    def split_trial(measure):
        choice, _ = _choose(model, fit, SEQ, measure, tiebreak="embedding_sqnr_db")
        return choice, next(t for t in choice.trials if t.name == "tokensplit")

    choice, t = split_trial(_per_query(15, 0))
    assert t.kept and "measured better beyond noise" in t.reason
    assert t.interval["outcome"] == "better" and t.interval["lower"] > 0 and \
        t.interval["n"] == 100
    assert choice.to_dict()["trials"][list(REWRITES).index("tokensplit")]["interval"] == \
        t.interval
    _, t = split_trial(_per_query(1, 0))
    assert not t.kept and t.interval["outcome"] == "tie" and t.interval["lower"] < 0
    assert "a tie within noise" in t.reason and t.after > t.before
    _, t = split_trial(_per_query(1, 0, tiebreak_gain=0.5))
    assert t.kept and "a tie within noise" in t.reason and "decided by better " \
        "embedding_sqnr_db (10.00 dB -> 10.50 dB)" in t.reason
    _, t = split_trial(_per_query(0, 15, tiebreak_gain=0.5))
    assert not t.kept and t.interval["outcome"] == "worse" and "worse beyond noise" in t.reason


def test_the_run_measure_gives_each_fit_query_score_of_its_figure(tmp_path):
    from test_tasks_text import tiny_encoder

    from quantscope.pipeline.data import open_fit_data

    model = load_proto(tiny_encoder(), "tiny")
    fit = open_fit_data(model, "stdlib-docs", eval_data=None, pairs=20, tokenizer=None)
    stats = stages.calibrate_model(model, fit, progress=False)
    got = max_legal_measure(fit, load_target("ort-cpu"), "top1_agreement", seq_len=None,
                            tiebreak="embedding_sqnr_db")(model, stats)
    assert got.samples is not None and got.samples.shape == (20,)
    assert got.value == pytest.approx(got.samples.mean()) and got.tiebreak is not None
    tensors = _fit(tmp_path, load_proto(token_encoder(), "enc"), SEQ)  # no per-query form
    enc = load_proto(token_encoder(), "enc")
    plain = max_legal_measure(tensors, SMALL, "sqnr_db", seq_len=SEQ)(
        enc, stages.calibrate_model(enc, tensors))
    assert plain.samples is None


def test_the_run_measure_runs_the_fp32_reference_once_and_measures_the_same(monkeypatch):
    """Every trial is compared with the first model's FP32 outputs, held as the task keeps
    them (a rewrite keeps FP32 within 1e-5): the figures equal a fresh full evaluation's,
    and only the first call runs an FP32 model."""
    from test_tasks_text import tiny_encoder

    from quantscope.analyze import measure as mod
    from quantscope.analyze.measure import evaluate_plans
    from quantscope.emulate import evaluate as emu
    from quantscope.pipeline.data import open_fit_data
    from quantscope.plan.candidates import max_legal

    model = load_proto(tiny_encoder(), "tiny")
    fit = open_fit_data(model, "stdlib-docs", eval_data=None, pairs=20, tokenizer=None)
    stats = stages.calibrate_model(model, fit, progress=False)
    target = load_target("ort-cpu")
    real_open = emu.open_runs
    runs = []
    real = emu.run_model
    monkeypatch.setattr(emu, "run_model", lambda *a, **k: runs.append(1) or real(*a, **k))
    monkeypatch.setattr(mod, "run_model", emu.run_model)
    counted = lambda proto, *a, **k: (  # noqa: E731
        proto is model.proto and runs.append(2)) or real_open(proto, *a, **k)
    monkeypatch.setattr(mod, "open_runs", counted)
    monkeypatch.setattr(emu, "open_runs", counted)  # run_kept's (the FP32 reference's)
    measure = max_legal_measure(fit, target, "top1_agreement", seq_len=None,
                                tiebreak="embedding_sqnr_db")
    first, second = measure(model, stats), measure(model, stats)
    # FP32 once, reduced to the pooled rows as it runs (held), never in lockstep with an
    # emulated run, never whole
    assert runs == [2]
    plan = max_legal(model, target, None).plan
    fresh = evaluate_plans(model, fit, stats, {"p": plan}, scheme=target.scheme,
                           saturation=False)["p"]["metrics"]
    for got in (first, second):
        assert got.value == pytest.approx(fresh["top1_agreement"], abs=1e-12)
        assert got.tiebreak == pytest.approx(fresh["embedding_sqnr_db"], rel=1e-9)


def test_round_two_retries_a_dropped_rewrite_on_top_of_one_kept_after_it(tmp_path):
    """headsplit measures worse alone and better on top of tokensplit (as on minilm-l6 at
    256 tokens): round 2 rebuilds {headsplit, tokensplit} from the given model in the
    registry's order, keeps it, and tokensplit is then built per head (its auto config on
    a head-split model); the record round-trips with the configs as built."""
    from quantscope.rewrites.registry import applied_rewrites
    from quantscope.targets import with_params

    target = with_params(load_target("hailo10h"), {"hailo.super_defuse.max_values": 64})
    model = load_proto(attention_encoder(), "enc")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(1, 30, (8, HEAD_SEQ)).astype(np.int64),
             attention_mask=np.ones((8, HEAD_SEQ), np.int64))
    fit = stages.at_length(stages.open_data(tmp_path / "x.npz", model, show=False), HEAD_SEQ)
    figure = {frozenset(): 0.5, frozenset({"headsplit"}): 0.2,
              frozenset({"tokensplit"}): 0.7, frozenset({"headsplit", "tokensplit"}): 0.9}
    seen = []

    def measure(m, stats):
        names = frozenset(applied_rewrites(m.proto)) & {"headsplit", "tokensplit"}
        seen.append(names)
        return figure[names]

    choice, proto = choose_rewrites(model, target, HEAD_SEQ,
                                    calibrate=lambda m: stages.calibrate_model(m, fit),
                                    measure=measure, reload=lambda p: load_proto(p, "enc"),
                                    metric="top1_agreement")
    by = {(t.name, t.round): t for t in choice.trials}
    assert not by[("headsplit", 1)].kept and by[("tokensplit", 1)].kept
    assert by[("headsplit", 2)].kept and by[("headsplit", 2)].before == 0.7
    assert by[("headsplit", 2)].after == 0.9 and choice.final == 0.9
    assert choice.kept == ("headsplit", "tokensplit")  # the registry's order
    assert [r["name"] for r in recorded(proto)] == ["headsplit", "tokensplit"]
    assert recorded(proto)[1]["config"]["linears"] is True  # per head on the split model
    assert seen[-1] == {"headsplit", "tokensplit"}
    again = AutoChoice.from_dict(json.loads(json.dumps(choice.to_dict())))
    assert [(rw.name, cfg.linears if rw.name == "tokensplit" else None)
            for rw, cfg in again.configs()] == [("headsplit", None), ("tokensplit", True)]
    # nothing kept after a dropped rewrite: no round 2
    figure[frozenset({"tokensplit"})] = 0.4
    choice, _ = choose_rewrites(model, target, HEAD_SEQ,
                                calibrate=lambda m: stages.calibrate_model(m, fit),
                                measure=measure, reload=lambda p: load_proto(p, "enc"),
                                metric="top1_agreement")
    assert all(t.round == 1 for t in choice.trials) and choice.kept == ()


def test_auto_tokensplit_chunks_fit_the_target_size_limit():
    """The chunk auto tries is the largest ceil(SEQ / k) the size rule allows at 16 bit: half
    the tokens where they fit, a third where half is at the limit (mpnet-base's 768
    channels at 256 tokens on hailo10h), none (the default) where no chunk fits."""
    from quantscope.rewrites.tokensplit import fitting_chunk
    from quantscope.targets.profile import with_params

    model = load_proto(token_encoder(), "enc")
    assert fitting_chunk(model, SMALL, SEQ) == SEQ // 2
    half_at_limit = with_params(SMALL, {"hailo.super_defuse.max_values": SEQ * H // 2})
    assert fitting_chunk(model, half_at_limit, SEQ) == 3  # ceil(8 / 3) x 24 = 72 < 96
    config = REWRITES["tokensplit"].auto_config(frozenset(), model, half_at_limit, SEQ)
    assert config.chunk == 3 and not config.linears
    nothing_fits = with_params(SMALL, {"hailo.super_defuse.max_values": H})
    assert fitting_chunk(model, nothing_fits, SEQ) is None
    assert fitting_chunk(model, None, SEQ) is None and fitting_chunk(model, SMALL, None) is None
    assert REWRITES["tokensplit"].auto_config(frozenset({"headsplit"}), model, SMALL,
                                               SEQ).linears


def test_the_trials_calibrate_each_graph_once(monkeypatch):
    """Round 2 rebuilt each retried set from the given model and calibrated that same graph
    again for each retry (the l3 acceptance run: the given model three times, 5 s each),
    and the calibrate stage calibrated the graph the choice kept again. Calibrations are
    now remembered by content (stages.open.calibrate_model): the same graph (even a fresh
    copy) on the same batches is calibrated once, another graph, other batches or another
    method again, and only the last few are kept."""

    from quantscope.stages import open as sopen
    from quantscope.types import Dataset, Stats

    calls = []

    def calibrate(m, groups, batches, *, method, progress):
        calls.append(m)
        return Stats(tensors={}, method=method, num_batches=1, num_samples=1)

    monkeypatch.setattr(sopen, "calibrate", calibrate)
    kept = Kept(budget=-1, weigh=sopen._stats_bytes, least=sopen.KEPT_STATS)
    monkeypatch.setattr(sopen, "_KEPT", kept)  # by count alone (below: by bytes)
    batch = {"ids": np.arange(6, dtype=np.int64).reshape(1, 6)}
    data = Dataset(name="d", calibration=(batch,), evaluation=(batch,))

    def calib(m, data=data, method="minmax"):
        return sopen.calibrate_model(m, data, method=method)

    a, b = (load_proto(token_encoder(), "a"), load_proto(attention_encoder(), "b"))
    first = calib(a)
    assert calib(load_proto(token_encoder(), "a copy")) is first and len(calls) == 1
    assert calib(b) is not first and len(calls) == 2
    other = {"ids": batch["ids"] + 1}
    assert calib(a, Dataset(name="d", calibration=(other,), evaluation=(batch,))) is not first
    assert calib(a, method="percentile") is not first and len(calls) == 4
    others = [load_proto(token_encoder(), "x") for _ in range(sopen.KEPT_STATS)]
    for i, m in enumerate(others):  # other content (the graph's name is in it)
        m.proto.graph.name = f"other{i}"
        calib(m)
    assert len(calls) == 4 + sopen.KEPT_STATS
    calib(a)  # pushed out by the last ones: calibrated again
    assert len(calls) == 5 + sopen.KEPT_STATS
    # more are kept while their statistics fit in the budget (KEPT_STATS_BYTES)
    kept.budget = 1 << 30
    for m in others:
        m.proto.graph.name += "again"
        calib(m)
    n = len(calls)
    assert [calib(m) for m in (a, *others)] and len(calls) == n  # all still kept
