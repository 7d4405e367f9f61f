"""Blobs: the library packed with the constants lifted out of it, loaded back to run as onnxruntime
does; a packed index that lies is refused before anything is read through it."""

from __future__ import annotations

import json

import model_zoo
import numpy as np
import pytest
from blobs import lying_index
from parity import assert_parity, ort_run

import nxrt_tvm as nx
from nxrt_tvm.api.device import DeviceId, DeviceType
from nxrt_tvm.api.tensor import TensorView
from nxrt_tvm.graph.model import load_model
from nxrt_tvm.lower import build
from nxrt_tvm.lower.lift_constants import LIFT_MIN_BYTES
from nxrt_tvm.lower.target import make_target
from nxrt_tvm.runtime import artifact
from nxrt_tvm.runtime.artifact import (
    PACKED_MAGIC,
    Library,
    blob_problem,
    export_executable,
    load_executable,
    map_blob,
)
from nxrt_tvm.runtime.kernel import TvmKernel

MODEL = model_zoo.mlp(batch=4)  # fc1 (32 KiB) and fc2 (64 KiB) are lifted; fc3 (5 KiB) stays in the library
FEEDS = {"x": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}


def _build(constants: list[np.ndarray] | None):
    graph = load_model(MODEL)
    nodes = list(range(len(graph.nodes)))
    return graph, build.compile_partition(graph, nodes, "mlp", make_target("llvm"), constants=constants)


def _run(graph, library: Library) -> list[np.ndarray]:
    kernel = TvmKernel(library, DeviceId(DeviceType.CPU, 0), "mlp", graph.inputs, graph.outputs)
    return [v.numpy() for v in kernel.compute([TensorView(FEEDS["x"])])]


def test_large_constants_leave_the_library_and_come_back_as_call_arguments():
    constants: list[np.ndarray] = []
    graph, executable = _build(constants)
    assert len(constants) == 2 and all(c.nbytes >= LIFT_MIN_BYTES for c in constants)
    blob = export_executable(executable, constants=constants)
    assert blob.startswith(PACKED_MAGIC) and blob_problem(blob) is None
    _, whole = _build(None)  # nothing lifted: the constants stay in the library
    library_alone = export_executable(whole)
    assert not library_alone.startswith(PACKED_MAGIC)
    at = len(PACKED_MAGIC) + 8
    index = json.loads(blob[at : at + int.from_bytes(blob[len(PACKED_MAGIC) : at], "little")])
    assert index["library"] <= len(library_alone) - sum(c.nbytes for c in constants)  # not kept twice
    loaded = load_executable(blob, "mlp")
    assert [c.shape for c in loaded.constants] == [c.shape for c in constants]
    expected = ort_run(MODEL, FEEDS)
    assert_parity(_run(graph, loaded), expected)
    assert_parity(_run(graph, Library.of(executable, constants)), expected)  # as built, before any export


@pytest.mark.parametrize("isolation", ["process", "none"])
def test_sessions_pass_the_lifted_constants_in_either_build(isolation, monkeypatch):
    """An isolated build hands its blob over as a file the session maps: the constants it runs with lie in
    that mapping, not in copies (VGG-19's 548 MB went through a pipe, then into TVM: 4 s)."""
    monkeypatch.setattr(artifact, "_MAP_MIN_BYTES", 0)  # this blob is small
    monkeypatch.setattr(artifact, "_LOADED", {})  # another test may have loaded the same bytes
    sess = nx.InferenceSession(MODEL, provider_options=[{"compile_isolation": isolation}, {}])
    (kernel,) = sess._kernels
    assert len(kernel.library.constants) == 2
    if isolation == "process":
        assert isinstance(kernel.blob, memoryview)
        start = np.frombuffer(kernel.blob, np.uint8).ctypes.data
        for tensor in kernel.library.constants:
            assert start <= np.from_dlpack(tensor).ctypes.data < start + len(kernel.blob)
    assert_parity(sess.run(None, FEEDS), ort_run(MODEL, FEEDS))


def test_a_packed_index_placing_a_constant_past_the_end_is_refused():
    constants: list[np.ndarray] = []
    _, executable = _build(constants)
    forged = lying_index(export_executable(executable, constants=constants))
    assert "its packed index is malformed: a constant lies outside its data" in blob_problem(forged)
    with pytest.raises(nx.EpLoadFailed, match="not a loadable shared library: its packed index is malformed"):
        load_executable(forged, "forged")


def test_a_mapped_blob_loads_its_constants_where_they_lie_and_its_library_from_a_copy(tmp_path, monkeypatch):
    """`map_blob` maps a blob file's weights and TVM takes them in place (no copy to read or load them);
    its head and library are read, so what the file holds afterwards changes nothing that was checked."""
    monkeypatch.setattr(artifact, "_MAP_MIN_BYTES", 0)  # this blob is small
    monkeypatch.setattr(artifact, "_LOADED", {})  # another test may have loaded the same bytes
    constants: list[np.ndarray] = []
    graph, executable = _build(constants)
    blob = export_executable(executable, constants=constants)
    path = tmp_path / "mlp.tvm.so"
    path.write_bytes(b"padding!" * 8 + blob)  # at an offset, as in a compile-cache entry
    with open(path, "rb") as f:
        mapped = map_blob(f, 64)
    assert isinstance(mapped, memoryview) and mapped == blob
    at = len(PACKED_MAGIC) + 8
    index_size = int.from_bytes(blob[len(PACKED_MAGIC) : at], "little")
    library_end = -(-(at + index_size) // 64) * 64 + json.loads(blob[at : at + index_size])["library"]
    with open(path, "r+b") as f:  # rewritten in place, as a concurrent writer could
        f.seek(64)
        f.write(b"\0" * library_end)
    assert mapped[:library_end] == blob[:library_end]
    loaded = load_executable(mapped, "mlp")
    start = np.frombuffer(mapped, np.uint8).ctypes.data
    for tensor in loaded.constants:
        assert start <= np.from_dlpack(tensor).ctypes.data < start + len(mapped)  # in the mapping: no copy
    assert_parity(_run(graph, loaded), ort_run(MODEL, FEEDS))
