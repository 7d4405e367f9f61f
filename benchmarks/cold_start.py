"""Time to a ready session: compile from ONNX vs load from EPContext vs compile-cache hit vs onnxruntime.

    python benchmarks/cold_start.py [--models default resnet50 bert_tiny] [--loads 5] [--json OUT]

A model is `default` (the bundled one), a real model of the corpus (benchmarks/corpus.py makes it) or
one of benchmarks/models.py's hand-built ones.

For each model: a session compiling from the plain ONNX model; compile_model
to an EPContext model, embedded and external, then sessions that load it with
compiling disabled; a session on the plain model hitting a warm compile cache;
onnxruntime's own session creation. Each load is the first of a fresh process (a
deployment starting; imports not counted), as is onnxruntime's; times are medians of
--loads processes. "reload" is a second session of the embedded model in one process
(a process loads a blob once). Also artifact sizes with and without weights (weightless blobs), and
what the imports left out cost: `import nxrt_tvm` against `import onnxruntime`, each in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import corpus  # noqa: E402  (benchmarks/corpus.py)
import models  # noqa: E402  (benchmarks/models.py)
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import nxrt_tvm as nx  # noqa: E402
from nxrt_tvm.data import default_model_path  # noqa: E402
from nxrt_tvm.timing import median_seconds  # noqa: E402


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _median(fn, n: int) -> float:
    return median_seconds(fn, n, warmup=0)


def _deploy() -> nx.SessionOptions:
    options = nx.SessionOptions()
    options.add_session_config_entry("session.disable_model_compile", "1")
    return options


def _worker(kind: str, path: str, cache_dir: str) -> None:
    """One load in this (fresh) process; prints its seconds."""
    if kind == "ort":
        started = time.perf_counter()
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    elif kind == "cache":
        started = time.perf_counter()
        nx.InferenceSession(path, provider_options=[{"cache_dir": cache_dir}, {}])
    else:
        started = time.perf_counter()
        nx.InferenceSession(path, _deploy())
    print(time.perf_counter() - started)


def _fresh(kind: str, path: Path, loads: int, cache_dir: Path | None = None) -> float:
    """Median over `loads` fresh processes of one load's seconds."""
    times = []
    for _ in range(loads):
        args = [sys.executable, __file__, "--worker", kind, str(path), str(cache_dir or "")]
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
        times.append(float(out.strip().splitlines()[-1]))
    return sorted(times)[len(times) // 2]


def _import_s(module: str, loads: int) -> float:
    """Median over `loads` fresh processes of `import module`'s seconds."""
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    times = [
        float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
        for _ in range(loads)
    ]
    return sorted(times)[len(times) // 2]


def _size(files) -> int:
    return sum(Path(f).stat().st_size for f in files)


def measure(name: str, src: Path, work: Path, loads: int) -> dict:
    compile_s = _timed(lambda: nx.InferenceSession(src))
    embedded = nx.compile_model(src, work / f"{name}_emb.onnx", progress=False)
    external = nx.compile_model(src, work / f"{name}_ext.onnx", embed=False, progress=False)
    lean = nx.compile_model(src, work / f"{name}_lean.onnx", embed=False, weightless=True, progress=False)
    emb_s = _fresh("load", embedded.output, loads)
    ext_s = _fresh("load", external.output, loads)
    lean_s = _fresh("load", lean.output, loads)
    nx.InferenceSession(embedded.output, _deploy())
    reload_s = _median(lambda: nx.InferenceSession(embedded.output, _deploy()), loads)
    cache = work / f"{name}_cache"
    nx.InferenceSession(src, provider_options=[{"cache_dir": str(cache)}, {}])  # fill the cache
    hit_s = _fresh("cache", src, loads, cache)
    ort_s = _fresh("ort", src, loads)
    blobs = lambda r: _size(f for f in r.files if f.suffix == ".so")  # noqa: E731
    return {
        "model": name,
        "onnx_bytes": src.stat().st_size,
        "partitions": embedded.compiled_partitions,
        "compile_s": compile_s,
        "load_embedded_s": emb_s,
        "load_external_s": ext_s,
        "load_weightless_s": lean_s,
        "reload_s": reload_s,
        "cache_hit_s": hit_s,
        "ort_create_s": ort_s,
        "speedup_embedded": compile_s / emb_s,
        "speedup_external": compile_s / ext_s,
        "embedded_model_bytes": _size(embedded.files),
        "external_blob_bytes": blobs(external),
        "weightless_blob_bytes": blobs(lean),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["default", "squeezenet", "resnet50", "bert_tiny"])
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", nargs=3, metavar=("KIND", "PATH", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(*args.worker)
        return
    imports = {module: _import_s(module, args.loads) for module in ("nxrt_tvm", "onnxruntime")}
    rows = []
    with tempfile.TemporaryDirectory(prefix="nxrt-cold-") as tmp:
        work = Path(tmp)
        for name in args.models:
            if name == "default":
                src = default_model_path()
            elif (corpus.default_dir() / f"{name}.onnx").is_file():
                src = corpus.default_dir() / f"{name}.onnx"
            else:
                src = work / f"{name}.onnx"
                onnx.save(models.MODELS[name](), src)
            rows.append(measure(name, src, work, args.loads))
            print(f"{name}: done", file=sys.stderr)
    mb = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    print(
        "| model | partitions | compile (s) | EPContext embedded (ms) | external (ms) "
        "| weightless (ms) | reload (ms) | cache hit (ms) | onnxruntime create (ms) "
        "| compile / embedded load | model+blobs MiB (embedded / external blobs / weightless blobs) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['partitions']} | {r['compile_s']:.2f} "
            f"| {r['load_embedded_s'] * 1e3:.1f} | {r['load_external_s'] * 1e3:.1f} "
            f"| {r['load_weightless_s'] * 1e3:.1f} | {r['reload_s'] * 1e3:.1f} "
            f"| {r['cache_hit_s'] * 1e3:.1f} "
            f"| {r['ort_create_s'] * 1e3:.1f} | {r['speedup_embedded']:.0f}x "
            f"| {mb(r['embedded_model_bytes'])} / {mb(r['external_blob_bytes'])} "
            f"/ {mb(r['weightless_blob_bytes'])} |"
        )
    print(
        f"imports (not in the loads above): nxrt_tvm {imports['nxrt_tvm'] * 1e3:.0f} ms, "
        f"onnxruntime {imports['onnxruntime'] * 1e3:.0f} ms"
    )
    if args.json:
        args.json.write_text(json.dumps({"imports_s": imports, "models": rows}, indent=2))


if __name__ == "__main__":
    main()
