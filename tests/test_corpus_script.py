"""benchmarks/corpus.py lists its real-model corpus, and benchmarks/real_models.py's workers and table run.

Fast and torch-free: the corpus is only listed (nothing is made), and the benchmark runs its
onnxruntime worker on a two-node model written here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "benchmarks" / "corpus.py"
REAL_MODELS = ROOT / "benchmarks" / "real_models.py"


def _run(*args: str, timeout: float = 60, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        input=stdin,
    )


def _message(stdout: str, prefix: str) -> list[dict]:
    return [json.loads(ln[len(prefix) :]) for ln in stdout.splitlines() if ln.startswith(prefix)]


def test_corpus_lists_at_least_22_real_models_with_sources():
    proc = _run(CORPUS, "--list")
    assert proc.returncode == 0, proc.stderr
    rows = [line.strip("|").split(" | ") for line in proc.stdout.splitlines()[2:] if line.startswith("| ")]
    names = [r[0].strip() for r in rows]
    assert len(names) >= 22, proc.stdout
    assert len(set(names)) == len(names), f"duplicate names: {names}"
    for name, source, notes in rows:
        assert source.strip() and notes.strip(), f"{name} has no source or notes"
    pretrained = [r for r in rows if "(PyPI wheel)" in r[1]]
    assert len({r[1].split()[0] for r in pretrained}) >= 3, "fewer than 3 pretrained wheels"
    assert all("==" in r[1].split()[0] for r in pretrained), "wheel sources pin their version"


def _tiny_model(path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def _parent(corpus, *args):
    """real_models.py over the manifest in `corpus`, onnxruntime only."""
    return _run(REAL_MODELS, "--dir", corpus, "--runtimes", "onnxruntime", *args)


def test_onnxruntime_worker_times_a_window_per_command_and_saves_outputs(tmp_path):
    pytest.importorskip("onnxruntime")
    model, feeds, out = tmp_path / "tiny.onnx", tmp_path / "tiny.feeds.npz", tmp_path / "out.npz"
    _tiny_model(model)
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    np.savez(feeds, x=x)
    worker = ("--worker", "onnxruntime", model, "--feeds", feeds, "--out", out, "--threads", 1)
    proc = _run(REAL_MODELS, *worker, "--window-s", 0.02, "--min-calls", 4, stdin="window\nwindow\ndone\n")
    assert proc.returncode == 0, proc.stderr
    (ready,) = _message(proc.stdout, "READY ")
    assert ready["ready_s"] > 0 and ready["output_shapes"] == [[2, 3]]
    windows = _message(proc.stdout, "WINDOW ")
    assert len(windows) == 2 and all(len(w["samples_s"]) >= 4 for w in windows)
    assert len(windows[0]["samples_s"]) > 4  # the window's span, not the minimum, decided its calls
    (result,) = _message(proc.stdout, "RESULT ")
    assert result["ok"], result
    assert result["runtime"] == "onnxruntime" and result["threads"] == 1
    want = np.maximum(x @ np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), 0)
    with np.load(out) as saved:
        np.testing.assert_allclose(saved["o0"], want, rtol=1e-6)

    # The parent: a one-model manifest, onnxruntime only (the others are not asked for).
    (tmp_path / "manifest.json").write_text(
        json.dumps({"models": [{"name": "tiny", "file": model.name, "feeds": feeds.name}]})
    )
    report = tmp_path / "report.json"
    proc = _parent(tmp_path, "--rounds", 3, "--window-s", 0.02, "--json", report)
    assert proc.returncode == 0, proc.stderr
    assert "| tiny |" in proc.stdout and "**geomean**" in proc.stdout
    row = json.loads(report.read_text())["rows"][0]
    assert row["runtimes"]["onnxruntime"]["median_ms"] > 0
    ran = json.loads(report.read_text())["workers"]["tiny"]["onnxruntime"]
    assert len(ran["window_medians_ms"]) == 3 and ran["best_ms"] == min(ran["window_medians_ms"])


def test_ratios_are_taken_round_by_round(tmp_path):
    """A host regime that slows every runtime's window of a round (here round 2, 3x) cancels in the
    ratio; the per-runtime medians would not see it as the same round."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import real_models

    np.savez(tmp_path / "out.npz", o0=np.ones(3, np.float32))

    def ran(medians):
        return {
            "ok": True,
            "window_medians_ms": medians,
            "best_ms": min(medians),
            "median_ms": 0.0,
            "outputs": str(tmp_path / "out.npz"),
        }

    runs = {"onnxruntime": ran([2.0, 6.0, 2.0]), "nxrt-tvm": ran([1.0, 3.0, 6.0])}
    row = real_models.summarise("m", runs)
    assert row["nxrt_vs_ort"] == 0.5  # rounds: 0.5, 0.5, 3.0
    assert row["nxrt_vs_ort_best"] == 0.5 and row["parity_nxrt"] == 0.0


def test_the_table_counts_the_kernels_that_ran_a_tuning_record():
    """The table says how many kernels a tuning record matched: "tuned where logs exist" holds for those."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import real_models

    variants = {"tuned": 2, "tuned:anchor": 1, "tuned:transferred from k": 1, "default:conv": 3}
    row = {"model": "m", "kernel_variants": variants, "tvm_kernels": 7, "tvm_default_kernels": 0}
    (cell,) = [
        cell for header, cell in real_models._columns(["nxrt-tvm"]) if header == real_models.TUNED_HEADER
    ]
    assert cell(row) == "4 / 7"


def test_a_crashing_worker_is_reported_not_fatal(tmp_path):
    pytest.importorskip("onnxruntime")
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    np.savez(tmp_path / "broken.feeds.npz", x=np.zeros(1, np.float32))
    (tmp_path / "manifest.json").write_text(
        json.dumps({"models": [{"name": "broken", "file": "broken.onnx", "feeds": "broken.feeds.npz"}]})
    )
    proc = _parent(tmp_path, "--rounds", 1, "--window-s", 0)
    assert proc.returncode == 0, proc.stderr
    assert "| broken | error |" in proc.stdout


def test_seq_times_the_sequence_models_at_each_length(tmp_path):
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    _tiny_model(tmp_path / "tiny.onnx")  # no sequence dim: left out
    np.savez(tmp_path / "tiny.feeds.npz", x=np.ones((2, 4), np.float32))
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "mask"], ["y"])],
        "seq",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 2]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq", 1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "seq.onnx")
    mask = np.array([1, 1, 0], np.float32).reshape(1, 3, 1)  # padded at the end, as the corpus feeds are
    np.savez(tmp_path / "seq.feeds.npz", x=np.arange(6, dtype=np.float32).reshape(1, 3, 2), mask=mask)
    entries = [{"name": n, "file": f"{n}.onnx", "feeds": f"{n}.feeds.npz"} for n in ("tiny", "seq")]
    (tmp_path / "manifest.json").write_text(json.dumps({"models": entries}))
    report = tmp_path / "report.json"
    proc = _parent(tmp_path, "--rounds", 1, "--window-s", 0, "--json", report, "--seq", "2,5")
    assert proc.returncode == 0, proc.stderr
    assert "| seq@seq2 |" in proc.stdout and "| seq@seq5 |" in proc.stdout and "| tiny |" not in proc.stdout
    workers = json.loads(report.read_text())["workers"]
    assert workers["seq@seq5"]["onnxruntime"]["output_shapes"] == [[1, 5, 2]]


def test_the_report_names_the_device_the_figures_hold_for(tmp_path):
    """Figures hold for one CPU kind (AVX-512 and AVX2 hosts build different kernels): the nxrt-tvm
    worker reports its device key, and the summary line and the JSON carry it."""
    pytest.importorskip("onnxruntime")
    _tiny_model(tmp_path / "tiny.onnx")
    np.savez(tmp_path / "tiny.feeds.npz", x=np.ones((2, 4), np.float32))
    entry = {"name": "tiny", "file": "tiny.onnx", "feeds": "tiny.feeds.npz"}
    (tmp_path / "manifest.json").write_text(json.dumps({"models": [entry]}))
    report = tmp_path / "report.json"
    args = ("--dir", tmp_path, "--runtimes", "nxrt-tvm", "--rounds", 1, "--window-s", 0)
    proc = _run(REAL_MODELS, *args, "--json", report, timeout=300)
    assert proc.returncode == 0, proc.stderr
    from nxrt_tvm.lower.device_key import device_key
    from nxrt_tvm.lower.target import make_target

    device = device_key(make_target("llvm"))
    assert f"device: {device}, threads:" in proc.stdout
    assert json.loads(report.read_text())["device"] == device
