"""Differential run of the corpus's dynamic-shape models at many sizes against onnxruntime.

    python benchmarks/corpus_sizes.py [--only a,b] [--timeout-s S] [--json OUT]

Each model compiles once with its dims symbolic and TVM claiming all it can
(``NXRT_TVM_CLAIM_POLICY=all``: the default policy may hand a partition to
onnxruntime, which would test nothing), then runs at every combination of the
sizes below, through ``nxrt-tvm run --check`` in a process of its own, so a
crash is a row, not the end of the run. A row gives the worst relative error
over the outputs per size, or what each runtime raised where one refused the
size. Feeds are ``run --check``'s: random floats, 0/1 integers (valid ids and
masks). The corpus comes from ``benchmarks/corpus.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

#: model -> the dims to vary and their sizes (batch 1 and 2; sequences 1 to 512; odd image and audio sizes)
SIZES: dict[str, dict[str, str]] = {
    "bert_tiny": {"batch": "1,2", "seq": "1,8,64,512"},
    "bert_tiny_int8_dynamic": {"batch": "1,2", "seq": "1,8,64,512"},
    "gpt2_tiny": {"batch": "1,2", "seq": "1,8,64,512"},
    "t5_encoder_tiny": {"batch": "1,2", "seq": "1,8,64,512"},
    "lstm_text": {"batch": "1,2", "seq": "1,8,64"},
    "gru_frames": {"batch": "1,2", "frames": "1,7,100"},
    "conv1d_audio": {"batch": "1,2", "samples": "1,4001,16000"},
    "silero_vad_16k_op15": {"batch": "1,2", "sequence": "576,1088"},
    "magika_v3_3": {"unk__214": "1,3"},
    "vit_tiny": {"batch": "1,2"},
    "whisper_encoder_tiny": {"batch": "1,2"},
    "mobilenet_v2": {"batch": "1,3"},
    "mobilenet_v3": {"batch": "1,3"},
    "efficientnet": {"batch": "1,3"},
    "unet": {"batch": "1,2"},
    "yolo_fpn": {"batch": "1,2"},
    "nudenet_yolov8n_320": {"batch": "1", "height": "320,224", "width": "320,416"},
}


def _run(path: Path, dims: dict[str, str], timeout_s: float) -> dict:
    cmd = [sys.executable, "-m", "nxrt_tvm.cli", "run", str(path), "--check", "--json", "--repeat", "3"]
    for name, sizes in dims.items():
        cmd += ["--dim", f"{name}={sizes}"]
    env = {**os.environ, "NXRT_TVM_CLAIM_POLICY": "all"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout_s:.0f} s"}
    if proc.returncode not in (0, 1):  # 1: a mismatch, reported in the JSON
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:300]}"}
    report = json.loads(proc.stdout)
    rows = []
    for check in report["check"]["sizes"]:
        if "outputs" in check:
            errors = [d["max_rel_err"] for d in check["outputs"].values() if d["max_rel_err"] is not None]
            result = f"{max(errors):.1e}" if errors else "no output compared"
        else:
            result = f"nxrt: {check['nxrt_tvm_error'] or 'ran'}; ort: {check['onnxruntime_error'] or 'ran'}"
        rows.append({"dims": check["dims"], "ok": check["ok"], "result": result})
    tvm = sum(1 for p in report["plan"]["partitions"] if p["ep"] == "TvmExecutionProvider")
    return {"sizes": rows, "tvm_partitions": tvm, "ok": report["check"]["ok"]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=Path.home() / ".cache" / "nxrt-tvm" / "corpus")
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(SIZES)
    results = {}
    print("| model | TVM partitions | size | result (worst relative error, or what each raised) |")
    print("|---|---|---|---|")
    for name in names:
        path = args.corpus / f"{name}.onnx"
        if not path.is_file():
            print(f"| {name} | - | - | not in the corpus (run benchmarks/corpus.py) |", flush=True)
            continue
        results[name] = found = _run(path, SIZES[name], args.timeout_s)
        if "error" in found:
            print(f"| {name} | - | - | {found['error']} |", flush=True)
            continue
        for row in found["sizes"]:
            at = " ".join(f"{k}={v}" for k, v in row["dims"].items())
            verdict = "" if row["ok"] else " **MISMATCH**"
            print(f"| {name} | {found['tvm_partitions']} | {at} | {row['result']}{verdict} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
