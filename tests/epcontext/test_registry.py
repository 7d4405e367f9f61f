"""EpContextRegistry: routing by source, duplicates, unknown sources."""

from __future__ import annotations

import pytest

import nxrt_tvm as nx
from nxrt_tvm.providers import CPUExecutionProvider, TvmExecutionProvider


def test_registry_routes_by_source_and_skips_eps_without_context_support():
    tvm_ep, cpu_ep = TvmExecutionProvider(), CPUExecutionProvider()
    registry = nx.build_ep_context_registry([tvm_ep, cpu_ep])
    assert registry.sources() == ["TvmExecutionProvider"]
    assert registry.route("TvmExecutionProvider") is tvm_ep
    with pytest.raises(nx.NoEpForContext, match="'OpenVINOExecutionProvider'"):
        registry.route("OpenVINOExecutionProvider")
    with pytest.raises(nx.UnsupportedContext, match="CPUExecutionProvider"):
        cpu_ep.load_context(None)


def test_duplicate_source_is_refused():
    registry = nx.EpContextRegistry()
    first, second = TvmExecutionProvider(), TvmExecutionProvider()
    registry.register("TvmExecutionProvider", first)
    registry.register("TvmExecutionProvider", first)  # the same EP again is fine
    with pytest.raises(nx.DuplicateContextSource, match="already registered"):
        registry.register("TvmExecutionProvider", second)
