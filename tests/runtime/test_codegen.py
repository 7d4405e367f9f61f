"""Kernels' code generation split across forked processes: the linked library runs every kernel, a
failing or crashing shard fails the build, and a killed build leaves no orphan process behind."""

from __future__ import annotations

import os
import signal
import time

import model_zoo
import pytest
import tvm
from parity import assert_parity, ort_run

from nxrt_tvm.api.errors import CompileFailed
from nxrt_tvm.graph.model import load_model
from nxrt_tvm.lower import build
from nxrt_tvm.lower.target import make_target
from nxrt_tvm.runtime.artifact import export_executable, load_executable
from nxrt_tvm.runtime.codegen import ParallelCodegen
from nxrt_tvm.runtime.isolate import fork_available, start_isolated

pytestmark = pytest.mark.skipif(not fork_available(), reason="needs os.fork")


def _built(model, tmp_path, jobs: int):
    graph = load_model(model)
    codegen = ParallelCodegen(jobs, tmp_path, timeout_s=120, what="cnn")
    executable = build.compile_partition(
        graph, list(range(len(graph.nodes))), "cnn", make_target("llvm"), codegen=codegen
    )
    return executable, codegen


def test_kernels_built_in_shards_link_into_one_library(tmp_path, monkeypatch):
    """Three shards (one kernel each at least): the library the export links runs like onnxruntime."""
    monkeypatch.setattr(build, "KERNELS_PER_SHARD", 1)
    model = model_zoo.cnn()
    executable, codegen = _built(model, tmp_path, jobs=3)
    assert len(codegen.objects) == 3 and all(os.path.getsize(p) > 0 for p in codegen.objects)
    vm = tvm.relax.VirtualMachine(
        load_executable(export_executable(executable, codegen.objects), "cnn").module, tvm.cpu()
    )
    feeds = model_zoo.make_inputs("cnn")
    logits = vm["main"](*(tvm.runtime.tensor(v) for v in feeds.values()))  # the model's one output
    assert_parity([logits.numpy()], ort_run(model, feeds), rtol=1e-4, atol=1e-5)


def test_few_kernels_are_one_shard(tmp_path):
    _, codegen = _built(model_zoo.cnn(), tmp_path, jobs=8)
    assert (
        len(codegen.objects) == 1
    )  # fewer than 2 x KERNELS_PER_SHARD kernels: one process pays LLVM's setup


def test_a_crashing_shard_fails_the_build(tmp_path, monkeypatch):
    """LLVM crashing on one shard's kernels is the build's failure, named; its siblings are stopped."""
    monkeypatch.setattr(build, "KERNELS_PER_SHARD", 1)
    real, here = tvm.tirx.build, os.getpid()

    def crash_in_children(mod, **kwargs):  # this process folds constants with it too
        return real(mod, **kwargs) if os.getpid() == here else os.abort()

    monkeypatch.setattr(tvm.tirx, "build", crash_in_children)
    with pytest.raises(CompileFailed, match=r"TVM crashed \(SIGABRT\) while compiling \d+ kernels of cnn"):
        _built(model_zoo.cnn(), tmp_path, jobs=2)


def test_a_killed_build_leaves_no_codegen_process(tmp_path):
    """The kernel kills a codegen child whose parent (the isolated build) was killed on its time limit."""
    pid_file = tmp_path / "grandchild"

    def build_that_hangs():
        grandchild = start_isolated(lambda: time.sleep(60), "a long codegen")
        pid_file.write_text(str(grandchild.pid))
        time.sleep(60)

    child = start_isolated(build_that_hangs, "a build")
    deadline = time.monotonic() + 30
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(CompileFailed, match="took longer than 1 s"):
        child.result(timeout_s=1)
    grandchild = int(pid_file.read_text())
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(grandchild, signal.SIGKILL)
    pytest.fail("the codegen child outlived its killed parent")
