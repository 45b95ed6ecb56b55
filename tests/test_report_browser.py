"""The `run` and `demo` reports in a real browser (headless Chromium): no console errors,
every image decodes to a non-zero size, a screenshot is saved under the test's tmp dir, and
the layout holds at 1400 px: no horizontal overflow, the verdict in the first screen, no
`None`/`nan` table cell."""

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
# the layout at the viewport width: page width, the verdict's top, cells that print None/nan
LAYOUT = ('<script>addEventListener("load",()=>{const d=document.documentElement;'
          'const v=document.getElementById("verdict");const bad=[...document.querySelectorAll('
          '"td,th")].map(c=>c.textContent.trim()).filter(t=>t.split(/,\\s*/).some('
          'x=>/^(none|nan|-?inf)$/i.test(x)));const p=document.createElement("pre");'
          'p.id="qs-layout";p.textContent=JSON.stringify({scroll:d.scrollWidth,client:'
          'd.clientWidth,height:d.scrollHeight,verdict:v?v.getBoundingClientRect().top:null,'
          'bad});document.body.appendChild(p);});</script></body>')
WIDTH = 1400


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    m, x = d / "m.onnx", d / "x.npy"
    onnx.save(tm.layernorm_block(), m)
    np.save(x, np.random.default_rng(0).normal(0, 1, (32, 6, 24)).astype(np.float32))
    run_pipeline(RunOptions(model=str(m), data=str(x), target="hailo10h", out=str(d / "W"),
                            goal=30.0), progress=False)
    return d / "W" / "report.html"


@pytest.fixture(scope="module")
def text_report(tmp_path_factory):
    """A retrieval run (token inputs, held-out pairs, the whatif) on a tiny encoder."""
    from test_evaluate_streaming import _mixed_encoder, pairs_file

    from quantscope.cli import main

    d = tmp_path_factory.mktemp("text")
    onnx.save(_mixed_encoder().proto, d / "enc.onnx")
    pairs_file(d / "pairs.jsonl", 60)
    assert main(["run", str(d / "enc.onnx"), "--data", str(d / "pairs.jsonl"), "--pairs", "30",
                 "--target", "hailo10h", "--goal", "0.999", "--max-cost", "1.2", "--whatif",
                 "--finetune", "off", "--out", str(d / "W")]) == 0
    return d / "W"


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory):
    """``demo --report`` on a tiny text encoder (what test_bad_inputs runs the demo on)."""
    from onnx import numpy_helper
    from test_bad_inputs import text_encoder

    from quantscope.cli import main

    d = tmp_path_factory.mktemp("demo")
    model = text_encoder()
    emb = next(t for t in model.graph.initializer if t.name == "emb")
    emb.CopyFrom(numpy_helper.from_array(  # room for the packaged BERT tokenizer's ids
        np.random.default_rng(0).normal(0, 1, (30522, 8)).astype(np.float32), "emb"))
    onnx.save(model, d / "enc.onnx")
    tm.write_pairs(d / "pairs.jsonl", 6)
    assert main(["demo", "--model", str(d / "enc.onnx"), "--data", str(d / "pairs.jsonl"),
                 "--report", str(d / "d.html")]) == 0
    return d / "d.html"


@pytest.fixture(scope="module")
def report_seen(report, tmp_path_factory):
    """``report`` in Chromium once (:func:`layout_and_images`): its layout and its images'
    natural sizes, read by the image test and the layout test."""
    return layout_and_images(report, tmp_path_factory.mktemp("seen"))


@pytest.fixture
def decoder_report(searched_decoder):
    """``run`` on the tiny decoder (small amounts of text, ``--rewrites search``: its
    trials' table too; conftest's one run for the session): its report.html."""
    return searched_decoder[0] / "report.html"


def _chromium(*args, flags=FLAGS):
    done = subprocess.run([BROWSER, *flags, *args], capture_output=True, text=True, timeout=120)
    return done


def layout(page_path, tmp_path) -> dict:
    """The page's layout in Chromium at 1400 x 900 px."""
    probe = tmp_path / "layout.html"
    probe.write_text(page_path.read_text().replace("</body>", LAYOUT))
    flags = [*FLAGS[:-1], f"--window-size={WIDTH},900"]
    dom = _chromium("--dump-dom", "--virtual-time-budget=5000", probe.as_uri(), flags=flags)
    found = re.search(r'<pre id="qs-layout">(.*?)</pre>', dom.stdout, re.S)
    assert found, "the page did not finish loading"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def layout_and_images(page_path, tmp_path) -> tuple[dict, list]:
    """The page's layout at 1400 x 900 px (:func:`layout`) and every image's natural size
    (``MEASURE``), from one Chromium load: the layout is measured first, before the sizes'
    ``<pre>`` is added (an image's natural size does not depend on the window)."""
    from html import unescape

    probe = tmp_path / "layout_images.html"
    probe.write_text(page_path.read_text().replace("</body>", LAYOUT).replace("</body>", MEASURE))
    flags = [*FLAGS[:-1], f"--window-size={WIDTH},900"]
    dom = _chromium("--dump-dom", "--virtual-time-budget=5000", probe.as_uri(),
                    flags=flags).stdout
    found = [re.search(f'<pre id="qs-{k}">(.*?)</pre>', dom, re.S) for k in ("layout", "images")]
    assert all(found), "the page did not finish loading"
    got, sizes = (json.loads(unescape(f.group(1))) for f in found)
    return got, sizes


def check_fits(got: dict, *, verdict: bool = True) -> dict:
    """``got`` (:func:`layout`): no overflow, no None/nan cell, the verdict on the first screen."""
    assert got["scroll"] <= WIDTH and got["scroll"] <= got["client"], got  # no overflow
    assert got["bad"] == [], got["bad"]
    if verdict:
        assert got["verdict"] is not None and got["verdict"] < 900, got  # the first screen
    return got


def assert_fits(page_path, tmp_path, *, verdict: bool = True) -> dict:
    return check_fits(layout(page_path, tmp_path), verdict=verdict)


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


def test_every_image_has_a_size(report, report_seen):
    page = report.read_text()
    n_img = page.count("<img ")
    assert n_img >= 6  # configurations, noise, sensitivity, outliers, Pareto …
    sizes = report_seen[1]  # the page in Chromium, with MEASURE
    assert len(sizes) == n_img
    assert all(w > 0 and h > 0 for _, w, h in sizes), sizes
    titles = re.findall(r'<h2 id="(\w+)">', page)
    assert titles == ["verdict", "configs", "pareto", "plan", "legality", "noise",
                      "sensitivity", "outliers", "coverage", "data"]
    assert "Feeding and reading the device" in page and "Clip bounds" in page
    # how to feed and read the device comes right after the verdict, not last
    assert page.index("Feeding and reading the device") < page.index('<h2 id="configs">')


def test_run_report_fits_1400px_with_the_verdict_first(report_seen):
    check_fits(report_seen[0])


def test_text_run_report_fits_and_says_what_binds_and_the_host_steps(text_report, tmp_path):
    from html import unescape

    from quantscope.serde import read_json

    page = text_report / "report.html"
    assert_fits(page, tmp_path)
    text = unescape(page.read_text())
    v = read_json(text_report / "verdict.json", "verdict")
    assert v["held_out"] == {"samples": 30, "unit": "pairs", "rows": 60,
                             "source": v["held_out"]["source"], "held": True}
    assert "n=30 held-out pairs" in text
    # the word-embedding lookup by input_ids on the host; the mask fed as int64
    assert any("look up" in s and "by input_ids on the host" in s for s in v["host_steps"])
    assert any("int64" in s and "attention_mask" in s for s in v["host_steps"])
    assert any("mean-pool" in s for s in v["host_steps"])  # [B,S,H] token states
    assert any("symbolic dims" in s for s in v["host_steps"])
    bm = v["binds_measured"]
    gains = v["whatif"]["gains"]
    top = max(gains, key=gains.get)  # what the whatif measured costs most, if anything
    assert bm["kind"] == (top if gains[top] > 0 else None)
    assert "pts" in bm["sentence"] and bm["sentence"] in text
    # the details are folded below the short verdict
    assert text.index("details: verdict.json") < text.index("Every line of the verdict")
    # (the short verdict may name what binds too; every line is in the folded details)
    assert "binds (measured, held out)" in text[text.index("<summary>Every line"):]


def test_decoder_run_report_fits_with_the_verdict_first_and_images_decode(decoder_report,
                                                                         tmp_path):
    from html import unescape

    got, sizes = layout_and_images(decoder_report, tmp_path)
    check_fits(got)
    assert len(sizes) == 4 and all(w > 0 and h > 0 for _, w, h in sizes), sizes  # + whatif, prefix
    text = unescape(decoder_report.read_text())
    # the chosen candidate (on the tiny random decoder act16 and act16+w16 are within
    # noise of each other: which one wins is not what this checks)
    assert re.search(r"act16[\w+]* \(chosen\)", text) and "prefill: present.0.key" in text
    assert "Load the constant KV prefix" in text and "a8_w4 (GPTQ)" in text
    assert "<h2>Rewrites searched</h2>" in text and "rotate, smooth, gatedsplit" in text
    assert "<h2>What if</h2>" in text and "decode not quantized" in text


def test_demo_report_fits_and_says_what_to_do_next(demo_report, tmp_path):
    page = demo_report.read_text()
    assert_fits(demo_report, tmp_path, verdict=False)
    assert "What to do next" in page and "quantscope run" in page
    assert '<th title="top1_agreement">top-1 agreement</th>' in page  # the key as tooltip
    assert re.search(r"<td>\d+\.\d %</td>", page)  # shares in percent, one format
    assert "6 pairs" in page  # the sample size of every figure


def test_the_layout_check_catches_an_overflowing_page(report, tmp_path):
    # the checks above can fail: a wide table and a None cell are caught
    bad = tmp_path / "wide.html"
    bad.write_text(report.read_text().replace(
        "</body>", "<table><tr>" + "<td>x" * 3 + "".join(
            f"<td>{'w' * 60}</td>" for _ in range(40)) + "<td>None</td></tr></table></body>"))
    got = layout(bad, tmp_path)
    assert got["scroll"] > WIDTH and got["bad"] == ["None"]


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


# every name of this model is markup or script; a script that runs marks the page
XSS_NAMES = {"first": "<script>alert(1)</script>conv#{a}(b),c=d",
             "second": "ü€😀/" + "L" * 300, "gemm": "gemm'\"\\n\\",
             "inp": 'in"><img src=x onerror=alert(1)>\'q\\',
             "out": 'out<script>alert(1)</script>"q"\\,=#',
             "weight": "w1<svg onload=alert(1)>", "tensor": "t</title><script>alert(1)</script>"}
PWNED = ('<head><script>window.alert=()=>document.documentElement.setAttribute("data-pwned",'
         '"1")</script>')
# after loading: how many script elements, which elements carry an on* attribute, and
# whether every name is on the page as text
SCRIPTS = ('<script>addEventListener("load",()=>{const p=document.createElement("pre");'
           'p.id="qs-xss";const on=[...document.querySelectorAll("*")].filter(e=>[...e.'
           'attributes].some(a=>a.name.startsWith("on"))).map(e=>e.tagName);p.textContent='
           'JSON.stringify({scripts:document.scripts.length,on,text:document.body.innerText});'
           'document.body.appendChild(p);});</script></body>')


def _xss_probe(page: str, tmp_path) -> dict:
    probe = tmp_path / "xss.html"
    probe.write_text(page.replace("<head>", PWNED, 1).replace("</body>", SCRIPTS))
    dom = _chromium("--dump-dom", "--virtual-time-budget=5000", probe.as_uri()).stdout
    found = re.search(r'<pre id="qs-xss">(.*?)</pre>', dom, re.S)
    assert found, "the page did not finish loading"
    from html import unescape
    return {**json.loads(unescape(found.group(1))), "pwned": 'data-pwned="1"' in dom}


@pytest.mark.parametrize("target", ["hailo8", "qnn_htp_v73"])
def test_names_that_are_markup_stay_text_in_the_run_report(tmp_path, target):
    """A model whose node, tensor, input and output names are HTML and script: ``run`` on
    it completes, and its report in Chromium runs no script of theirs (an ``alert`` that
    fires marks the page), has no element with an event attribute, and shows every name
    as text."""
    from test_hostile_names import conv_chain

    from quantscope.cli import main

    n = XSS_NAMES
    onnx.save(conv_chain(n["first"], n["second"], n["gemm"], tensor=n["tensor"],
                         inp=n["inp"], out=n["out"], weight=n["weight"]), tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", **{n["inp"]: np.random.default_rng(0).normal(
        0, 1, (16, 3, 8, 8)).astype(np.float32)})
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", target, "--finetune", "off", "--out", str(tmp_path / "W")]) == 0
    got = _xss_probe((tmp_path / "W" / "report.html").read_text(), tmp_path)
    assert not got["pwned"] and got["on"] == [] and got["scripts"] == 2, got  # the probes
    for name in (n["first"], n["inp"], n["out"]):
        assert name in got["text"], name
    # the probe can fail: a name written raw is caught
    caught = _xss_probe((tmp_path / "W" / "report.html").read_text().replace(
        "</body>", n["inp"] + "</body>"), tmp_path)
    assert caught["pwned"] and caught["on"] == ["IMG"]
