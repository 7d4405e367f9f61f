"""Partition models: what the fallback's onnxruntime session is given."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
from parity import assert_parity

from nxrt_tvm.graph.extract import extract_model
from nxrt_tvm.graph.model import load_model

BERT = Path(__file__).parents[1] / "data" / "tiny_bert.onnx"


def test_the_fallback_model_carries_no_inferred_shapes_inside():
    # Our symbolic value_info made onnxruntime's optimizer pick slower kernels for the same nodes
    # (tiny BERT export: 0.45 -> 0.55 ms); the boundary stays typed, the inside is onnxruntime's to infer.
    graph = load_model(str(BERT))
    nodes = list(range(len(graph.nodes)))
    inputs, outputs = graph.boundary(nodes)
    assert len(extract_model(graph, nodes, inputs, outputs, "p").graph.value_info) > 0
    model = extract_model(graph, nodes, inputs, outputs, "p", internal_shapes=False)
    assert len(model.graph.value_info) == 0
    assert [i.name for i in model.graph.input] == list(inputs)
    assert all(o.type.tensor_type.elem_type for o in model.graph.output)
    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(0, 100, (2, 8), dtype=np.int64),
        "attention_mask": np.ones((2, 8), np.int64),
        "token_type_ids": np.zeros((2, 8), np.int64),
    }
    feeds = {k: v for k, v in feeds.items() if k in inputs}
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    want = ort.InferenceSession(str(BERT), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert_parity(got, want)
