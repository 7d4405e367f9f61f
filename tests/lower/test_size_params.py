"""Kernels take their symbolic sizes in one order: compiles do not depend on object addresses."""

from __future__ import annotations

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper
from parity import assert_parity, ort_run
from tvm import relax, te, tirx

import nxrt_tvm as nx
from nxrt_tvm.lower.size_params import SizeParamsInOrder
from nxrt_tvm.lower.target import make_target

TARGET = make_target("llvm")


def _two_orders() -> tvm.IRModule:
    """`main` calls two kernels that compute the same thing and take (h, w) in the two orders, as
    `call_te` makes them (its order is a set's)."""
    h, w = tirx.Var("h", "int64"), tirx.Var("w", "int64")
    x = te.placeholder((h, w), name="x")
    y = te.compute((h, w), lambda i, j: x[i, j] * 2.0 + tirx.Cast("float32", h - w), name="y")
    bb = relax.BlockBuilder()
    arg = relax.Var("x", relax.TensorType([h, w], "float32"))
    with bb.function("main", [arg]):
        with bb.dataflow():
            hw = bb.add_func(te.create_prim_func([x, h, w, y]).with_attr("global_symbol", "hw"), "hw")
            wh = bb.add_func(te.create_prim_func([x, w, h, y]).with_attr("global_symbol", "wh"), "wh")
            out = relax.TensorType([h, w], "float32")
            a = bb.emit(relax.call_tir(hw, [arg, relax.prim_value(h), relax.prim_value(w)], out))
            b = bb.emit(relax.call_tir(wh, [a, relax.prim_value(w), relax.prim_value(h)], out))
            result = bb.emit_output(b)
        bb.emit_func_output(result)
    return bb.get()


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, TARGET), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_size_parameters_in_shape_order_and_equal_kernels_merged():
    before = _two_orders()
    after = SizeParamsInOrder(before)
    kernels = {gv.name_hint: f for gv, f in after.functions_items() if isinstance(f, tirx.PrimFunc)}
    assert list(kernels) == ["hw"]  # "wh" was "hw" with its sizes swapped
    assert [str(p.name) for p in kernels["hw"].params][1:3] == ["h", "w"]
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_array_equal(_run(after, x), _run(before, x))
    np.testing.assert_allclose(_run(after, x), (x * 2 - 2) * 2 - 2, rtol=1e-6)


def test_kernels_are_named_in_call_order():
    """TVM numbers kernels in the order it makes them (`add7`, `add3`), which merged duplicates and
    set-ordered work shift; renamed by first call, one model always compiles to the same names."""
    x = te.placeholder((4,), name="x")
    bb = relax.BlockBuilder()
    arg = relax.Var("x", relax.TensorType([4], "float32"))
    out = relax.TensorType([4], "float32")
    with bb.function("main", [arg]):
        with bb.dataflow():
            double = te.create_prim_func([x, te.compute((4,), lambda i: x[i] * 2.0, name="y")])
            square = te.create_prim_func([x, te.compute((4,), lambda i: x[i] * x[i], name="y")])
            late = bb.add_func(square, "k7")
            early = bb.add_func(double, "k3")
            a = bb.emit(relax.call_tir(late, [arg], out))
            b = bb.emit(relax.call_tir(early, [a], out))
            result = bb.emit_output(b)
        bb.emit_func_output(result)
    before = bb.get()
    after = SizeParamsInOrder(before)
    assert sorted(gv.name_hint for gv in after.get_global_vars()) == ["k", "k1", "main"]
    assert after["k"].body.same_as(before["k7"].body)  # called first
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(_run(after, x), x * x * 2)


def _pooled_twice() -> onnx.ModelProto:
    """x [1, 16, h, w] -> (MaxPool 2x2/2 -> SiLU) twice: the second stage is the first on sizes that are
    other expressions of h and w ((h - 2) // 2 + 1 and its half)."""
    nodes = []
    for k, (src, dst) in enumerate([("x", "ya"), ("ya", "yb")]):
        nodes += [
            helper.make_node("MaxPool", [src], [f"p{k}"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Sigmoid", [f"p{k}"], [f"s{k}"]),
            helper.make_node("Mul", [f"p{k}", f"s{k}"], [dst]),
        ]
    graph = helper.make_graph(
        nodes,
        "pooled_twice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, "h", "w"])],
        [
            helper.make_tensor_value_info("yb", TensorProto.FLOAT, [1, 16, "hb", "wb"]),
            helper.make_tensor_value_info("ya", TensorProto.FLOAT, [1, 16, "ha", "wa"]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_kernels_equal_once_their_sizes_are_named_are_built_once():
    """After NameCompoundSizes both stages' kernels read their sizes from their tensors: one kernel is
    scheduled and built for both (YOLOv8n's three heads: 122 kernels, 93 distinct), and it computes
    each stage at its own sizes."""
    model = _pooled_twice()
    sess = nx.InferenceSession(model)
    tvm_ep = sess.provider(nx.EpId("TvmExecutionProvider"))
    names = [v.name for variants in tvm_ep.variants.values() for v in variants]
    assert len([n for n in names if "max_pool2d" in n]) == 1, names
    for h, w in [(32, 48), (17, 30)]:
        feeds = {"x": np.random.default_rng(h).standard_normal((1, 16, h, w)).astype(np.float32)}
        assert_parity(sess.run(None, feeds), ort_run(model, feeds))
