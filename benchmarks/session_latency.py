"""Latency of nxrt-tvm sessions against onnxruntime on the test models, measured in one run.

    python benchmarks/session_latency.py [--repeat 50] [--json OUT]

Same thread count for both engines (TVM_NUM_THREADS = onnxruntime's
intra_op_num_threads = the cores this process may use). Reports per model:
partitions per EP, declines, max |diff| against onnxruntime, time to a ready
session, median latency of each engine and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import model_zoo  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

import nxrt_tvm as nx  # noqa: E402
from nxrt_tvm.timing import median_seconds  # noqa: E402


def _cases():
    for name, build in model_zoo.ALL.items():
        yield name, build().SerializeToString(), model_zoo.make_inputs(name)
    for name in ("torch_encoder", "tiny_bert"):
        path = ROOT / "tests" / "data" / f"{name}.onnx"
        stored = np.load(path.with_suffix(".npz"))
        yield name, path.read_bytes(), {k: stored[k] for k in stored.files}  # outputs are filtered out below


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    threads = int(os.environ["TVM_NUM_THREADS"])
    rows = []
    for name, model, feeds in _cases():
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        ref = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        feeds = {i.name: feeds[i.name] for i in ref.get_inputs()}
        t = time.perf_counter()
        sess = nx.InferenceSession(model)
        ready_s = time.perf_counter() - t
        got, want = sess.run(None, feeds), ref.run(None, feeds)
        diff = max(
            float(np.max(np.abs(g.astype(np.float64) - w))) if g.size else 0.0 for g, w in zip(got, want)
        )
        nx_s = median_seconds(lambda: sess.run(None, feeds), args.repeat, warmup=3)
        ort_s = median_seconds(lambda: ref.run(None, feeds), args.repeat, warmup=3)
        by_ep = {}
        for p in sess.plan.partitions:
            by_ep[str(p.ep)] = by_ep.get(str(p.ep), 0) + 1
        rows.append(
            {
                "model": name,
                "nodes": sess.plan.node_count,
                "tvm_partitions": by_ep.get("TvmExecutionProvider", 0),
                "cpu_partitions": by_ep.get("CPUExecutionProvider", 0),
                "tvm_nodes": sess.plan.nodes_by_ep().get("TvmExecutionProvider", 0),
                "declines": len(sess.plan.declines),
                "max_abs_diff": diff,
                "ready_s": ready_s,
                "nxrt_ms": nx_s * 1e3,
                "ort_ms": ort_s * 1e3,
                "ratio": nx_s / ort_s,
            }
        )
        print(f"{name}: done", file=sys.stderr)
    print(f"threads: {threads}, repeat: {args.repeat}, TVM untuned (default schedules)")
    print(
        "| model | nodes | TVM nodes | TVM / CPU partitions | declines "
        "| max abs diff | ready (s) | nxrt-tvm (ms) | onnxruntime (ms) | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['nodes']} | {r['tvm_nodes']} "
            f"| {r['tvm_partitions']} / {r['cpu_partitions']} | {r['declines']} "
            f"| {r['max_abs_diff']:.2e} | {r['ready_s']:.2f} "
            f"| {r['nxrt_ms']:.3f} | {r['ort_ms']:.3f} | {r['ratio']:.1f}x |"
        )
    if args.json:
        args.json.write_text(json.dumps({"threads": threads, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
