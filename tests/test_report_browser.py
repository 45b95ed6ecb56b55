"""The `run` report in a real browser (headless Chromium): no console errors, every image
decodes to a non-zero size, and a screenshot is saved under the test's tmp dir."""

import json
import re
import shutil
import subprocess

import numpy as np
import onnx
import pytest
import tiny_models as tm

from quantscope.pipeline import RunOptions, run_pipeline

BROWSER = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no Chromium on PATH (Debian: apt-get install chromium; "
    ".ci/run installs it)")
FLAGS = ["--headless", "--disable-gpu", "--no-sandbox", "--window-size=1200,3000"]
# writes every image's natural size into the DOM once the page has loaded
MEASURE = ('<script>addEventListener("load",()=>{const p=document.createElement("pre");'
           'p.id="qs-images";p.textContent=JSON.stringify([...document.images].map('
           'i=>[i.alt,i.naturalWidth,i.naturalHeight]));document.body.appendChild(p);});'
           "</script></body>")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    m, x = d / "m.onnx", d / "x.npy"
    onnx.save(tm.layernorm_block(), m)
    np.save(x, np.random.default_rng(0).normal(0, 1, (32, 6, 24)).astype(np.float32))
    run_pipeline(RunOptions(model=str(m), data=str(x), target="hailo10h", out=str(d / "W"),
                            goal=30.0), progress=False)
    return d / "W" / "report.html"


def _chromium(*args):
    done = subprocess.run([BROWSER, *FLAGS, *args], capture_output=True, text=True, timeout=120)
    return done


def console_messages(stderr: str) -> list[str]:
    """Console output of the page (the report runs no script, so any message is an error:
    an uncaught exception, a resource that failed to load)."""
    return re.findall(r":CONSOLE[^\]]*\] (.*)", stderr)


def test_report_renders_without_console_errors_and_saves_a_screenshot(report, tmp_path):
    shot = tmp_path / "report.png"
    done = _chromium("--enable-logging=stderr", "--v=0", f"--screenshot={shot}",
                     report.as_uri())
    assert console_messages(done.stderr) == []
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_console_errors_are_detected(report, tmp_path):
    # the check above can fail: a page that logs an error is caught
    bad = tmp_path / "bad.html"
    bad.write_text(report.read_text().replace(
        "</body>", "<script>console.error('qs-broken')</script></body>"))
    done = _chromium("--enable-logging=stderr", "--v=0", f"--screenshot={tmp_path / 'b.png'}",
                     bad.as_uri())
    assert any("qs-broken" in m for m in console_messages(done.stderr))


def test_every_image_has_a_size(report, tmp_path):
    page = report.read_text()
    n_img = page.count("<img ")
    assert n_img >= 6  # configurations, noise, sensitivity, outliers, Pareto …
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", MEASURE))
    dom = _chromium("--dump-dom", "--virtual-time-budget=5000", probe.as_uri()).stdout
    found = re.search(r'<pre id="qs-images">(.*?)</pre>', dom, re.S)
    assert found, "the page did not finish loading"
    sizes = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert len(sizes) == n_img
    assert all(w > 0 and h > 0 for _, w, h in sizes), sizes
    titles = re.findall(r'<h2 id="(\w+)">', page)
    assert titles == ["verdict", "configs", "noise", "sensitivity", "outliers", "legality",
                      "pareto", "plan", "coverage", "data"]
    assert "Feeding and reading the device" in page and "Clip bounds" in page


def test_route_report_images_decode(tmp_path):
    """The length-bucket section (`quantscope route` → `report --results`) in a browser."""
    from test_tasks_text import tiny_encoder

    from quantscope.cli import main

    onnx.save(tiny_encoder(), tmp_path / "tiny.onnx")
    assert main(["calibrate", str(tmp_path / "tiny.onnx"), "--data", "stdlib-docs",
                 "--out", str(tmp_path / "s.npz")]) == 0
    for name, prec in (("hi", "a16_w16"), ("lo", "a8_w8")):
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {"default": prec, "groups": {}, "target": "ort-cpu"}))
    (tmp_path / "dep.json").write_text(json.dumps({"buckets": [
        {"seq_len": 24, "model": "tiny.onnx", "stats": "s.npz", "plan": "hi.json"},
        {"seq_len": 64, "model": "tiny.onnx", "stats": "s.npz", "plan": "lo.json"}]}))
    out = tmp_path / "out"
    out.mkdir()
    assert main(["route", str(tmp_path / "tiny.onnx"), "--data", "stdlib-docs", "--pairs", "20",
                 "--deployment", str(tmp_path / "dep.json"), "--json",
                 str(out / "route.json")]) == 0
    assert main(["report", "--results", str(out / "route.json"), "--out",
                 str(out / "r.html")]) == 0
    page = (out / "r.html").read_text()
    assert 'alt="buckets"' in page
    probe = out / "probe.html"
    probe.write_text(page.replace("</body>", MEASURE))
    done = _chromium("--dump-dom", "--virtual-time-budget=5000", "--enable-logging=stderr",
                     "--v=0", probe.as_uri())
    assert console_messages(done.stderr) == []
    found = re.search(r'<pre id="qs-images">(.*?)</pre>', done.stdout, re.S)
    assert found, "the page did not finish loading"
    sizes = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert len(sizes) == page.count("<img ") >= 2
    assert all(w > 0 and h > 0 for _, w, h in sizes), sizes
