"""Untuned vs tuned vs onnxruntime, same threads, in one run; GEMM GFLOP/s against the CPU's fp32 peak.

    python benchmarks/tuning.py [--log-dir tuning_logs] [--models mlp gemm ...] [--repeat 30]

"untuned" uses the default CPU schedules; "tuned" applies the records of this
host's device key under --log-dir (kernels without a record keep the default
schedules). Also prints, per model, how many kernels ran a tuned schedule and
the trials recorded for this device.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import onnxruntime as ort  # noqa: E402

import models  # noqa: E402
import nxrt_tvm as nx  # noqa: E402
from nxrt_tvm.lower.target import make_target  # noqa: E402
from nxrt_tvm.timing import median_seconds  # noqa: E402
from nxrt_tvm.tuning import device_key  # noqa: E402


def _median_ms(fn, repeat: int) -> float:
    return 1e3 * median_seconds(fn, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-dir", type=Path, default=ROOT.parent / "tuning_logs")
    parser.add_argument("--models", nargs="+", default=["mlp", "gemm", "transformer_block", "bert", "resnet"])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--clock-ghz", type=float, default=2.6, help="assumed all-core clock for the fp32 peak")
    args = parser.parse_args()
    threads = int(os.environ["TVM_NUM_THREADS"])
    key = device_key(make_target("llvm"))
    state_path = args.log_dir / key / "nxrt_tuning_state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    print(f"device key {key}: {len(state)} tuned workloads, {sum(v['trials'] for v in state.values())} trials recorded; {threads} threads")
    print("| model | onnxruntime (ms) | untuned (ms) | tuned (ms) | untuned / ORT | tuned / ORT | tuned kernels |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for name in args.models:
        model, feeds = models.MODELS[name](), models.make_inputs(name)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        ort_ms = _median_ms(lambda: ref.run(None, feeds), args.repeat)
        untuned = nx.InferenceSession(model)
        tuned = nx.InferenceSession(model, provider_options=[{"tuning_logs": str(args.log_dir)}, {}])
        un_ms = _median_ms(lambda: untuned.run(None, feeds), args.repeat)
        tu_ms = _median_ms(lambda: tuned.run(None, feeds), args.repeat)
        kernels = [v for k in tuned._kernels for v in k.variants()]
        n_tuned = sum(v.variant == "tuned" for v in kernels)
        ratios.append(tu_ms / ort_ms)
        print(f"| {name} | {ort_ms:.3f} | {un_ms:.3f} | {tu_ms:.3f} | {un_ms / ort_ms:.2f}x | {tu_ms / ort_ms:.2f}x | {n_tuned}/{len(kernels)} |")
        if name == "gemm":
            flop = 2 * 1024**3
            peak = threads * 2 * 16 * 2 * args.clock_ghz  # cores x FMA units x fp32 lanes x 2 flop x GHz
            print(f"|  GEMM GFLOP/s | {flop / ort_ms / 1e6:.0f} | {flop / un_ms / 1e6:.0f} | {flop / tu_ms / 1e6:.0f} | "
                  f"peak {peak:.0f} (assumed {args.clock_ghz} GHz) | {flop / tu_ms / 1e6 / peak:.0%} of peak tuned | |")
    print(f"geomean tuned / onnxruntime: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x")


if __name__ == "__main__":
    main()
