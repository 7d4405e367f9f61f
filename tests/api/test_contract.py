"""The EP contract's small pieces: tensor views, registries, declines."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

import nxrt_tvm as nx
from nxrt_tvm.api.tensor import ALIGNMENT, aligned_empty
from nxrt_tvm.runtime.kernel import _COPY_SMALL_BYTES, _to_tvm


def test_tensor_view_over_numpy_and_tvm():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    view = nx.TensorView(array)
    assert (
        view.shape == (2, 3) and view.dtype == np.float32 and view.device == nx.DeviceId(nx.DeviceType.CPU, 0)
    )
    assert view.numpy() is array
    back = nx.TensorView(tvm.runtime.tensor(array))
    assert np.shares_memory(back.numpy(), back.numpy()) and np.array_equal(back.numpy(), array)
    with pytest.raises(nx.InvalidTensorView, match="DLPack"):
        nx.TensorView([1, 2, 3])


def test_views_cross_into_tvm_without_copies_when_aligned_and_large():
    cpu = nx.DeviceId(nx.DeviceType.CPU)
    large = aligned_empty((4, 8192), np.float32)
    assert large.ctypes.data % ALIGNMENT == 0 and large.nbytes > _COPY_SMALL_BYTES
    shared, copy = _to_tvm(nx.TensorView(large), cpu, tvm.cpu())
    assert np.shares_memory(np.from_dlpack(shared), large) and copy is None
    # a small one is copied without asking where it lies (cheaper than reading its address)
    aligned = aligned_empty((4, 16), np.float32)
    small, copy = _to_tvm(nx.TensorView(aligned), cpu, tvm.cpu())
    assert not np.shares_memory(np.from_dlpack(small), aligned) and copy is not None
    misaligned = np.frombuffer(bytes(4 * 65), dtype=np.float32)[1:]  # off by 4 bytes, read-only
    staged, copy = _to_tvm(nx.TensorView(misaligned), cpu, tvm.cpu())
    assert not np.shares_memory(np.from_dlpack(staged), misaligned)
    np.testing.assert_array_equal(np.from_dlpack(staged), misaligned)
    tensor = tvm.runtime.tensor(aligned)
    assert _to_tvm(nx.TensorView(tensor), cpu, tvm.cpu())[0] is tensor
    # a later call's copy of the same shape and dtype reuses the staged buffer; another shape gets a new one
    later = np.frombuffer(np.arange(65, dtype=np.float32).tobytes(), dtype=np.float32)[1:]
    reused, again = _to_tvm(nx.TensorView(later), cpu, tvm.cpu(), copy)
    assert reused.data_ptr() == copy.start and again is copy
    np.testing.assert_array_equal(np.from_dlpack(reused), later)
    other, fresh = _to_tvm(nx.TensorView(later[:8]), cpu, tvm.cpu(), copy)
    assert other.data_ptr() != copy.start and fresh.host.shape == (8,)


def test_op_registry_picks_newest_version_not_above_opset():
    registry: nx.OpRegistry[str] = nx.OpRegistry()
    registry.register(nx.OpKey("", "Split", 1), "v1")
    registry.register(nx.OpKey("ai.onnx", "Split", 13), "v13")
    assert registry.lookup("", "Split", 12) == "v1"
    assert registry.lookup("ai.onnx", "Split", 18) == "v13"
    assert registry.lookup("", "Concat", 18) is None
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(nx.OpKey("", "Split", 13), "again")
    assert [str(k) for k in registry.keys()] == ["ai.onnx::Split@1", "ai.onnx::Split@13"]


def test_ep_registry_rejects_unknown_providers():
    from nxrt_tvm.providers import EP_REGISTRY

    assert EP_REGISTRY.names() == ["TvmExecutionProvider", "CPUExecutionProvider"]
    with pytest.raises(nx.InvalidProviderOptions, match="unknown execution provider 'CUDAExecutionProvider'"):
        EP_REGISTRY.create("CUDAExecutionProvider")


def test_require_and_deny_carry_what_was_rejected():
    with pytest.raises(nx.DeclineSignal) as info:
        nx.require(False, nx.Rejected.DTYPE, "input 'x' is string", accepts="numbers", remediation="cast it")
    assert info.value.rejected is nx.Rejected.DTYPE and info.value.accepts == "numbers"
    nx.require(True, nx.Rejected.DTYPE, "unused", accepts="anything")


def test_the_graph_view_is_the_contract_graph():
    from nxrt_tvm.api import Graph
    from nxrt_tvm.data import default_model_path
    from nxrt_tvm.graph import load_model

    assert isinstance(load_model(default_model_path()), Graph)
    assert not isinstance(object(), Graph)
