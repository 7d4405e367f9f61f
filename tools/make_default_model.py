#!/usr/bin/env python
"""Regenerate nxrt_tvm/data/default.onnx (the bundled quick-start model).

Usage: python tools/make_default_model.py [--out PATH] [--seed N]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nxrt_tvm.data.make_default import write_default_model  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(ROOT / "nxrt_tvm" / "data" / "default.onnx"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    model = write_default_model(args.out, seed=args.seed)
    size = pathlib.Path(args.out).stat().st_size

    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(args.out, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)
    (probs,) = sess.run(None, {"image": x})
    assert probs.shape == (1, 10) and abs(float(probs.sum()) - 1.0) < 1e-4, probs
    print(
        f"wrote {args.out}: {size} bytes, {len(model.graph.node)} nodes; ORT ok, probs sum={probs.sum():.6f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
