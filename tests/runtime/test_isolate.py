"""Compilation in a forked child: results, failures and
crashes come back; inherited runtime state cannot hang it."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from nxrt_tvm.api.errors import CompileFailed
from nxrt_tvm.runtime.isolate import fork_available, run_isolated

pytestmark = pytest.mark.skipif(not fork_available(), reason="needs os.fork")


@T.prim_func
def _parallel_double(a: T.Buffer((4096,), "float32"), b: T.Buffer((4096,), "float32")):
    for i in T.parallel(4096):
        b[i] = a[i] * T.float32(2)


def _run_parallel_kernel() -> float:
    """A TVM kernel with a parallel loop (TVM's thread pool runs it); the sum of its output."""
    lib = tvm.compile(tvm.IRModule({"main": _parallel_double}), "llvm")
    a = tvm.runtime.tensor(np.ones(4096, np.float32))
    b = tvm.runtime.tensor(np.zeros(4096, np.float32))
    lib["main"](a, b)
    return float(b.numpy().sum())


def test_parallel_kernels_run_in_the_child_after_the_parent_started_its_pool():
    """The pool's workers stay in the parent; FoldConstant
    runs kernels while compiling: they must run inline."""
    assert _run_parallel_kernel() == 8192.0  # the parent's pool now has worker threads
    assert run_isolated(_run_parallel_kernel, "a parallel kernel", timeout_s=60) == 8192.0


def test_results_failures_and_crashes_come_back():
    assert (
        run_isolated(lambda: {"blob": b"\x00" * 3_000_000}, "a large result", 60)["blob"]
        == b"\x00" * 3_000_000
    )

    def fail():
        raise CompileFailed("no converter")

    with pytest.raises(CompileFailed, match="no converter"):
        run_isolated(fail, "a failing compile", 60)
    with pytest.raises(CompileFailed, match=r"TVM crashed \(SIGABRT\) while compiling a crash"):
        run_isolated(os.abort, "a crash", 60)


def test_a_hung_compile_is_stopped():
    import time

    with pytest.raises(CompileFailed, match="took longer than 1 s"):
        run_isolated(lambda: time.sleep(30), "a hang", 1)


def _abandoned_onnxruntime_session() -> None:
    """Leave an onnxruntime session whose pool threads ran and parked in an uncollected garbage cycle."""
    import time

    import onnxruntime as ort
    from onnx import TensorProto
    from onnx import helper as h

    x = h.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])
    y = h.make_tensor_value_info("y", TensorProto.FLOAT, [256, 256])
    graph = h.make_graph([h.make_node("MatMul", ["x", "x"], ["y"])], "g", [x], [y])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2

    class Holder:
        pass

    holder = Holder()
    holder.me = holder
    holder.session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    holder.session.run(None, {"x": np.ones((256, 256), np.float32)})
    time.sleep(0.3)  # the pool's threads park on their condition variable


def test_the_parents_garbage_is_never_finalised_in_the_child():
    """A child collecting garbage it inherited ran an onnxruntime session's destructor, which waits forever on
    a condition variable the parent's (not inherited) threads were parked on: a claims worker hung so."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        _abandoned_onnxruntime_session()
        assert run_isolated(lambda: gc.collect() >= 0, "a garbage collection", timeout_s=20)
    finally:
        gc.collect()
        if enabled:
            gc.enable()


@pytest.mark.parametrize("ending", ["returns", "crashes", "hangs"])
def test_a_child_leaves_no_temporary_files_however_it_ends(tmp_path, monkeypatch, ending):
    """A killed or crashed child runs no cleanup: its temporary files go into a folder the parent removes
    (a timed-out build left an empty codegen folder in /tmp per attempt)."""
    import tempfile
    import time

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def work():
        with tempfile.TemporaryDirectory(prefix="codegen-") as tmp:
            open(os.path.join(tmp, "kernels0.o"), "wb").close()
            if ending == "crashes":
                os.abort()
            if ending == "hangs":
                time.sleep(30)
            return sorted(os.listdir(tmp))

    if ending == "returns":
        assert run_isolated(work, "a build", 10) == ["kernels0.o"]
    else:
        with pytest.raises(CompileFailed):
            run_isolated(work, "a build", 1)
    assert list(tmp_path.iterdir()) == []
