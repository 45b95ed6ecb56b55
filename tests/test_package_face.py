"""The package face imports nothing heavy (its public names load on first use)."""

import subprocess
import sys


def test_import_quantscope_loads_no_numerics() -> None:
    code = ("import sys, quantscope; heavy = [m for m in ('numpy', 'onnx', 'onnxruntime', "
            "'quantscope.stages') if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_names_resolve_and_unknown_ones_fail() -> None:
    import quantscope as qs

    assert qs.Precision.A8_W8.value == "a8_w8"
    assert callable(qs.open_model) and callable(qs.to_device)
    assert set(qs.__all__) <= set(dir(qs))
    try:
        qs.not_a_name  # noqa: B018
    except AttributeError as exc:
        assert "not_a_name" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("an unknown attribute must raise AttributeError")
