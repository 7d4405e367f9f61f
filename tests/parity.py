"""Parity helpers shared by the tests: onnxruntime as the reference, with stated tolerances."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

DATA = Path(__file__).parent / "data"


def ort_run(model: onnx.ModelProto | str | Path, feeds: dict) -> list[np.ndarray]:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_parity(
    got: list[np.ndarray], want: list[np.ndarray], rtol: float = 1e-4, atol: float = 1e-5
) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
