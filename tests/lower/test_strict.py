"""Our own bugs surface: a failing pass or rule raises InternalError in strict mode (the suite's),
and is a warning naming it (plus a decline or TVM's default schedule) in normal use."""

from __future__ import annotations

import logging

import model_zoo
import numpy as np
import pytest
from conftest import assert_parity, ort_run
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import relax

import nxrt_tvm as nx
from nxrt_tvm import frontend
from nxrt_tvm.lower import fold_constants, precision, strict
from nxrt_tvm.lower.schedules import core
from nxrt_tvm.runtime import artifact

OPTIONS = [{"compile_isolation": "none"}, {}]


def _bug(*_args, **_kwargs):
    raise ZeroDivisionError("a bug of ours")


def _break_matmul_rule(monkeypatch):
    """The rule's own code fails (arithmetic on a None vector width): a bug, not a TVM refusal."""
    monkeypatch.setattr(core, "vector_lanes", lambda _target: None)


def _feeds():
    return {"x": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}


def test_the_suite_runs_strict():
    assert strict.strict()


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_rule_bug_raises_in_strict_mode(monkeypatch, isolation):
    _break_matmul_rule(monkeypatch)
    with pytest.raises(nx.InternalError, match=r"schedule rule 'matmul' on kernel 'fused_matmul.*TypeError"):
        nx.InferenceSession(model_zoo.mlp(batch=4), provider_options=[{"compile_isolation": isolation}, {}])


def test_rule_bug_is_a_warning_and_the_default_schedule_in_normal_use(monkeypatch, caplog):
    monkeypatch.setenv(strict.STRICT_ENV, "0")
    _break_matmul_rule(monkeypatch)
    model = model_zoo.mlp(batch=4)
    with caplog.at_level(logging.WARNING, logger="nxrt_tvm.lower.strict"):
        sess = nx.InferenceSession(model, provider_options=OPTIONS)
    assert "schedule rule 'matmul' on kernel" in caplog.text and "TypeError" in caplog.text
    variants = [v for vs in sess.kernel_variants().values() for v in vs]
    assert not any(v.variant == "default:matmul" for v in variants), variants
    assert_parity(sess.run(None, _feeds()), ort_run(model, _feeds()))


def test_pass_bug_raises_in_strict_mode(monkeypatch):
    monkeypatch.setattr(precision, "exact_vars", _bug)
    with pytest.raises(nx.InternalError, match=r"pass precision\.PreciseFastMath\.transform_module"):
        nx.InferenceSession(model_zoo.mlp(batch=4), provider_options=OPTIONS)


def test_pass_bug_is_a_warning_and_a_decline_in_normal_use(monkeypatch, caplog):
    monkeypatch.setenv(strict.STRICT_ENV, "0")
    monkeypatch.setattr(precision, "exact_vars", _bug)
    model = model_zoo.mlp(batch=4)
    with caplog.at_level(logging.WARNING, logger="nxrt_tvm.lower.strict"):
        sess = nx.InferenceSession(model, provider_options=OPTIONS)
    assert "pass precision.PreciseFastMath.transform_module raised ZeroDivisionError" in caplog.text
    assert_parity(sess.run(None, _feeds()), ort_run(model, _feeds()))


def _module(undefined: bool):
    """main(x) = x + y, where y is a parameter, or (ill-formed) a variable defined nowhere."""
    ty = relax.TensorType((2,), "float32")
    x, y = relax.Var("x", ty), relax.Var("y", ty)
    bb = relax.BlockBuilder()
    with bb.function("main", [x] if undefined else [x, y]):
        bb.emit_func_output(bb.emit(relax.op.add(x, y)))
    return bb.get()


def test_a_pass_that_leaves_relax_ill_formed_raises_in_strict_mode():
    @strict.own_pass
    def drops_a_parameter(mod, _ctx=None):
        return _module(undefined=True)

    assert relax.analysis.check_well_formed(_module(undefined=False))
    with pytest.raises(nx.InternalError, match=r"drops_a_parameter \(its output is ill-formed Relax\)"):
        drops_a_parameter(_module(undefined=False))


def test_a_pass_given_ill_formed_relax_is_not_blamed_for_it():
    @strict.own_pass
    def identity(mod, _ctx=None):
        return mod

    ill_formed = _module(undefined=True)
    assert not relax.analysis.check_well_formed(ill_formed)
    assert identity(ill_formed) is ill_formed


def test_a_pass_returning_an_undefined_variable_fails_loudly_not_as_a_decline(monkeypatch):
    """d9dbc6e's bug: a folder returned a variable's stale version. TVM failed it at code generation,
    and the claim loop bisected the partition into a decline of an innocent node, even in strict mode."""
    real = fold_constants._evaluated_layout

    def stale(call):
        folded = real(call)
        return relax.Var("stale", call.ty) if folded is not call else call

    monkeypatch.setattr(fold_constants, "_evaluated_layout", stale)
    broken = r"pass fold_constants.FoldConstantLayouts \(its output is ill-formed"
    with pytest.raises(nx.InternalError, match=broken):
        nx.InferenceSession(model_zoo.cnn(), provider_options=OPTIONS)


def test_a_bug_of_ours_in_the_build_process_raises_in_strict_mode(monkeypatch):
    """The isolated build runs our code too (the export packs the lifted weights): an exception it raises
    is a bug, not "TVM cannot compile it" bisected into declines."""
    monkeypatch.setattr(artifact, "_ALIGN", 0)  # the packer's own arithmetic fails
    with pytest.raises(nx.InternalError, match=r"nxrt-tvm bug: ZeroDivisionError"):
        nx.InferenceSession(model_zoo.mlp(batch=4))


def _break_slice_converter(monkeypatch):
    """Our Slice converter's own code fails (a comparison with None): a bug, not a model TVM cannot
    import."""
    monkeypatch.setattr(frontend, "_TO_THE_END", None)


def _slice_model():
    ends = [nh.from_array(np.array([v], np.int64), k) for k, v in (("zero", 0), ("two", 2), ("ax", 1))]
    graph = h.make_graph(
        [h.make_node("Slice", ["x", "zero", "two", "ax"], ["y"])],
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        ends,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_converter_bug_raises_in_strict_mode(monkeypatch, isolation):
    _break_slice_converter(monkeypatch)
    with pytest.raises(nx.InternalError, match=r"ONNX converter of nxrt_tvm.frontend.*TypeError"):
        nx.InferenceSession(_slice_model(), provider_options=[{"compile_isolation": isolation}, {}])


def test_converter_bug_is_a_warning_and_a_decline_in_normal_use(monkeypatch, caplog):
    monkeypatch.setenv(strict.STRICT_ENV, "0")
    _break_slice_converter(monkeypatch)
    model = _slice_model()
    with caplog.at_level(logging.WARNING, logger="nxrt_tvm.lower.strict"):
        sess = nx.InferenceSession(model, provider_options=OPTIONS)
    assert "ONNX converter of nxrt_tvm.frontend" in caplog.text and "TypeError" in caplog.text
    assert sess.plan.nodes_by_ep() == {"CPUExecutionProvider": 1}
    x = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    assert_parity(sess.run(None, x), ort_run(model, x))
