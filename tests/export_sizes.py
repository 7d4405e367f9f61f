"""Child process of tests/test_exports.py: one export, one session, every size against onnxruntime.

Prints one JSON line per size: {"size": [batch, seq], "want": "ok" | error text, "got": "ok" |
"<EpError subclass>: text", "rel": worst error relative to the output's scale, "off": the share of
output elements off by more than 1e-3 of their output's scale, "elements": nxrt-tvm's element count per
output, or null}. A crash kills
this process, not the test run: the parent checks the exit status.

Usage: python tests/export_sizes.py NAME SIZES_JSON [SEED [CACHE_DIR]]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nxrt_tvm as nx  # noqa: E402

DATA = ROOT / "tests" / "data"

#: per export: the token-id range of its embedding table, and the fixed dims of float inputs
EXPORTS = {
    "tiny_bert": {"vocab": 1000},
    "tiny_t5_int8": {"vocab": 256},
    "torch_encoder": {"x": (16, 64)},
}


def feeds(name: str, batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    spec = EXPORTS[name]
    if "x" in spec:  # torch_encoder: x [batch, 16, 64]; `seq` is unused
        return {"x": rng.standard_normal((batch, *spec["x"])).astype(np.float32)}
    ids = rng.integers(0, spec["vocab"], (batch, seq)).astype(np.int64)
    mask = rng.integers(0, 2, (batch, seq)).astype(np.int64)
    mask[:, :1] = 1  # every row attends to something
    return {"input_ids": ids, "attention_mask": mask}


def errors(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[float, float]:
    """(worst error relative to each output's scale, share of elements off by more than 1e-3 of it)."""
    worst, off, total = 0.0, 0, 0
    for g, w in zip(got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            return float("inf"), 1.0
        if w.size:
            scale = max(float(np.abs(w).max()), 1e-30)
            diff = np.abs(g.astype(np.float64) - w) / scale
            worst, off, total = max(worst, float(diff.max())), off + int((diff > 1e-3).sum()), total + w.size
    return worst, off / max(total, 1)


def main(argv: list[str]) -> int:
    name, sizes = argv[0], json.loads(argv[1])
    rng = np.random.default_rng(int(argv[2]) if len(argv) > 2 else 0)
    path = DATA / f"{name}.onnx"
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    cache = {"cache_dir": argv[3]} if len(argv) > 3 else {}
    sess = nx.InferenceSession(path, providers=[("TvmExecutionProvider", cache), "CPUExecutionProvider"])
    for batch, seq in sizes:
        feed = feeds(name, batch, seq, rng)
        try:
            want, want_says = ref.run(None, feed), "ok"
        except Exception as exc:  # noqa: BLE001 - onnxruntime refusing a size is an outcome
            want, want_says = None, str(exc).splitlines()[0]
        try:
            got, got_says = sess.run(None, feed), "ok"
        except nx.EpError as exc:
            got, got_says = None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        rel, off = errors(got, want) if got is not None and want is not None else (None, None)
        print(
            json.dumps(
                {
                    "size": [batch, seq],
                    "want": want_says,
                    "got": got_says,
                    "rel": rel,
                    "off": off,
                    "elements": None if got is None else [int(g.size) for g in got],
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
