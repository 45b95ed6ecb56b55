import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import tiny_models as tm

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.encode import encode
from quantscope.emulate.qdq import build_qdq
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.repair.ranges import choose_range_methods, encode_with_methods
from quantscope.repair.verify import quantized_error
from quantscope.types import Plan, Precision, QuantScheme


def _corrupted_calibration():
    """Clean data, but one calibration value is a 200 spike (a corrupted sample)."""
    m = load_proto(tm.layernorm_block())
    feeds = [tm.sample_inputs(m.proto, n=64, seed=i) for i in range(6)]
    calib = [{k: v.copy() for k, v in f.items()} for f in feeds]
    calib[0]["x"].flat[7] = 200.0
    groups = find_groups(m)
    return m, groups, calibrate(m, groups, calib), feeds


def test_output_proxy_beats_every_global_method():
    m, groups, stats, feeds = _corrupted_calibration()
    plan = Plan.uniform(Precision.A8_W8)
    held_out = [tm.sample_inputs(m.proto, n=64, seed=100 + i) for i in range(2)]
    choice = choose_range_methods(m, stats, plan, feeds[:2])
    assert set(choice.mapping()) == set(encode(m, groups, stats, plan, scheme=QuantScheme()).activations)
    chosen = quantized_error(
        m.proto,
        build_qdq(m, encode_with_methods(m, groups, stats, plan, choice.mapping())),
        held_out,
    )
    minmax = quantized_error(
        m.proto, build_qdq(m, encode(m, groups, stats, plan, scheme=QuantScheme())), held_out
    )
    assert chosen["rel_mse"] < 0.1 * minmax["rel_mse"], (chosen, minmax)
    for method in ("percentile", "mse"):
        other = quantized_error(
            m.proto,
            build_qdq(m, encode(m, groups, stats, plan, scheme=QuantScheme(), method=method)),
            held_out,
        )
        assert chosen["rel_mse"] <= other["rel_mse"] * 1.01


def test_local_proxy_runs_no_model_and_encode_with_methods_matches_encode():
    m, groups, stats, _ = _corrupted_calibration()
    plan = Plan.uniform(Precision.A8_W8)
    choice = choose_range_methods(m, stats, plan, proxy="local")
    assert set(choice.mapping().values()) <= {"minmax", "percentile", "mse"}
    same = encode_with_methods(m, groups, stats, plan, {})
    plain = encode(m, groups, stats, plan, scheme=QuantScheme())
    for t, e in plain.activations.items():
        assert float(same.activations[t].scale) == float(e.scale)
