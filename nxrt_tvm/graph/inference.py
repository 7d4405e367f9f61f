"""Shape inference: ONNX's (types checked strictly), then onnxruntime's symbolic inference for the dims.

ONNX's inference names every dim it cannot relate to the inputs anew (`unk__7`), so a
transformers export's hidden state is `[unk__7, unk__8, 64]` where it is `[batch, seq, 64]`:
partitions then meet broadcasts between unrelated symbols and shape computations they
cannot prove. onnxruntime's `symbolic_shape_infer` (sympy) follows shape values through
Shape/Gather/Concat/Reshape/Expand/Slice and merges dims that must be equal (`auto_merge`:
a broadcast or an elementwise op between them), as its TensorRT EP does before
partitioning. Where it cannot run (an op it does not know, sympy missing), ONNX's result
stands. A session that claims nothing (a deployment of a compiled model) needs types only and
skips it; a session with a compile cache keeps what inference found there, keyed by the model.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import re
from fractions import Fraction
from functools import cache
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from ..api.errors import InvalidModel
from ..api.provider import BlobStore
from ..no_torch import without_torch

__all__ = ["infer"]

log = logging.getLogger(__name__)

#: onnx's message when a declared element type contradicts
#: the one a node produces (ORT refuses such models too)
_TYPE_CONFLICT = "Inferred elem type differs from existing elem type"


def infer(
    light: onnx.ModelProto, *, symbolic: bool = True, store: BlobStore | None = None
) -> list[onnx.ValueInfoProto]:
    """`light`'s inferred value_info: ONNX's types, with the symbolic dims where those are known
    (`symbolic`). Where symbolic inference runs, its result is kept in `store`, keyed by the light
    model's content (which holds no weights, only their types)."""
    key = _store_key(light) if symbolic and store is not None else None
    if key is not None:
        data = store.get(key)
        if data is not None:
            try:
                return list(onnx.GraphProto.FromString(data).value_info)
            except DecodeError:
                log.warning("a stored shape inference result is unreadable; inferring again")
    inferred = _onnx_infer(light)
    if not symbolic or _all_static(inferred):  # nothing to find (and no sympy import: 0.2 s)
        return list(inferred.graph.value_info)
    symbolic_info = _symbolic_value_info(inferred)
    unranked = _branches_disagree(inferred.graph)
    for vi in inferred.graph.value_info:
        better = symbolic_info.get(vi.name)
        if vi.name in unranked:
            continue
        if better is not None and better.type.tensor_type.elem_type == vi.type.tensor_type.elem_type:
            vi.type.tensor_type.shape.CopyFrom(better.type.tensor_type.shape)
    if key is not None:
        store.put(key, onnx.GraphProto(value_info=inferred.graph.value_info).SerializeToString())
    return list(inferred.graph.value_info)


def _branches_disagree(graph: onnx.GraphProto) -> set[str]:
    """Outputs of an If whose branches give them different ranks (or one unknown), and every value
    computed from them (`graph`'s nodes in topological order): onnx leaves their shapes unknown;
    onnxruntime's symbolic inference goes on from one branch's, which is wrong whenever the other runs
    (Silero VAD 16k squeezes a batch of 1 in one branch: the length of the Shape of the If's output,
    3, folded the condition of an If after it the wrong way, and its LSTM got a rank-4 input)."""
    names: set[str] = set()
    for node in graph.node:
        if names.intersection(node.input):
            names.update(node.output)
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            continue
        branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
        then, other = branches.get("then_branch"), branches.get("else_branch")
        if then is None or other is None:
            continue
        for out, a, b in zip(node.output, then.output, other.output):
            if _rank(a) is None or _rank(a) != _rank(b):
                names.add(out)
    return names


def _rank(value: onnx.ValueInfoProto) -> int | None:
    tensor = value.type.tensor_type
    return len(tensor.shape.dim) if value.type.HasField("tensor_type") and tensor.HasField("shape") else None


def _store_key(light: onnx.ModelProto) -> str:
    h = hashlib.sha256(b"nxrt-tvm.shape_inference.v1\0" + _inference_version().encode() + b"\0")
    h.update(light.SerializeToString(deterministic=True))
    return h.hexdigest()


@cache
def _inference_version() -> str:
    """What the inferred shapes depend on besides the model: this file, onnx, onnxruntime and sympy."""
    versions = []
    for package in ("onnx", "onnxruntime", "sympy"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} none")
    source = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    return ";".join([source, *versions])


def _onnx_infer(light: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference, strict first: an element type that contradicts its producer is an `InvalidModel`.

    A declared type wins over inference when the model is kept as declared, so a float Add
    declared int64 would come back as int64 values; onnxruntime refuses the model instead.
    Other strict-mode findings (shape disagreements, ops inference does not know) are left to
    the lenient pass, as in onnxruntime.
    """
    try:
        return onnx.shape_inference.infer_shapes(light, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        if _TYPE_CONFLICT in str(exc):
            raise InvalidModel(
                f"a declared type contradicts the node that produces it: {str(exc).strip()}; "
                "fix the value's declared type (graph output or value_info) to the produced one"
            ) from None
    return onnx.shape_inference.infer_shapes(light, data_prop=True)


def _all_static(model: onnx.ModelProto) -> bool:
    """Whether every value's shape is known as numbers (graph inputs, node outputs, graph outputs)."""
    graph = model.graph
    known = {vi.name for vi in (*graph.input, *graph.value_info, *graph.output)}
    if any(out and out not in known for node in graph.node for out in node.output):
        return False
    for vi in (*graph.input, *graph.value_info, *graph.output):
        if not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
            return False
    return True


_NOT_A_NAME = re.compile(r"[^0-9A-Za-z_]")


def _symbolic_value_info(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Per value, its shape from onnxruntime's symbolic inference where every dim is known (no file
    is written: onnxruntime's `infer_shapes` saves a partial result into the working directory)."""
    try:
        with without_torch():  # onnxruntime.tools would import torch (1.2 s)
            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:  # sympy missing
        return {}
    try:
        inference = _honest_splits(_exact_resize(SymbolicShapeInference))(2**31 - 1, True, False, 0)
        inference._preprocess(model)
        while inference.run_:
            inference._infer_impl()
        out = inference.out_mp_
    except Exception as exc:  # an op or a pattern it does not know: ONNX's dims stand
        log.debug("symbolic shape inference stopped: %s", exc)
        return {}
    found: dict[str, onnx.ValueInfoProto] = {}
    for vi in out.graph.value_info:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        dims = tt.shape.dim
        if all(d.HasField("dim_value") or d.dim_param for d in dims):
            for d in dims:  # sympy's expressions ("2*seq") as plain names: one size each, not related
                if d.HasField("dim_param") and _NOT_A_NAME.search(d.dim_param):
                    d.dim_param = "sym_" + _NOT_A_NAME.sub("_", d.dim_param)
            found[vi.name] = vi
    return found


#: the largest denominator a Resize scale is taken as an exact fraction with (2.0, 0.5, 1.25, ...)
_SCALE_DENOMINATOR = 1 << 10


def _exact_resize(base: type) -> type:
    """onnxruntime's symbolic inference with Resize's scaled dims computed exactly.

    onnxruntime multiplies each dim by its scale as a float and asks sympy to simplify
    ``floor(2.0 * d)`` back to an integer expression: with the nested floors of a strided
    CNN's dims, that took 5.2 of PP-OCR det's 5.6 s of model loading (YOLOv8n: 2.2 s). A scale
    that is a small fraction exactly (all real upsamplings are) gives ``floor(d * 2)``, which
    sympy evaluates as it builds it, to the same dims. Any other Resize is left to onnxruntime.
    """
    from onnxruntime.tools.symbolic_shape_infer import get_attribute, get_opset, get_shape_from_sympy_shape
    from sympy import Rational, floor

    class ExactResize(base):
        def _infer_Resize(self, node: onnx.NodeProto) -> None:  # noqa: N802 - onnxruntime's name
            opset = get_opset(self.out_mp_)
            scales = self._try_get_value(node, 1 if opset <= 10 else 2)
            sizes = self._try_get_value(node, 3) if opset > 10 and len(node.input) > 3 else None
            dims = self._get_sympy_shape(node, 0)
            if (
                sizes is not None
                or scales is None
                or len(scales) != len(dims)
                or get_attribute(node, "coordinate_transformation_mode") == "tf_crop_and_resize"
            ):
                return super()._infer_Resize(node)
            exact = [Fraction(float(s)).limit_denominator(_SCALE_DENOMINATOR) for s in scales]
            if any(float(f) != float(s) for f, s in zip(exact, scales, strict=True)):
                return super()._infer_Resize(node)
            shape = [
                floor(d * Rational(f.numerator, f.denominator)) for d, f in zip(dims, exact, strict=True)
            ]
            self._update_computed_dims(shape)
            elem_type = self.known_vi_[node.input[0]].type.tensor_type.elem_type
            self.known_vi_[node.output[0]].CopyFrom(
                onnx.helper.make_tensor_value_info(
                    node.output[0], elem_type, get_shape_from_sympy_shape(shape)
                )
            )
            return None

    return ExactResize


def _honest_splits(base: type) -> type:
    """onnxruntime's symbolic inference without a guessed Split.

    Given a `split` input whose value it does not know, onnxruntime splits the axis evenly, the rule
    for a Split with no `split` input. ONNX's RotaryEmbedding body splits its head dim into
    `[rotary dim, rest]` = `[8, 0]` computed from shapes: inferred `[4, 4]`, the partitions after it
    were built for the wrong sizes (declined at their build; had the sizes agreed downstream, a kernel
    would have read its inputs at the wrong shape). Here such outputs get a fresh size on the axis,
    and Identity passes on the value it forwards (that Identity was why the split was unknown)."""
    from onnxruntime.tools.symbolic_shape_infer import (
        get_attribute,
        get_opset,
        get_shape_from_sympy_shape,
        handle_negative_axis,
    )

    class HonestSplits(base):
        def _pass_on_shape_and_type(self, node: onnx.NodeProto) -> None:
            super()._pass_on_shape_and_type(node)
            if node.op_type == "Identity" and node.input[0] in self.sympy_data_:
                self.sympy_data_[node.output[0]] = self.sympy_data_[node.input[0]]

        def _infer_Split(self, node: onnx.NodeProto) -> None:  # noqa: N802 - onnxruntime's name
            given = get_opset(self.out_mp_) >= 13 and len(node.input) > 1 and node.input[1]
            if not given or self._try_get_value(node, 1) is not None:
                return super()._infer_Split(node)
            shape = self._get_sympy_shape(node, 0)
            axis = handle_negative_axis(get_attribute(node, "axis", 0), len(shape))
            elem_type = self.known_vi_[node.input[0]].type.tensor_type.elem_type
            for k, name in enumerate(node.output):
                dims = [*shape[:axis], self._new_symbolic_dim_from_output(node, k, axis), *shape[axis + 1 :]]
                self.known_vi_[name].CopyFrom(
                    onnx.helper.make_tensor_value_info(name, elem_type, get_shape_from_sympy_shape(dims))
                )
            return None

    return HonestSplits
