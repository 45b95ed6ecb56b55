"""Byte-for-byte check of a refactor: run a fixed set of CLI commands on tiny models (the
tests' own builders) and record the sha256 of every file written and every console output.

    PYTHONPATH=<old tree>/src python tools/output_digest.py <old tree> /tmp/old
    PYTHONPATH=<new tree>/src python tools/output_digest.py <new tree> /tmp/new
    python tools/output_digest.py --compare /tmp/old /tmp/new

``--compare`` lists the files whose bytes differ, ignoring what differs only in wall-clock
times (``"seconds"``/``"sweep_seconds"`` values, ``in 0.1 s`` and ``  0.1 s `` in console
lines), and the return codes that differ. Issue 34's moves were checked with it (see
docs/architecture.md).
"""
import hashlib
import json
import os
import sys
from pathlib import Path


def _normal(path: Path) -> bytes:
    import re

    data = path.read_bytes()
    if path.suffix in (".json", ".txt", ".html"):
        text = data.decode("utf-8", "replace")
        text = re.sub(r'("(?:sweep_)?seconds(?:_[a-z]+)?": )[0-9.e+-]+', r"\1T", text)
        text = re.sub(r"\b[0-9]+\.[0-9] s\b", "T s", text)
        data = text.encode()
    return data


if sys.argv[1] == "--compare":
    a, b = Path(sys.argv[2]), Path(sys.argv[3])
    da, db = (json.loads((p / "digests.json").read_text()) for p in (a, b))
    for cmd in da["rc"]:
        if da["rc"][cmd] != db["rc"].get(cmd):
            print(f"return code differs: {cmd}: {da['rc'][cmd]} -> {db['rc'].get(cmd)}")
    for name in sorted(set(da["files"]) | set(db["files"])):
        if name not in da["files"] or name not in db["files"]:
            print(f"only in {'new' if name in db['files'] else 'old'}: {name}")
        elif _normal(a / name) != _normal(b / name):
            print(f"differs: {name}")
    sys.exit(0)

tree, out = Path(sys.argv[1]), Path(sys.argv[2])
sys.path.insert(0, str(tree / "tests"))
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import tiny_models as tm  # noqa: E402

from quantscope.cli import main  # noqa: E402

out.mkdir(parents=True, exist_ok=True)
os.chdir(out)
onnx.save(tm.layernorm_block(), "m.onnx")
np.save("x.npy", np.random.default_rng(0).normal(0, 1, (32, 6, 24)).astype(np.float32))
import test_repair_heads as trh  # noqa: E402

onnx.save(trh._encoder(), "enc.onnx")
rng = np.random.default_rng(0)
np.savez("t.npz", input_ids=rng.integers(100, 1000, (32, trh.SEQ)).astype(np.int64), attention_mask=np.ones((32, trh.SEQ), np.int64))
rc = {}
cmds = [
    "calibrate m.onnx --data x.npy --out s.npz",
    "analyze m.onnx --data x.npy --stats s.npz --proxy 1.0 --out a.json",
    "plan m.onnx --analysis a.json --target hailo10h --max-cost 3.0 --out p.json",
    "plan m.onnx --analysis a.json --target qnn-htp-v73 --max-cost 3.0 --out q.json",
    "check p.json --model m.onnx --target hailo10h",
    "evaluate m.onnx --data x.npy --stats s.npz --plan p.json --json e.json",
    "whatif m.onnx --data x.npy --stats s.npz --plan p.json --json w.json",
    "export p.json --model m.onnx --stats s.npz --format alls --out p.alls",
    "export q.json --model m.onnx --stats s.npz --format qnn --out enc.json",
    "export-qdq m.onnx --stats s.npz --plan p.json --out qdq.onnx",
    "io m.onnx --stats s.npz --plan p.json --json io.json --snippet io_snip.py",
    "groups m.onnx --json g.json",
    "repair m.onnx --data x.npy --stats s.npz --plan p.json --out-model rep.onnx --out-stats rep.npz --out-plan rep.json",
    "lint p.alls --model m.onnx --target hailo10h",
    "headsplit enc.onnx --out enc_h.onnx",
    "rowscale enc_h.onnx --out enc_r.onnx",
    "tokensplit enc.onnx --seq-len 8 --chunk 4 --out enc_t.onnx",
    "calibrate enc.onnx --data t.npz --out enc_s.npz",
    "outscale enc.onnx --stats enc_s.npz --out enc_o.onnx",
    "peel enc.onnx --stats enc_s.npz --out enc_p.onnx",
    "run enc.onnx --data t.npz --target hailo10h --out runh --headsplit --rowscale",
    "run m.onnx --data x.npy --target hailo10h --max-cost 2.0 --out runf",
]
import contextlib  # noqa: E401,E402
import io as _io  # noqa: E402

for i, c in enumerate(cmds):
    buf = _io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            r = main(c.split())
        except SystemExit as e:
            r = f"exit {e.code}"
    Path(f"console_{i:02d}.txt").write_text(buf.getvalue())
    rc[c] = r
    print(f"[{r}] {c}", file=sys.stderr)
digests = {}
for p in sorted(out.rglob("*")):
    if p.is_file() and p.name != "digests.json":
        digests[str(p.relative_to(out))] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
json.dump({"rc": rc, "files": digests}, open(out / "digests.json", "w"), indent=1)
print(json.dumps({"rc": rc, "files": digests}, indent=1))
