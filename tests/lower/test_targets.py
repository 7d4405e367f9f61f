"""Targets: the host CPU with its features, and CUDA (builds here, runs only where a GPU is)."""

from __future__ import annotations

import model_zoo
import numpy as np
import pytest
import tvm
from parity import assert_parity, ort_run

import nxrt_tvm as nx
from nxrt_tvm.graph.model import load_model
from nxrt_tvm.lower.build import compile_partition
from nxrt_tvm.lower.target import host_cpu, make_target

HAS_GPU = tvm.cuda(0).exist


def test_llvm_target_uses_host_cpu_and_all_threads():
    target = make_target("llvm")
    assert target.kind.name == "llvm"
    assert str(target.attrs["mcpu"]) == host_cpu() != "generic"
    assert int(target.attrs["num-cores"]) >= 1


def test_bad_target_is_a_clear_error():
    with pytest.raises(nx.InvalidProviderOptions, match="'llvm', 'cuda' or a JSON target"):
        make_target("llvm -mcpu=foo")
    with pytest.raises(nx.InvalidProviderOptions, match="not supported"):
        make_target({"kind": "opencl"})


def test_cuda_builds_without_a_gpu():
    graph = load_model(model_zoo.mlp())
    target = make_target("cuda")
    assert target.kind.name == "cuda" and str(target.attrs["arch"]).startswith("sm_")
    executable = compile_partition(graph, list(range(len(graph.nodes))), "mlp", target)
    assert executable is not None


@pytest.mark.skipif(HAS_GPU, reason="checks the error on hosts without a GPU")
def test_cuda_session_without_gpu_says_so():
    with pytest.raises(nx.EpLoadFailed, match="no cuda device"):
        nx.InferenceSession(model_zoo.mlp(), provider_options=[{"target": "cuda"}, {}])


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_cuda_session_parity():
    model = model_zoo.mlp()
    sess = nx.InferenceSession(model, provider_options=[{"target": "cuda"}, {}])
    feeds = {"x": np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)}
    assert_parity(sess.run(None, feeds), ort_run(model, feeds), rtol=1e-3, atol=1e-4)
