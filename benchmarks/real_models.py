"""nxrt-tvm against onnxruntime and OpenVINO on the real-model corpus (benchmarks/corpus.py).

    python benchmarks/real_models.py [--dir DIR] [--only NAME,...] [--rounds 12] [--window-s 0.3]
        [--min-calls 3] [--threads 2] [--json OUT] [--timeout-s 600]
        [--runtimes onnxruntime,nxrt-tvm,openvino] [--seq 16,128]

Reads ``DIR/manifest.json`` (make the corpus first: ``python benchmarks/corpus.py``). For each model,
every runtime gets a worker process of its own (``real_models.py --worker RUNTIME MODEL ...``), made one
after the other: it makes its session, runs it untimed for ``WARMUP_S`` (and at least ``WARMUP_CALLS``
runs), saves its outputs for the parity check and waits. Then ``--rounds`` rounds, the order of the
runtimes alternating, each worker in turn timing one window while the others wait idle: ``SETTLE_S`` of
untimed runs (the previous worker's thread pool may still spin, its data left the caches), then runs
timed for ``--window-s`` (at least ``--min-calls``; ``nxrt_tvm.timing.timed_window``). This host's speed
changes between regimes seconds apart: every runtime's windows are spread over the same span, and each
ratio is taken round by round, between windows seconds apart, not between processes minutes apart
(one process after the other, 2 rounds, put an all-onnxruntime nxrt-tvm plan at 1.23x onnxruntime).

All get the same thread count:
onnxruntime ``intra_op_num_threads``, OpenVINO ``INFERENCE_NUM_THREADS`` (with ``PERFORMANCE_HINT``
LATENCY and ``INFERENCE_PRECISION_HINT`` f32: its default on AVX-512-BF16 CPUs is bf16), nxrt-tvm
``TVM_NUM_THREADS`` with the default ``InferenceSession`` options (plus the repository's
``tuning_logs`` when they have a folder for this machine's device key), its fallback
``intra_op_num_threads``. nxrt-tvm's worker reports its TVM and CPU partitions and the
implementation of each TVM kernel (``kernel_variants()``), of the session that ran the timed calls: a
model with symbolic input dims is built again for the feeds' shapes on the third call with them
(``nxrt_tvm.runtime.specialise``), and that build's time is its own column, not part of the ready time.
The session has no per-kernel timing, so the tvm-default column counts kernels (those that run TVM's
untuned default lowering: no tuning record and no schedule rule), not run time.

The table: median latency of each runtime (over all its timed runs), nxrt/ORT and nxrt/OV (the
median of the per-round ratios of the windows' medians), the same ratios of the fastest windows (the
speed with the least interference from the rest of a shared machine, as `timeit` advises its minimum),
ready times, partitions, tvm-default kernels, kernels that ran a tuning record, and parity: the largest
relative difference over the outputs, ``max|a - b| / max(max|b|, 1e-6)`` with onnxruntime as ``b``. The
last row is the geomean of the ratios. A worker that crashes or runs past ``--timeout-s`` (to be ready,
or for a window) is reported in its cell; the run goes on.
OpenVINO is optional (``pip install -e '.[bench]'``): without it its columns are left out, said.

``--seq 16,128`` times the models with a symbolic sequence dim (the transformer exports) at each
length instead: one session of each runtime serves the length of its row, as a user's exported model
serves whatever length comes.

Time on a quiet machine only: a neighbour's load hurts onnxruntime's spinning threads far more
than the others' (see shared/TVM_NOTES.md, "Peers on these machines").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import corpus  # noqa: E402

RUNTIMES = ("onnxruntime", "nxrt-tvm", "openvino")
MODULES = {"onnxruntime": "onnxruntime", "nxrt-tvm": "nxrt_tvm", "openvino": "openvino"}
RESULT = "RESULT "  # the worker's line of JSON starts with this (TVM prints to stdout too)


# ------------------------------------------------------------------ workers


def _load_feeds(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as stored:
        return {k: stored[k] for k in stored.files}


def _save_outputs(path: Path, outputs: list) -> list[list[int]]:
    arrays = {f"o{i}": np.asarray(o) for i, o in enumerate(outputs) if isinstance(o, np.ndarray)}
    np.savez(path, **arrays)
    return [list(np.shape(o)) for o in outputs]


def _tuning_logs() -> Path | None:
    """The repository's tuning_logs folder, when it holds records for this machine's device key."""
    logs = ROOT / "tuning_logs"
    if not logs.is_dir():
        return None
    from nxrt_tvm.lower.target import make_target
    from nxrt_tvm.tuning import device_key

    return logs if (logs / device_key(make_target("llvm"))).is_dir() else None


def _run_onnxruntime(model: Path, feeds: dict, threads: int):
    import onnxruntime as ort

    started = time.perf_counter()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    ready = time.perf_counter() - started
    return ready, lambda: sess.run(None, feeds), lambda: {"version": ort.__version__}


def _run_openvino(model: Path, feeds: dict, threads: int):
    import openvino as ov

    started = time.perf_counter()
    config = {
        "INFERENCE_NUM_THREADS": threads,
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "f32",
    }
    compiled = ov.Core().compile_model(str(model), "CPU", config)
    request = compiled.create_infer_request()
    ready = time.perf_counter() - started
    count = len(compiled.outputs)

    def run():
        request.infer(feeds)
        return [request.get_output_tensor(i).data.copy() for i in range(count)]

    return ready, run, lambda: {"version": ov.__version__}


def _run_nxrt(model: Path, feeds: dict, threads: int):
    if os.environ.get("TVM_NUM_THREADS") != str(threads):
        raise RuntimeError(f"TVM_NUM_THREADS is {os.environ.get('TVM_NUM_THREADS')!r}, not {threads}")
    import nxrt_tvm as nx
    from nxrt_tvm.lower.device_key import device_key
    from nxrt_tvm.lower.target import make_target

    logs = _tuning_logs()
    # the fallback gets onnxruntime's thread count too (its default, 0, is not always `threads` threads)
    options = [{} if logs is None else {"tuning_logs": str(logs)}, {"intra_op_num_threads": threads}]
    started = time.perf_counter()
    sess = nx.InferenceSession(
        str(model), providers=["TvmExecutionProvider", "CPUExecutionProvider"], provider_options=options
    )
    ready = time.perf_counter() - started

    def describe() -> dict:
        """What ran the timed calls: the session built for the feeds' shapes where their recurring made
        one (`nxrt_tvm.runtime.specialise`; its build was paid in a warm-up call), else the session."""
        serving = sess.session_for(feeds)
        by_ep: dict[str, int] = {}
        for p in serving.plan.partitions:
            by_ep[str(p.ep)] = by_ep.get(str(p.ep), 0) + 1
        variants: dict[str, int] = {}
        for vs in serving.kernel_variants().values():
            for v in vs:
                variants[v.variant] = variants.get(v.variant, 0) + 1
        return {
            "version": nx.__version__,
            "device": device_key(make_target("llvm")),
            "tuning_logs": None if logs is None else str(logs),
            "shape_build_s": None if serving is sess else serving.load_seconds,
            "tvm_partitions": by_ep.get("TvmExecutionProvider", 0),
            "cpu_partitions": by_ep.get("CPUExecutionProvider", 0),
            "tvm_nodes": serving.plan.nodes_by_ep().get("TvmExecutionProvider", 0),
            "nodes": sum(serving.plan.nodes_by_ep().values()),
            "declines": len(serving.plan.declines),
            "kernel_variants": variants,
            "tvm_default_kernels": variants.get("tvm-default", 0),
            "tvm_kernels": sum(variants.values()),
        }

    return ready, lambda: sess.run(None, feeds), describe


def _timing():
    """`nxrt_tvm.timing` (stdlib only), loaded without importing the `nxrt_tvm` package: that loads
    TVM, seconds of start-up and a runtime the onnxruntime and OpenVINO workers should not carry."""
    if "nxrt_tvm" in sys.modules:
        import nxrt_tvm.timing

        return nxrt_tvm.timing
    package = importlib.util.find_spec("nxrt_tvm")  # finds, does not run, the package
    path = Path(next(iter(package.submodule_search_locations))) / "timing.py"
    spec = importlib.util.spec_from_file_location("_nxrt_tvm_timing", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


#: untimed runs first, for this long: the steady state a deployed session sees (a nxrt-tvm session ran
#: its first ~20 runs of gpt2_tiny at 2x, ~40 ms, after its compile; onnxruntime's first runs grow its arena)
WARMUP_S = 0.5
#: and at least this many (nxrt_tvm.runtime.specialise.SPECIALISE_AFTER, not imported: see `_timing`)
WARMUP_CALLS = 3
#: each window first runs untimed for this long (at least one call): the process timed before it leaves
#: its thread pool spinning for a while and its data in the caches
SETTLE_S = 0.05
#: a window's timed calls run for at least this long (and at least `--min-calls`)
WINDOW_S = 0.3
#: rounds of windows, one window of every runtime a round: this host's speed changes between regimes
#: seconds apart (onnxruntime on a 0.3 ms model: 290 or 520 us per call for seconds at a time), so each
#: runtime's windows are spread over the whole span and the ratio is taken round by round
ROUNDS = 12
READY, WINDOW = "READY ", "WINDOW "


def worker(
    runtime: str, model: Path, feeds_path: Path, out: Path, threads: int, min_calls: int, window_s: float
) -> int:
    """Make the session, warm it, save its outputs, say READY; then time one window per `window` line on
    stdin, and report (RESULT) at `done`."""
    feeds = _load_feeds(feeds_path)
    make = {"onnxruntime": _run_onnxruntime, "openvino": _run_openvino, "nxrt-tvm": _run_nxrt}[runtime]
    ready, run, describe = make(model, feeds, threads)
    timing = _timing()
    # at least SPECIALISE_AFTER calls: a nxrt-tvm session builds for shapes its calls repeat on the third
    timing.warm_up(run, WARMUP_S, WARMUP_CALLS)
    shapes = _save_outputs(out, run())  # what the timed calls run, checked for parity
    _say(READY, {"ready_s": ready, "output_shapes": shapes})
    for line in sys.stdin:
        if line.strip() == "window":
            _say(WINDOW, {"samples_s": timing.timed_window(run, window_s, min_calls, settle_s=SETTLE_S)})
        elif line.strip() == "done":
            break
    _say(RESULT, {"ok": True, "runtime": runtime, "model": model.name, "threads": threads, **describe()})
    return 0


def _say(prefix: str, message: dict) -> None:
    print(prefix + json.dumps(message), flush=True)


def _worker_main(args: argparse.Namespace) -> int:
    runtime, model = args.worker
    try:
        return worker(runtime, Path(model), args.feeds, args.out, args.threads, args.min_calls, args.window_s)
    except Exception as exc:  # the parent reports it in the runtime's cell
        _say(RESULT, {"ok": False, "runtime": runtime, "error": f"{type(exc).__name__}: {exc}"[:2000]})
        return 0


# ------------------------------------------------------------------ parent


class WorkerFailed(Exception):
    """A worker that reported an error, crashed or ran past its time: `cell` is what its table cell says."""

    def __init__(self, error: str, cell: str):
        super().__init__(error)
        self.cell = cell


class Worker:
    """One runtime's worker process for one model, driven line by line (`worker`)."""

    def __init__(self, runtime: str, model: Path, feeds: Path, out: Path, args: argparse.Namespace):
        self.runtime, self.timeout_s = runtime, args.timeout_s
        env = dict(os.environ, TVM_NUM_THREADS=str(args.threads))
        options = {
            "--feeds": feeds,
            "--out": out,
            "--threads": args.threads,
            "--min-calls": args.min_calls,
            "--window-s": args.window_s,
        }
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", runtime, str(model)]
        cmd += [str(v) for item in options.items() for v in item]
        self._stderr = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: TVM may write much to it
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            start_new_session=True,
        )
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith((READY, WINDOW, RESULT)):
                self._lines.put(line)
        self._lines.put(None)  # end of output: the worker exited

    def _next(self, prefix: str) -> dict:
        try:
            line = self._lines.get(timeout=self.timeout_s)
        except queue.Empty:
            self.kill()
            raise WorkerFailed(f"timeout after {self.timeout_s:g} s", "timeout") from None
        if line is None:
            self.proc.wait()
            self._stderr.seek(0)
            tail = self._stderr.read().strip().splitlines()[-5:]
            code = self.proc.returncode
            how = f"signal {-code}" if code < 0 else f"exit {code}"
            raise WorkerFailed(f"crashed ({how}): " + " | ".join(tail), f"crash ({how})")
        message = json.loads(line[line.index(" ") + 1 :])
        if line.startswith(RESULT) and not message["ok"]:
            raise WorkerFailed(message["error"], "error")
        if not line.startswith(prefix):
            raise WorkerFailed(f"expected {prefix.strip()}, got {line[:200]}", "error")
        return message

    def _send(self, command: str) -> None:
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except OSError:  # it exited: _next says how
            pass

    def ready(self) -> dict:
        return self._next(READY)

    def window(self) -> list[float]:
        self._send("window")
        return self._next(WINDOW)["samples_s"]

    def finish(self) -> dict:
        self._send("done")
        return self._next(RESULT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and anything it started (its group)
        self.proc.wait()


def time_model(
    name: str, model: Path, feeds: Path, runtimes: list[str], tmp: Path, args: argparse.Namespace
) -> dict[str, dict]:
    """Per runtime, its report: every worker made and warmed (one at a time), then `args.rounds` rounds
    of one window each, the order alternating; a worker that fails is reported, the rest go on."""
    workers: dict[str, Worker] = {}
    results: dict[str, dict] = {}
    for rt in runtimes:
        out = tmp / f"{name}.{rt}.npz"
        started = time.perf_counter()
        worker = Worker(rt, model, feeds, out, args)
        try:
            ready = worker.ready()
        except WorkerFailed as exc:
            worker.kill()  # reaped: it exited (or was killed) as it failed
            results[rt] = _failed(rt, exc)
            continue
        workers[rt] = worker
        results[rt] = {"ok": True, "runtime": rt, "outputs": str(out), "windows_ms": [], **ready}
        results[rt]["start_wall_s"] = time.perf_counter() - started
    try:
        for k in range(args.rounds):
            for rt in _order(list(workers), k):
                try:
                    samples = workers[rt].window()
                except WorkerFailed as exc:
                    results[rt] = _failed(rt, exc)
                    workers.pop(rt).kill()
                    continue
                results[rt]["windows_ms"].append([s * 1e3 for s in samples])
        for rt, worker in list(workers.items()):
            try:
                results[rt].update(worker.finish())
            except WorkerFailed as exc:
                results[rt] = _failed(rt, exc)
    finally:
        for worker in workers.values():
            worker.kill()
    for rt, r in results.items():
        if r["ok"]:
            medians = [statistics.median(w) for w in r["windows_ms"]]
            r["median_ms"] = statistics.median([s for w in r["windows_ms"] for s in w])
            r["best_ms"] = min(medians)
            r["window_medians_ms"] = medians
            state = f"{r['median_ms']:.3f} ms ({len(medians)} windows)"
        else:
            state = " ".join(r["error"].split())[:200]
        print(f"{name} {rt}: {state}", file=sys.stderr, flush=True)
    return results


def _failed(runtime: str, exc: WorkerFailed) -> dict:
    return {"ok": False, "runtime": runtime, "error": str(exc)[:2000], "cell": exc.cell}


def rel_diff(outputs: Path, reference: Path) -> float:
    """Largest max|a - b| / max(max|b|, 1e-6) over the outputs (inf when shapes or counts differ)."""
    with np.load(outputs) as a, np.load(reference) as b:
        if sorted(a.files) != sorted(b.files):
            return math.inf
        worst = 0.0
        for k in b.files:
            x, y = a[k].astype(np.float64), b[k].astype(np.float64)
            if x.shape != y.shape:
                return math.inf
            if y.size == 0:
                continue
            if np.any(np.isnan(x) != np.isnan(y)):
                return math.inf  # NaN where the reference has a number (or the other way round)
            x, y = np.nan_to_num(x, nan=0.0), np.nan_to_num(y, nan=0.0)
            worst = max(worst, float(np.max(np.abs(x - y))) / max(float(np.max(np.abs(y))), 1e-6))
        return worst


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarise(name: str, runs: dict[str, dict]) -> dict:
    """One table row from one model's worker reports (`time_model`)."""
    row: dict = {"model": name, "runtimes": {}}
    for rt, r in runs.items():
        row["runtimes"][rt] = {
            "median_ms": r.get("median_ms"),
            "ready_s": r.get("ready_s"),
            "failures": [] if r["ok"] else [r["error"]],
            "cell": None if r["ok"] else r["cell"],
        }
    nx = runs.get("nxrt-tvm", {"ok": False})
    for key, _, best, peer in RATIOS:
        other = runs.get(peer, {"ok": False})
        if not (nx["ok"] and other["ok"]):
            row[key] = None
        elif best:  # the fastest windows: the speed with the least interference from the machine
            row[key] = nx["best_ms"] / other["best_ms"]
        else:  # round by round: both runtimes' windows of a round saw the same regime of the host
            pairs = zip(nx["window_medians_ms"], other["window_medians_ms"])
            row[key] = _median([a / b for a, b in pairs])
    if nx["ok"]:
        for k in (
            "tvm_partitions",
            "cpu_partitions",
            "tvm_default_kernels",
            "tvm_kernels",
            "kernel_variants",
            "tuning_logs",
            "shape_build_s",
        ):
            row[k] = nx.get(k)
    ref = runs.get("onnxruntime", {"ok": False})
    for rt, key in (("nxrt-tvm", "parity_nxrt"), ("openvino", "parity_ov")):
        got = runs.get(rt, {"ok": False})
        ok = got["ok"] and ref["ok"]
        row[key] = rel_diff(Path(got["outputs"]), Path(ref["outputs"])) if ok else None
    return row


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


SHORT = {"onnxruntime": "ORT", "nxrt-tvm": "nxrt", "openvino": "OV"}
#: the ratio columns: (row key, header, of the fastest windows (else round by round), the peer runtime)
RATIOS = tuple(
    (key + suffix, f"nxrt/{SHORT[peer]}{label}", best, peer)
    for best, suffix, label in ((False, "", ""), (True, "_best", " (best windows)"))
    for peer, key in (("onnxruntime", "nxrt_vs_ort"), ("openvino", "nxrt_vs_ov"))
)
TVM_DEFAULT_HEADER = "tvm-default kernels (count / all TVM kernels; no per-kernel timing)"
TUNED_HEADER = "tuned kernels (a record of this device, or transferred / all TVM kernels)"


def tuned_kernels(variants: dict[str, int]) -> int:
    """Kernels that ran a tuning record's schedule (`tuned`, `tuned:anchor`, `tuned:transferred from
    <key>`): how much of "tuned where logs exist" a model's figures hold."""
    return sum(count for variant, count in variants.items() if variant.startswith("tuned"))


def _ms(row: dict, rt: str) -> str:
    cell = row["runtimes"][rt]
    return cell["cell"] or _fmt(cell["median_ms"], ".3f")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _columns(runtimes: list[str]) -> list[tuple[str, Callable[[dict], str]]]:
    """(header, cell of a row or None for the geomean row) for the runtimes that ran."""
    cols: list[tuple[str, Callable[[dict], str]]] = [("model", lambda r: r["model"])]
    for rt in runtimes:
        cols.append((f"{SHORT[rt]} (ms)", lambda r, rt=rt: _ms(r, rt)))
    nx = "nxrt-tvm" in runtimes
    for key, header, _, peer in RATIOS:
        if nx and peer in runtimes:
            cols.append((header, lambda r, key=key: _ratio(r[key])))
    cols.append(
        (
            f"ready {' / '.join(SHORT[rt] for rt in runtimes)} (s)",
            lambda r: " / ".join(_fmt(r["runtimes"][rt]["ready_s"], ".2f") for rt in runtimes),
        )
    )
    if nx:
        cols.append(("nxrt build at the feeds' shapes (s)", lambda r: _fmt(r.get("shape_build_s"), ".2f")))
        cols.append(
            (
                "TVM / CPU partitions",
                lambda r: (
                    "-"
                    if r.get("tvm_partitions") is None
                    else f"{r['tvm_partitions']} / {r['cpu_partitions']}"
                ),
            )
        )
        cols.append(
            (
                TVM_DEFAULT_HEADER,
                lambda r: (
                    "-"
                    if r.get("tvm_kernels") is None
                    else f"{r['tvm_default_kernels']} / {r['tvm_kernels']}"
                ),
            )
        )
        cols.append(
            (
                TUNED_HEADER,
                lambda r: (
                    "-"
                    if r.get("tvm_kernels") is None
                    else f"{tuned_kernels(r.get('kernel_variants') or {})} / {r['tvm_kernels']}"
                ),
            )
        )
    if "onnxruntime" in runtimes:
        for rt, key in (("nxrt-tvm", "parity_nxrt"), ("openvino", "parity_ov")):
            if rt in runtimes:
                cols.append((f"parity {SHORT[rt]} vs ORT", lambda r, key=key: _fmt(r[key], ".1e")))
    return cols


def print_table(rows: list[dict], runtimes: list[str], notes: list[str]) -> None:
    cols = _columns(runtimes)
    print("| " + " | ".join(h for h, _ in cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(cell(r) for _, cell in cols) + " |")
    geo = {header: key for key, header, _, _ in RATIOS}
    cells = ["**geomean**"] + [
        _ratio(geomean([r[geo[h]] for r in rows])) if h in geo else "" for h, _ in cols[1:]
    ]
    print("| " + " | ".join(cells) + " |")
    for r in rows:
        for rt, c in r["runtimes"].items():
            for err in dict.fromkeys(c["failures"]):  # each once, however many rounds it failed
                print(f"- {r['model']}, {rt}: {' '.join(err.split())[:400]}")
    for note in notes:
        print(f"- {note}")


def _seq_axes(model: Path) -> dict[str, list[int]]:
    """Per input, the axes of its symbolic sequence dims (a dim name with "seq" in it)."""
    import onnx

    graph = onnx.load(model, load_external_data=False).graph
    axes = {
        i.name: [k for k, d in enumerate(i.type.tensor_type.shape.dim) if "seq" in d.dim_param.lower()]
        for i in graph.input
    }
    return {name: found for name, found in axes.items() if found}


def _at_lengths(name: str, model: Path, feeds: Path, lengths: list[int], tmp: Path) -> list[tuple]:
    """(row name, model, feeds) per length for a model with a sequence dim (none for others): the
    corpus feeds tiled or cut along it, attention masks all ones."""
    axes = _seq_axes(model)
    if not axes:
        return []
    stored = _load_feeds(feeds)
    cases = []
    for n in lengths:
        resized = {}
        for key, array in stored.items():
            for axis in axes.get(key, []):
                array = np.take(array, np.arange(n) % array.shape[axis], axis=axis)
            resized[key] = np.ones_like(array) if "mask" in key else array
        path = tmp / f"{name}.seq{n}.npz"
        np.savez(path, **resized)
        cases.append((f"{name}@seq{n}", model, path))
    return cases


def _order(runtimes: list[str], k: int) -> list[str]:
    return runtimes if k % 2 == 0 else runtimes[::-1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, default=None, help="the corpus (default: corpus.py's)")
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help="rounds of one timed window of every runtime"
    )
    parser.add_argument(
        "--window-s", type=float, default=WINDOW_S, help="a window's timed calls run this long"
    )
    parser.add_argument("--min-calls", type=int, default=3, help="and at least this many calls")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the rows (and every worker's report) here")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per worker (session + runs)")
    parser.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"subset of {','.join(RUNTIMES)}")
    parser.add_argument(
        "--seq",
        help="comma-separated sequence lengths: run only the models with a symbolic sequence dim, once per "
        "length (rows MODEL@seqN; feeds tiled or cut to it)",
    )
    parser.add_argument("--worker", nargs=2, metavar=("RUNTIME", "MODEL"), help=argparse.SUPPRESS)
    parser.add_argument("--feeds", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker_main(args)

    directory = args.dir or corpus.default_dir()
    manifest_path = directory / "manifest.json"
    if not manifest_path.exists():
        raise SystemExit(
            f"no {manifest_path}: make the corpus first (python benchmarks/corpus.py --dir {directory})"
        )
    entries = json.loads(manifest_path.read_text())["models"]
    if args.only:
        only = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(only) - {e["name"] for e in entries})
        if unknown:
            raise SystemExit(f"not in {manifest_path}: {unknown}")
        entries = [e for e in entries if e["name"] in only]
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    bad = [r for r in runtimes if r not in RUNTIMES]
    if bad:
        raise SystemExit(f"unknown runtime(s) {bad}; choose from {list(RUNTIMES)}")
    notes = []
    for rt in list(runtimes):
        if importlib.util.find_spec(MODULES[rt]) is None:
            runtimes.remove(rt)
            extra = " (pip install -e '.[bench]')" if rt == "openvino" else ""
            notes.append(f"{rt} is not installed{extra}: its columns are left out")
    rows, raw = [], {}
    with tempfile.TemporaryDirectory(prefix="nxrt-real-models-") as tmp:
        cases = [(e["name"], directory / e["file"], directory / e["feeds"]) for e in entries]
        if args.seq:
            lengths = [int(n) for n in args.seq.split(",") if n.strip()]
            cases = [case for name, m, f in cases for case in _at_lengths(name, m, f, lengths, Path(tmp))]
        for name, model, feeds in cases:
            runs = time_model(name, model, feeds, runtimes, Path(tmp), args)
            rows.append(summarise(name, runs))
            raw[name] = runs
    # the CPU the figures hold for (its ISA decides the kernels: AVX-512 and AVX2 hosts differ)
    device = next((r["nxrt-tvm"]["device"] for r in raw.values() if "device" in r.get("nxrt-tvm", {})), None)
    print(
        f"{f'device: {device}, ' if device else ''}"
        f"threads: {args.threads}, rounds: {args.rounds}, windows of {args.window_s:g} s "
        f"(at least {args.min_calls} calls), "
        f"{f'sequence lengths: {args.seq}, ' if args.seq else ''}"
        f"runtimes: {', '.join(runtimes)}; corpus {directory}"
    )
    print_table(rows, runtimes, notes)
    if args.json:
        geo = {key: geomean([r[key] for r in rows]) for key, *_ in RATIOS}
        report = {
            "device": device,
            "threads": args.threads,
            "rounds": args.rounds,
            "window_s": args.window_s,
            "min_calls": args.min_calls,
            "runtimes": runtimes,
            "notes": notes,
            "rows": rows,
            "geomean": geo,
            "workers": raw,
        }
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
