"""CPU targets for tests of blobs built for other CPUs."""

from __future__ import annotations

import pytest

from nxrt_tvm.lower.target import cpu_features, host_cpu, requires_hardware


def foreign_cpu() -> str:
    """An x86 CPU whose code needs features this host lacks (AMX on AMD, AVX-512 FP16 on older parts, ...)."""
    have = cpu_features(host_cpu())
    for mcpu in ("diamondrapids", "graniterapids", "sapphirerapids", "znver5", "znver4"):
        if any(requires_hardware(f) for f in cpu_features(mcpu) - have):
            return mcpu
    pytest.skip("this host has every feature of the candidate CPUs")
