"""Load an ONNX model into a `GraphView`: checked, shape-inferred, topologically sorted.

Everything downstream (claims, grouping, extraction, the session) reads the
graph through this one view, so names, order and types are decided once.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_model

from ..api.errors import InvalidModel
from ..api.provider import BlobStore
from ..api.registry import normalize_domain
from .constants import add_initializer, fold_constant_nodes, take_constant_branches
from .functions import inline_function_ops
from .inference import infer
from .order import implicit_inputs, kahn_order
from .shape_fold import fold_shape_computations

__all__ = [
    "ValueInfo",
    "GraphView",
    "load_model",
    "read_model",
    "analyse",
    "override_free_dims",
    "fix_input_shapes",
    "fix_input_values",
    "specialisable_inputs",
    "ModelSource",
    "attributes",
]

ModelSource = str | Path | bytes | onnx.ModelProto

Dim = int | str | None


#: dim_params exporters give every unknown dim (tf2onnx, Paddle): they name no size, so two dims that
#: carry one are not the same size (onnxruntime does not relate them either)
ANONYMOUS_DIMS = frozenset({"?", "-1"})


@dataclass(frozen=True)
class ValueInfo:
    """A value's element type (ONNX enum, None when unknown) and shape (None when rank is unknown)."""

    name: str
    elem_type: int | None
    shape: tuple[Dim, ...] | None

    @property
    def dtype(self) -> np.dtype | None:
        if self.elem_type is None:
            return None
        try:
            return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type))
        except (KeyError, TypeError):
            return None

    @property
    def type_name(self) -> str:
        if self.elem_type is None:
            return "unknown"
        return onnx.TensorProto.DataType.Name(self.elem_type).lower()

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def to_proto(self) -> onnx.ValueInfoProto:
        shape = None if self.shape is None else [d if d is not None else "" for d in self.shape]
        return helper.make_tensor_value_info(self.name, self.elem_type or onnx.TensorProto.UNDEFINED, shape)

    @classmethod
    def from_proto(cls, vi: onnx.ValueInfoProto) -> "ValueInfo":
        t = vi.type
        if not t.HasField("tensor_type"):
            return cls(vi.name, None, None)
        tt = t.tensor_type
        elem = tt.elem_type or None
        if not tt.HasField("shape"):
            return cls(vi.name, elem, None)
        dims: list[Dim] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param and d.dim_param not in ANONYMOUS_DIMS:
                dims.append(d.dim_param)
            else:  # no size, or one exporters write for "any" (Paddle's -1, tf2onnx's "?"): unknown
                dims.append(None)
        return cls(vi.name, elem, tuple(dims))


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The tensor an ai.onnx Constant node produces, or None for forms kept as nodes."""
    if node.op_type != "Constant" or normalize_domain(node.domain) or len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    value = helper.get_attribute_value(attr)
    if attr.name == "value":
        return numpy_helper.to_array(value)
    if attr.name in ("value_float", "value_floats"):
        return np.asarray(value, dtype=np.float32)
    if attr.name in ("value_int", "value_ints"):
        return np.asarray(value, dtype=np.int64)
    return None  # strings and sparse tensors stay nodes


class GraphView:
    """A read-only, analysed view of one ONNX model's main graph."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        graph = model.graph
        self.opsets: dict[str, int] = {normalize_domain(o.domain): o.version for o in model.opset_import}
        self.initializers: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer}
        self.value_info: dict[str, ValueInfo] = {}
        #: declared types that are not tensors (sequences, optionals): kept whole for extraction
        self.other_types: dict[str, onnx.ValueInfoProto] = {
            vi.name: vi
            for vi in [*graph.input, *graph.output, *graph.value_info]
            if vi.type.WhichOneof("value") not in (None, "tensor_type")
        }
        for vi in [*graph.input, *graph.output, *graph.value_info]:
            info = ValueInfo.from_proto(vi)
            if vi.name not in self.value_info or self.value_info[vi.name].elem_type is None:
                self.value_info[vi.name] = info
        for name, tensor in self.initializers.items():
            self.value_info[name] = ValueInfo(name, tensor.data_type, tuple(tensor.dims))
        self.inputs: list[ValueInfo] = [
            self.value_info[i.name] for i in graph.input if i.name not in self.initializers
        ]
        self.outputs: list[ValueInfo] = [self.value_info[o.name] for o in graph.output]
        self.nodes: list[onnx.NodeProto] = list(graph.node)
        self.node_inputs: list[tuple[str, ...]] = []
        for node in self.nodes:
            implicit = implicit_inputs(node)
            explicit = [n for n in node.input if n]
            self.node_inputs.append(tuple(dict.fromkeys([*explicit, *sorted(implicit - set(explicit))])))
        self.producer: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            for out in node.output:
                if out:
                    self.producer[out] = i
        self.consumers: dict[str, list[int]] = {}
        for i, names in enumerate(self.node_inputs):
            for name in names:
                self.consumers.setdefault(name, []).append(i)
        self._digests: dict[str, bytes] = {}

    # -- structure ------------------------------------------------------------------
    def opset_of(self, index: int) -> int:
        domain = normalize_domain(self.nodes[index].domain)
        return self.opsets.get(domain, 1)

    @cached_property
    def successors(self) -> list[tuple[int, ...]]:
        return [
            tuple(sorted({c for out in node.output if out for c in self.consumers.get(out, ())}))
            for node in self.nodes
        ]

    @cached_property
    def predecessors(self) -> list[tuple[int, ...]]:
        return [
            tuple(sorted({self.producer[n] for n in names if n in self.producer}))
            for names in self.node_inputs
        ]

    @cached_property
    def output_names(self) -> frozenset[str]:
        return frozenset(o.name for o in self.outputs)

    def info(self, name: str) -> ValueInfo:
        return self.value_info.get(name, ValueInfo(name, None, None))

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer, or None when `name` is computed at run time."""
        tensor = self.initializers.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)

    def initializer_digest(self, name: str) -> bytes:
        """The sha256 of initializer `name` (its whole proto), computed once per view: compile-cache keys
        hash a partition's weights by these, and a session keys overlapping node sets (proofs,
        bisections) where each used to serialise and hash the weights again."""
        digest = self._digests.get(name)
        if digest is None:
            proto = self.initializers[name].SerializeToString(deterministic=True)
            digest = self._digests[name] = hashlib.sha256(proto).digest()
        return digest

    def boundary(self, nodes: Iterable[int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Values a node set reads from outside (initializers excluded) and values it must export."""
        members = set(nodes)
        ordered = sorted(members)
        produced = {o for i in ordered for o in self.nodes[i].output if o}
        inputs: dict[str, None] = {}
        outputs: dict[str, None] = {}
        for i in ordered:
            for name in self.node_inputs[i]:
                if name not in produced and name not in self.initializers:
                    inputs[name] = None
            for out in self.nodes[i].output:
                if out and (
                    out in self.output_names or any(c not in members for c in self.consumers.get(out, ()))
                ):
                    outputs[out] = None
        return tuple(inputs), tuple(outputs)


def read_model(source: ModelSource, data: bytes | None = None) -> tuple[onnx.ModelProto, Path | None]:
    """The model proto (external data loaded) and the folder it came from (None for bytes/protos).

    `data`: the file's bytes, already read (and checked, e.g. against a signature): parsed instead of
    reading the file again, which could have changed since.
    """
    if isinstance(source, onnx.ModelProto):
        return source, None
    try:
        if isinstance(source, bytes):
            return onnx.load_model_from_string(source), None
        path = Path(source)
        if data is None:
            if not path.is_file():
                raise InvalidModel(f"model file {str(path)!r} does not exist")
            return onnx.load(str(path), load_external_data=True), path.parent
        model = onnx.load_model_from_string(data)
        load_external_data_for_model(model, str(path.parent))
        return model, path.parent
    except InvalidModel:
        raise
    except Exception as exc:  # protobuf and external-data errors have no common base
        raise InvalidModel(
            f"cannot read {source if not isinstance(source, bytes) else 'model bytes'} as ONNX: {exc}"
        ) from exc


def _topological_order(nodes: list[onnx.NodeProto], implicit: list[set[str]]) -> list[int]:
    """Kahn's algorithm, stable on file order; raises on cycles."""
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for out in node.output:
            if out:
                if out in producer:
                    raise InvalidModel(
                        f"value {out!r} is produced by two nodes "
                        f"({nodes[producer[out]].name!r} and {node.name!r})"
                    )
                producer[out] = i
    deps = [
        {producer[n] for n in [*node.input, *implicit[i]] if n in producer} for i, node in enumerate(nodes)
    ]
    order = kahn_order(deps)
    if len(order) != len(nodes):
        done = set(order)
        stuck = [nodes[i].name or nodes[i].op_type for i in range(len(nodes)) if i not in done][:5]
        raise InvalidModel(f"the graph has a cycle (nodes involved include {stuck})")
    return order


def _normalise(model: onnx.ModelProto, inline: Collection[str] = ()) -> onnx.ModelProto:
    """Unique node names, function ops in `inline` replaced by their bodies, Constant nodes folded to
    initializers, nodes in topological order, small computations on constants evaluated
    (`constants.fold_constant_nodes`)."""
    graph = model.graph
    seen: set[str] = set()
    for i, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        node.name = name
    inline_function_ops(model, inline)
    kept = []
    for node in graph.node:
        value = _constant_node_value(node)
        if value is None or node.output[0] in {o.name for o in graph.output}:
            kept.append(node)
        else:
            add_initializer(model, numpy_helper.from_array(value, node.output[0]))
    order = _topological_order(kept, [implicit_inputs(node) for node in kept])
    if len(kept) != len(graph.node) or order != list(
        range(len(kept))
    ):  # rewrite only when needed: it copies every node
        del graph.node[:]
        graph.node.extend(kept[i] for i in order)
    fold_constant_nodes(model)
    return model


#: Initializers with more elements are left out of the copy that is checked and shape-inferred:
#: neither needs weight values (only small ones, such as Reshape targets), and both serialise
#: the whole model, which costs more than everything else when a deployed model loads.
_LIGHT_INITIALIZER_ELEMENTS = 1024


def _light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with large initializers turned into typed graph inputs (no weight bytes copied)."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    graph.name = model.graph.name
    for node in model.graph.node:
        if node.op_type == "EPContext":  # leave the embedded blob behind
            light_node = graph.node.add(name=node.name, op_type=node.op_type, domain=node.domain)
            light_node.input.extend(node.input)
            light_node.output.extend(node.output)
            light_node.attribute.extend(a for a in node.attribute if a.name != "ep_cache_context")
        else:
            graph.node.append(node)
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    graph.input.extend(model.graph.input)
    declared = {i.name for i in model.graph.input}
    for tensor in model.graph.initializer:
        if (
            math.prod(tensor.dims) <= _LIGHT_INITIALIZER_ELEMENTS
            or tensor.data_location == onnx.TensorProto.EXTERNAL
        ):
            graph.initializer.append(tensor)
        elif tensor.name not in declared:
            graph.input.append(
                helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
    return light


def _checkable(light: onnx.ModelProto) -> onnx.ModelProto:
    """`light` (a copy) as onnx.checker accepts what onnxruntime runs: a graph input or output that
    declares an element type but no shape (unknown rank, onnx.helper's ``shape=None``) is refused by the
    checker alone; the checked copy declares an empty shape there (the checker infers nothing, so no
    rank is compared with it)."""
    for value in (*light.graph.input, *light.graph.output):
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
            value.type.tensor_type.shape.SetInParent()
    return light


#: rounds of taking branches whose conditions are constants (each may reveal nested ones)
_BRANCH_ROUNDS = 4


def analyse(
    model: onnx.ModelProto,
    *,
    check: bool = True,
    inline: Collection[str] = (),
    symbolic: bool = True,
    store: BlobStore | None = None,
) -> GraphView:
    """Check, normalise and shape-infer `model` (edited in place) into a `GraphView`; function ops in
    `inline` are replaced by their ONNX bodies (`nxrt_tvm.graph.functions`). Symbolic dims are inferred
    where `symbolic` (claims need them; running a fixed plan does not); `store` keeps what inference
    found (`inference.infer`)."""
    if check:
        try:
            onnx.checker.check_model(_checkable(_light_copy(model)))
        except (onnx.checker.ValidationError, ValueError) as exc:
            raise InvalidModel(f"model fails onnx.checker: {exc}") from exc
    _normalise(model, inline)
    folded = _infer_into(model, symbolic, store) and fold_shape_computations(model) > 0
    for _ in range(_BRANCH_ROUNDS):  # a taken branch's own conditions fold once its shapes are inferred
        if not take_constant_branches(model):
            break
        _normalise(model, inline)
        folded = _infer_into(model, symbolic, store) and fold_shape_computations(model) > 0
    if folded:
        _infer_into(model, symbolic, store)  # the folded shapes name their dims now
    return GraphView(model)


def _infer_into(model: onnx.ModelProto, symbolic: bool, store: BlobStore | None) -> bool:
    """Replace `model`'s value_info by what `inference.infer` finds; False where inference failed."""
    try:
        inferred = infer(_light_copy(model), symbolic=symbolic, store=store)
    except InvalidModel:
        raise
    except Exception as exc:  # inference errors are diagnostics, not fatal: ORT may still run it
        logging.getLogger(__name__).warning("ONNX shape inference failed (%s); types stay as declared", exc)
        return False
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred)
    return True


def load_model(
    source: ModelSource,
    *,
    check: bool = True,
    free_dims: dict[str, int] | None = None,
    inline: Collection[str] = (),
) -> GraphView:
    """Read, check, normalise and shape-infer a model; raise `InvalidModel` with the reason on failure.

    A `ModelProto` argument is copied, never edited. `free_dims` fixes symbolic input dims by name;
    function ops in `inline` are replaced by their bodies (what the EPs ask for: `inlined_ops`).
    """
    model, _ = read_model(source)
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto.FromString(model.SerializeToString())
    override_free_dims(model, dict(free_dims or {}))
    return analyse(model, check=check, inline=inline)


def override_free_dims(model: onnx.ModelProto, overrides: dict[str, int]) -> None:
    """Replace symbolic input dims by the sizes the user fixed (onnxruntime's free-dimension overrides)."""
    if not overrides:
        return
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in overrides:
                dim.dim_value = overrides[dim.dim_param]
    _drop_inferable_types(model)


def fix_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> None:
    """Fix every dim of the named inputs, named or not, to `shapes` (a build specialised to the shapes a
    session's calls have: `specialise`); a rank that differs is an `InvalidModel`."""
    if not shapes:
        return
    for value in model.graph.input:
        shape = shapes.get(value.name)
        if shape is None:
            continue
        dims = value.type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise InvalidModel(f"input {value.name!r} has rank {len(dims)}; cannot fix it to {list(shape)}")
        for dim, size in zip(dims, shape):
            dim.dim_value = int(size)  # clears dim_param (one of the two)
    _drop_inferable_types(model)


def fix_input_values(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> None:
    """Make the named inputs constants of `values` (a build for the value of an input that decides a
    branch: `constants.branch_inputs`): each leaves the graph's inputs and becomes an initializer."""
    if not values:
        return
    declared = {v.name: ValueInfo.from_proto(v) for v in model.graph.input}
    for name, value in values.items():
        info = declared.get(name)
        if info is None or info.dtype is None or info.shape != value.shape:
            raise InvalidModel(f"input {name!r} cannot be fixed to a value of shape {list(value.shape)}")
    kept = [v for v in model.graph.input if v.name not in values]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    for name, value in values.items():  # (declared as inputs again before IR version 4)
        add_initializer(model, numpy_helper.from_array(np.asarray(value, dtype=declared[name].dtype), name))


def specialisable_inputs(model: onnx.ModelProto) -> bool:
    """Whether a build for its calls' input shapes could fix input dims the model leaves open: every graph
    input (initializers aside) a tensor of known rank, and some dim not a fixed size."""
    weights = {t.name for t in model.graph.initializer}
    inputs = [ValueInfo.from_proto(v) for v in model.graph.input if v.name not in weights]
    return all(i.shape is not None for i in inputs) and not all(i.is_static for i in inputs)


def _drop_inferable_types(model: onnx.ModelProto) -> None:
    # Values ONNX inference recomputes from the now static inputs are dropped; the types of outputs of
    # ops it knows nothing about (EPContext nodes, custom domains) can only come from the file: kept.
    inferable = {o for n in model.graph.node if normalize_domain(n.domain) == "" for o in n.output}
    kept = [vi for vi in model.graph.value_info if vi.name not in inferable]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as Python values, strings as `str` (onnx gives `bytes`)."""
    return {a.name: _text(helper.get_attribute_value(a)) for a in node.attribute}


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list) and value and all(isinstance(v, bytes) for v in value):
        return [v.decode() for v in value]
    return value
