"""Untuned vs tuned vs onnxruntime, same threads, in one
run; GEMM GFLOP/s against the CPU's measured fp32 peak.

    python benchmarks/tuning.py [--log-dir tuning_logs] [--models mlp gemm ...] [--repeat 30] [--json OUT]
                                [--tune TRIALS [--time-budget S]]

With ``--tune``, the models are tuned first (all of them in one `tune_model` call, so
kernels they share are tuned once; resumable), as the shipped logs were made.

"untuned" uses the default CPU schedules; "tuned" applies the records of this
host's device key under --log-dir (kernels without a record keep the default
schedules; tuning also measured the rules' own schedule, so a record is only
used where a searched schedule beat it). Per model: how many kernels ran a
searched record (exactly, or transferred from the same anchor op), how many
kept the default rule because no searched schedule beat it by 5%, and the trials and tuning
time recorded for this device.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
import onnxruntime as ort  # noqa: E402
from peak import fp32_peak_gflops  # noqa: E402

import nxrt_tvm as nx  # noqa: E402
from nxrt_tvm.lower.pipeline import RULE_KEPT  # noqa: E402
from nxrt_tvm.lower.target import make_target  # noqa: E402
from nxrt_tvm.timing import interleaved_medians  # noqa: E402
from nxrt_tvm.tuning import device_key  # noqa: E402


def _kinds(session) -> Counter:
    kinds: Counter[str] = Counter()
    for kernel in session.kernels().values():
        for v in kernel.variants():
            if v.variant.startswith("tuned"):
                # a compatible key's record counts as what it is (searched, anchor) and as transferred
                kinds[v.variant.split(":transferred", 1)[0]] += 1
                kinds["transferred"] += ":transferred" in v.variant
            elif v.reason.startswith(RULE_KEPT):
                kinds["rule-best"] += 1
                kinds["transferred"] += "(records of " in v.reason
            else:
                kinds["untuned"] += 1
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--log-dir", type=Path, default=ROOT.parent / "tuning_logs")
    parser.add_argument("--models", nargs="+", default=["mlp", "gemm", "transformer_block", "bert", "resnet"])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--tune", type=int, metavar="TRIALS", help="tune the models first with this many trials in all"
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        help="with --tune: the tuning time budget in seconds (see nxrt-tvm tune --help)",
    )
    args = parser.parse_args()
    threads = int(os.environ["TVM_NUM_THREADS"])
    key = device_key(make_target("llvm"))
    if args.tune:
        report = nx.tune_model(
            [models.MODELS[name]() for name in args.models],
            trials=args.tune,
            time_budget=args.time_budget,
            log_dir=args.log_dir,
        )
        print(f"tuned {len(report.tasks)} tasks, {report.trials} trials in {report.seconds / 60:.1f} min")
        for t in report.tasks:
            print(
                f"  {t.name:<50} x{t.weight:<3} trials {t.total_trials:>4}  best {t.best_us or 0:9.1f} us  "
                f"default rules {t.rule_us or 0:9.1f} us" + ("  (default fastest)" if t.best_is_rule else "")
            )
    state_path = args.log_dir / key / "nxrt_tuning_state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    print(
        f"device key {key}: {len(state)} workloads, "
        f"{sum(v.get('trials', 0) for v in state.values())} trials recorded; "
        f"{threads} threads"
    )
    print(
        "| model | onnxruntime (ms) | untuned (ms) | tuned (ms) "
        "| untuned / ORT | tuned / ORT | tuned / untuned "
        "| kernels: searched / anchor / rule kept / untuned (of which transferred) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for name in args.models:
        model, feeds = models.MODELS[name](), models.make_inputs(name)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        untuned = nx.InferenceSession(model)
        tuned = nx.InferenceSession(model, provider_options=[{"tuning_logs": str(args.log_dir)}, {}])
        times = interleaved_medians(
            {
                "ort_ms": lambda: ref.run(None, feeds),
                "untuned_ms": lambda: untuned.run(None, feeds),
                "tuned_ms": lambda: tuned.run(None, feeds),
            },
            args.repeat,
        )
        row = {"model": name, **{k: 1e3 * v for k, v in times.items()}, "kernels": dict(_kinds(tuned))}
        rows.append(row)
        k = row["kernels"]
        print(
            f"| {name} | {row['ort_ms']:.3f} | {row['untuned_ms']:.3f} | {row['tuned_ms']:.3f} "
            f"| {row['untuned_ms'] / row['ort_ms']:.2f}x | {row['tuned_ms'] / row['ort_ms']:.2f}x "
            f"| {row['tuned_ms'] / row['untuned_ms']:.2f}x "
            f"| {k.get('tuned', 0)} / {k.get('tuned:anchor', 0)} "
            f"/ {k.get('rule-best', 0)} / {k.get('untuned', 0)} ({k.get('transferred', 0)}) |"
        )
        if name == "gemm":
            peak = fp32_peak_gflops(threads)
            gflop = 2 * 1024**3 / 1e9
            row["peak_gflops"] = peak
            print(
                f"|  GEMM GFLOP/s | {gflop / row['ort_ms'] * 1e3:.0f} "
                f"| {gflop / row['untuned_ms'] * 1e3:.0f} "
                f"| {gflop / row['tuned_ms'] * 1e3:.0f} | measured fp32 peak {peak:.0f} "
                f"| tuned {gflop / row['tuned_ms'] * 1e3 / peak:.0%} of peak | | |"
            )
    for col in ("untuned_ms", "tuned_ms"):
        ratios = [r[col] / r["ort_ms"] for r in rows]
        print(f"geomean {col[:-3]} / onnxruntime: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"device_key": key, "threads": threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
