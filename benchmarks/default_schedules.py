"""Untuned TVM with and without the default CPU schedules, and with cost-aware claims, against onnxruntime.

    python benchmarks/default_schedules.py [--repeat 20] [--only mlp gemm ...] [--skip-naive]

One process, one thread count for everyone (onnxruntime's intra-op threads =
TVM_NUM_THREADS = the cores this process may use), median of ``--repeat``
runs after a warm-up, in 5 rounds that alternate between the configurations
(the row's figure is the median of the rounds). Columns: onnxruntime, nxrt-tvm with TVM's default
pipeline (``schedule_passes=[]``: naive loops), nxrt-tvm with the default
schedules (``schedule_passes=None``, ``claim_policy="all"``), and nxrt-tvm
with ``claim_policy="cost"`` (partitions measured slower than onnxruntime at
compile time run on the fallback), each relative to onnxruntime. The 1024^3
GEMM also gets GFLOP/s against this CPU's fp32 peak, measured in the same
run (`peak.py`: back-to-back vector FMAs on every thread).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import models  # noqa: E402
from peak import fp32_peak_gflops  # noqa: E402

import nxrt_tvm  # noqa: E402
import nxrt_tvm.data  # noqa: E402
from nxrt_tvm.timing import interleaved_medians, median_seconds  # noqa: E402

BENCH = {
    "mlp": "MLP b64 512-1024-1024-10",
    "resnet": "ResNet-18 1x3x224x224",
    "bert": "BERT encoder seq 128",
    "gemm": "GEMM 1024^3",
    "default": "bundled default model",
}


def _model(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    if name == "default":
        model = onnx.load(nxrt_tvm.data.default_model_path())
        rng = np.random.default_rng(0)
        feeds = {}
        for value in model.graph.input:
            shape = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
        return model, feeds
    return models.MODELS[name](), models.make_inputs(name)


def measure(name: str, repeat: int, threads: int, skip_naive: bool) -> dict:
    """One row: every configuration built first, then timed in interleaved rounds (`interleaved_medians`)."""
    model, feeds = _model(name)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    ort_session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    want = ort_session.run(None, feeds)
    row: dict = {"name": name, "naive": math.nan}
    runs = {"ort": lambda: ort_session.run(None, feeds)}
    configs = (
        ("naive", {"schedule_passes": [], "claim_policy": "all"}),
        ("rules", {"claim_policy": "all"}),
        ("cost", {"claim_policy": "cost"}),
    )
    for key, options in configs:
        if key == "naive" and skip_naive:
            continue
        start = time.perf_counter()
        session = nxrt_tvm.InferenceSession(model, provider_options=[{"target": "llvm", **options}, {}])
        row[key + "_build_s"] = time.perf_counter() - start
        row[key + "_tvm_nodes"] = session.plan.nodes_by_ep().get("TvmExecutionProvider", 0)
        got = session.run(None, feeds)
        row[key + "_err"] = max(
            float(np.max(np.abs(g - w))) / (float(np.max(np.abs(w))) + 1e-12) for g, w in zip(got, want)
        )
        if key == "naive":  # naive kernels are slow: a few runs, timed on their own
            row[key] = 1e3 * median_seconds(lambda: session.run(None, feeds), max(3, repeat // 4))
        else:
            runs[key] = lambda session=session: session.run(None, feeds)
    row.update({key: 1e3 * s for key, s in interleaved_medians(runs, repeat).items()})
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--only", nargs="*", choices=sorted(BENCH))
    ap.add_argument(
        "--skip-naive", action="store_true", help="skip TVM's default pipeline (minutes on ResNet)"
    )
    args = ap.parse_args(argv)
    threads = int(os.environ["TVM_NUM_THREADS"])
    rows = [measure(name, args.repeat, threads, args.skip_naive) for name in (args.only or BENCH)]

    print(
        f"\nthreads: {threads} (onnxruntime intra-op = TVM_NUM_THREADS); "
        f"median of 5 interleaved rounds of {args.repeat} runs\n"
    )
    print(
        "| model | onnxruntime ms | TVM default ms (x ORT) | default schedules ms (x ORT) "
        "| claim_policy=cost ms (x ORT) | TVM nodes all / cost | max rel. err | build s all / cost |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        naive = "skipped" if math.isnan(r["naive"]) else f"{r['naive']:.2f} ({r['naive'] / r['ort']:.1f}x)"
        print(
            f"| {BENCH[r['name']]} | {r['ort']:.2f} | {naive} "
            f"| {r['rules']:.2f} ({r['rules'] / r['ort']:.2f}x) "
            f"| {r['cost']:.2f} ({r['cost'] / r['ort']:.2f}x) "
            f"| {r['rules_tvm_nodes']} / {r['cost_tvm_nodes']} "
            f"| {max(r['rules_err'], r['cost_err']):.1e} "
            f"| {r['rules_build_s']:.1f} / {r['cost_build_s']:.1f} |"
        )
    for key, label in (("rules", "default schedules"), ("cost", "claim_policy=cost")):
        ratios = [r[key] / r["ort"] for r in rows]
        print(
            f"geomean {label} / onnxruntime: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x; "
            f"worst {max(ratios):.2f}x"
        )
    gemm = next((r for r in rows if r["name"] == "gemm"), None)
    if gemm is not None:
        peak = fp32_peak_gflops(threads)
        flops = 2 * 1024**3 / 1e9
        rules, ort_rate = flops / gemm["rules"] * 1e3, flops / gemm["ort"] * 1e3
        print(
            f"GEMM 1024^3: default schedules {rules:.0f} GFLOP/s ({rules / peak:.0%} of peak), onnxruntime "
            f"{ort_rate:.0f} GFLOP/s ({ort_rate / peak:.0%}); measured "
            f"fp32 peak {peak:.0f} GFLOP/s on {threads} threads"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
