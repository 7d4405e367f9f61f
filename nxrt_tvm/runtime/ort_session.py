"""onnxruntime sessions as nxrt-tvm makes them: quiet (errors reach the caller as exceptions), CPU,
with the thread count and spinning the caller decides. The fallback EP, partition timing and the CLI's
reference run all use it."""

from __future__ import annotations

import onnxruntime as ort

__all__ = ["ort_session", "ort_session_options"]


def ort_session_options(threads: int = 0, spinning: bool | None = None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # onnxruntime would print its errors too; ours say them once
    if spinning is not None:
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return options


def ort_session(model: bytes, threads: int = 0, spinning: bool | None = None) -> ort.InferenceSession:
    return ort.InferenceSession(
        model, ort_session_options(threads, spinning), providers=["CPUExecutionProvider"]
    )
