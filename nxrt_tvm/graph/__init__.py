"""ONNX loading, the analysed graph view, and subgraph extraction."""

from .extract import extract_model
from .model import GraphView, ModelSource, ValueInfo, attributes, load_model

__all__ = ["GraphView", "ModelSource", "ValueInfo", "attributes", "load_model", "extract_model"]
