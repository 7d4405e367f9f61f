"""ONNX backend API (`onnx.backend.base.Backend`) over `nxrt_tvm.InferenceSession`.

The TVM EP claims first and onnxruntime's CPU EP runs the rest, so onnx's
own conformance suite drives the whole stack::

    import onnx.backend.test
    from nxrt_tvm import backend
    globals().update(onnx.backend.test.BackendTest(backend, __name__).test_cases)

`prepare(model, device="CPU", providers=..., provider_options=..., sess_options=...)`
builds a session (every claim proven by a TVM build); `BackendRep.run(inputs)`
feeds the model's graph inputs (initializers excluded) in order and returns the
outputs as an `onnx.backend.base.namedtupledict`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from .api.errors import InvalidFeed
from .session import DEFAULT_PROVIDERS, InferenceSession

__all__ = [
    "NxrtBackend",
    "NxrtBackendRep",
    "prepare",
    "run_model",
    "run_node",
    "supports_device",
    "is_compatible",
]

#: Provider options of a backend session: every TVM partition of any size, on the host CPU.
DEFAULT_PROVIDER_OPTIONS: tuple[dict, ...] = ({"target": "llvm", "min_subgraph_size": 1}, {})


class NxrtBackendRep(BackendRep):
    """A prepared model: one `InferenceSession`; `run` takes a list, tuple, dict or single array."""

    def __init__(self, session: InferenceSession):
        self.session = session
        self._input_names = [i.name for i in session.get_inputs()]
        self._output_names = [o.name for o in session.get_outputs()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:  # noqa: ARG002 - backend API signature
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, (np.ndarray, np.generic)) or not isinstance(inputs, Sequence):
                inputs = [inputs]
            if len(inputs) > len(self._input_names):
                raise InvalidFeed(
                    f"{len(inputs)} inputs given, but the model takes "
                    f"{len(self._input_names)}: {self._input_names}"
                )
            feeds = dict(zip(self._input_names, inputs))
        outputs = self.session.run(None, feeds)
        return namedtupledict("Outputs", self._output_names)(*outputs)


class NxrtBackend(Backend):
    """nxrt-tvm as an ONNX backend: TVM EP first, onnxruntime CPU fallback after."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:  # noqa: ARG003
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> NxrtBackendRep:
        if not cls.supports_device(device):
            raise RuntimeError(f"nxrt-tvm's backend runs on CPU only, not {device!r}")
        providers = kwargs.pop("providers", None)
        provider_options = kwargs.pop("provider_options", None)
        if providers is None:
            providers = list(DEFAULT_PROVIDERS)
            if provider_options is None:
                provider_options = [dict(o) for o in DEFAULT_PROVIDER_OPTIONS]
        sess_options = kwargs.pop("sess_options", None)
        # Anything else (e.g. the test runner's rtol/atol) is not a session setting.
        session = InferenceSession(
            model, sess_options, providers=providers, provider_options=provider_options
        )
        return NxrtBackendRep(session)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node: a model is made around it, its input types taken from `inputs`."""
        arrays = [np.asarray(x) for x in (inputs.values() if isinstance(inputs, Mapping) else inputs)]
        names = list(inputs.keys()) if isinstance(inputs, Mapping) else [n for n in node.input if n]
        graph_inputs = [
            onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in zip(names, arrays)
        ]
        if outputs_info is not None:
            graph_outputs = [
                onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(t)), s)
                for n, (t, s) in zip(node.output, outputs_info)
            ]
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        if outputs_info is None:  # output types from the op's type and shape inference
            schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
            inferred = onnx.shape_inference.infer_node_outputs(
                schema, node, {v.name: v.type for v in graph_inputs}
            )
            graph_outputs = [onnx.helper.make_value_info(n, inferred[n]) for n in node.output if n]
        model = onnx.helper.make_model(
            onnx.helper.make_graph([node], "run_node", graph_inputs, graph_outputs),
            opset_imports=[onnx.helper.make_opsetid(node.domain or "", opset)],
        )
        return cls.prepare(model, device, **kwargs).run(dict(zip(names, arrays)))


prepare = NxrtBackend.prepare
run_model = NxrtBackend.run_model
run_node = NxrtBackend.run_node
supports_device = NxrtBackend.supports_device
is_compatible = NxrtBackend.is_compatible
