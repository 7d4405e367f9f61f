"""Fold shape computations whose value is known, constant or symbolic, before claims.

Exporters compute every target shape at run time: torch's `expand` becomes
`Where(Equal(shape, -1), ones, shape)` over `Shape -> Gather -> Unsqueeze -> Concat`,
transformers' masks `ConstantOfShape(Shape(...))`. onnxruntime runs such chains in
microseconds, but TVM's frontend folds `Equal`/`Where` on shape values at import
(wrongly for symbolic dims), so they are declined and every value they feed crosses
a partition boundary.

This pass evaluates the small integer tensors of a graph as lists of known sizes:
ints, or `Sym`s (a dim that is not known until run time, but is the same size
wherever it appears: one graph-input dim_param, or one axis of one tensor). A
node whose value is then fully known is replaced:
- by an initializer when every element is an int (or bool);
- by `Shape -> Gather -> Unsqueeze -> Concat` of the tensors its dims come from
  when some are symbolic (the form TVM's frontend imports as a shape value), if it
  is not such a chain already.
Facts used: a tensor's dim is never negative (`Equal(dim, -1)` is false); two
dims with the same graph-input dim_param are the same size (the session refuses
feeds where they differ); one axis of one tensor is one size. Nodes left without
consumers are removed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..api.registry import default_opset, normalize_domain
from .order import implicit_inputs

__all__ = ["Sym", "fold_shape_computations"]

#: longest integer vector evaluated (shapes and their pieces)
_MAX_ELEMENTS = 16
_INT_TYPES = frozenset(
    {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL, onnx.TensorProto.INT8}
)


@dataclass(frozen=True)
class Sym:
    """A non-negative size known only at run time; equal `key`s are the same size."""

    key: str


Element = int | bool | Sym | None  #: None: not known
#: a small integer tensor's value: (rank 0?, elements)
Value = tuple[bool, tuple[Element, ...]]


def _known(value: Value | None) -> bool:
    return value is not None and all(e is not None for e in value[1])


class _Evaluator:
    """Values of a graph's small integer tensors, and where each symbolic dim can be read."""

    def __init__(self, model: onnx.ModelProto):
        graph = model.graph
        self.shapes: dict[str, tuple[int | str | None, ...]] = {}
        self.types: dict[str, int] = {}
        for vi in [*graph.input, *graph.value_info, *graph.output]:
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                continue
            self.types.setdefault(vi.name, tt.elem_type)
            if tt.HasField("shape") and vi.name not in self.shapes:
                self.shapes[vi.name] = tuple(
                    d.dim_value
                    if d.HasField("dim_value") and d.dim_value >= 0
                    else (d.dim_param or None)
                    if d.HasField("dim_param")
                    else None
                    for d in tt.shape.dim
                )
        initializers = {t.name for t in graph.initializer}
        #: dim_params the session binds across inputs: one name, one size
        self.bound = {
            d
            for vi in graph.input
            if vi.name not in initializers
            for d in self.shapes.get(vi.name, ())
            if isinstance(d, str) and d not in ("?", "-1")
        }
        self.values: dict[str, Value] = {}
        #: per symbolic dim, a (tensor, axis) that holds it at run time (the first Shape read)
        self.origin: dict[str, tuple[str, int]] = {}
        for tensor in graph.initializer:
            self.add_initializer(tensor)

    def add_initializer(self, tensor: onnx.TensorProto) -> None:
        self.types[tensor.name] = tensor.data_type
        # its shape is known whatever its size (Silero VAD pads by Shape of a weight: unfolded, the chain
        # reached TVM as a shape value its Reshape could not infer a -1 from, and the build was bisected)
        self.shapes[tensor.name] = tuple(int(d) for d in tensor.dims)
        if tensor.data_type in _INT_TYPES and len(tensor.dims) <= 1:
            if math.prod(tensor.dims) <= _MAX_ELEMENTS:
                array = numpy_helper.to_array(tensor)
                self.values[tensor.name] = (array.ndim == 0, tuple(_py(v) for v in array.reshape(-1)))

    def dim(self, tensor: str, axis: int) -> int | Sym | None:
        dims = self.shapes.get(tensor)
        if dims is None or axis >= len(dims):
            return None
        d = dims[axis]
        if isinstance(d, int):
            return d
        key = d if isinstance(d, str) and d in self.bound else f"{tensor}#{axis}"
        self.origin.setdefault(key, (tensor, axis))
        return Sym(key)

    def run(self, node: onnx.NodeProto) -> Value | None:
        if normalize_domain(node.domain) != "" or len(node.output) != 1:
            return None
        handler = _HANDLERS.get(node.op_type)
        if handler is None:
            return None
        try:
            value = handler(self, node, [self.values.get(i) if i else None for i in node.input])
        except (ValueError, IndexError, TypeError, KeyError, ZeroDivisionError):
            return None  # an odd but valid node (onnxruntime will say if not): left as it is
        if value is None or len(value[1]) > _MAX_ELEMENTS or (value[0] and len(value[1]) != 1):
            return None
        return value


def _py(v) -> int | bool:
    return bool(v) if isinstance(v, np.bool_) else int(v)


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _ints(value: Value | None) -> list[int] | None:
    if value is None or not all(isinstance(e, int) and not isinstance(e, bool) for e in value[1]):
        return None
    return list(value[1])  # type: ignore[arg-type]


# -- the ops evaluated ------------------------------------------------------------------------

Handler = Callable[[_Evaluator, onnx.NodeProto, list], "Value | None"]
_HANDLERS: dict[str, Handler] = {}


def _handles(*ops: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for op in ops:
            _HANDLERS[op] = fn
        return fn

    return register


@_handles("Shape")
def _shape(ev: _Evaluator, node, _args) -> Value | None:
    dims = ev.shapes.get(node.input[0])
    if dims is None:
        return None
    rank = len(dims)
    start, end = _attr(node, "start", 0), _attr(node, "end", rank)
    start, end = (max(0, min(rank, i + rank if i < 0 else i)) for i in (start, end))
    return False, tuple(ev.dim(node.input[0], axis) for axis in range(start, end))


@_handles("Size")
def _size(ev: _Evaluator, node, args) -> Value | None:
    """Elements of a tensor of known dims (or of a known vector): torch's ``if x.dim() == 3``."""
    if args[0] is not None:
        return True, (len(args[0][1]) if not args[0][0] else 1,)
    dims = ev.shapes.get(node.input[0])
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    return True, (math.prod(dims),)


@_handles("Identity", "Cast")
def _identity(ev: _Evaluator, node, args) -> Value | None:
    if node.op_type == "Cast":
        to = _attr(node, "to")
        if to not in _INT_TYPES:
            return None
        if to == onnx.TensorProto.BOOL:
            return args[0] and (args[0][0], tuple(_truth(e) for e in args[0][1]))
        if args[0] is not None and any(isinstance(e, bool) for e in args[0][1]):
            return args[0][0], tuple(int(e) if isinstance(e, bool) else e for e in args[0][1])
    return args[0]


def _truth(e: Element) -> Element:
    if isinstance(e, Sym) or e is None:
        return None
    return bool(e)


@_handles("Gather")
def _gather(ev: _Evaluator, node, args) -> Value | None:
    data, indices = args
    idx = _ints(indices)
    if data is None or data[0] or idx is None or _attr(node, "axis", 0) != 0:
        return None
    n = len(data[1])
    picked = tuple(data[1][i + n if i < 0 else i] for i in idx)
    return indices[0], picked


@_handles("Unsqueeze")
def _unsqueeze(ev: _Evaluator, node, args) -> Value | None:
    axes = _attr(node, "axes") if len(node.input) < 2 else _ints(args[1])
    if args[0] is None or not args[0][0] or axes is None or list(axes) not in ([0], [-1]):
        return None
    return False, args[0][1]


@_handles("Squeeze")
def _squeeze(ev: _Evaluator, node, args) -> Value | None:
    if args[0] is None or args[0][0] or len(args[0][1]) != 1:
        return None
    return True, args[0][1]


@_handles("Concat")
def _concat(ev: _Evaluator, node, args) -> Value | None:
    if any(a is None or a[0] for a in args):
        return None
    return False, tuple(e for a in args for e in a[1])


@_handles("Slice")
def _slice(ev: _Evaluator, node, args) -> Value | None:
    data = args[0]
    if data is None or data[0]:
        return None
    starts, ends = _ints(args[1]), _ints(args[2])
    axes = _ints(args[3]) if len(args) > 3 and node.input[3] else [0]
    steps = _ints(args[4]) if len(args) > 4 and node.input[4] else [1]
    if None in (starts, ends, axes, steps) or axes not in ([0], [-1]) or len(starts) != 1:
        return None
    return False, tuple(data[1][slice(starts[0], ends[0], steps[0])])


@_handles("Reshape")
def _reshape(ev: _Evaluator, node, args) -> Value | None:
    data, target = args[0], _ints(args[1])
    if data is None or target is None:
        return None
    if target == []:
        return (True, data[1]) if len(data[1]) == 1 else None
    if len(target) == 1 and target[0] in (-1, len(data[1])):
        return False, data[1]
    return None


def _elementwise(fn: Callable[..., Element]) -> Handler:
    def handler(ev: _Evaluator, node, args) -> Value | None:
        if any(a is None for a in args):
            return None
        n = max(len(a[1]) for a in args)
        if any(len(a[1]) not in (1, n) for a in args):
            return None
        rank0 = all(a[0] for a in args)
        columns = [[a[1][0 if len(a[1]) == 1 else i] for a in args] for i in range(n)]
        return rank0, tuple(None if None in col else fn(*col) for col in columns)

    return handler


def _equal(a: Element, b: Element) -> Element:
    if isinstance(a, Sym) and isinstance(b, Sym):
        return True if a == b else None
    if isinstance(a, Sym) or isinstance(b, Sym):
        number = b if isinstance(a, Sym) else a
        return False if number < 0 else None  # a dim is never negative
    return a == b


def _arith(fn: Callable[[int, int], int]) -> Callable[[Element, Element], Element]:
    def apply(a: Element, b: Element) -> Element:
        if isinstance(a, Sym) or isinstance(b, Sym):
            return None
        return fn(int(a), int(b))

    return apply


def _div(a: int, b: int) -> int:
    if a < 0 or b <= 0:
        raise ValueError("only non-negative quotients are folded")
    return a // b


_handles("Equal")(_elementwise(_equal))
_handles("Where")(_elementwise(lambda c, a, b: None if isinstance(c, Sym) else (a if c else b)))
_handles("Not")(_elementwise(lambda a: None if isinstance(a, Sym) else not a))
_handles("And")(_elementwise(lambda a, b: None if Sym in (type(a), type(b)) else bool(a and b)))
_handles("Or")(_elementwise(lambda a, b: None if Sym in (type(a), type(b)) else bool(a or b)))
_handles("Add")(_elementwise(_arith(lambda a, b: a + b)))
_handles("Sub")(_elementwise(_arith(lambda a, b: a - b)))
_handles("Mul")(_elementwise(_arith(lambda a, b: a * b)))
_handles("Div")(_elementwise(_arith(_div)))
_handles("Max")(_elementwise(_arith(max)))
_handles("Min")(_elementwise(_arith(min)))


@_handles("Mod")
def _mod(ev: _Evaluator, node, args) -> Value | None:
    """torch's negative-dim arithmetic (`dim % rank`, a Slice's bounds in `unflatten`): fmod=0 takes
    the divisor's sign, as Python's `%`; fmod=1 the dividend's, as C's fmod."""
    if _attr(node, "fmod", 0):
        return _elementwise(_arith(lambda a, b: int(math.fmod(a, b))))(ev, node, args)
    return _elementwise(_arith(lambda a, b: a % b))(ev, node, args)


@_handles("ConstantOfShape")
def _constant_of_shape(ev: _Evaluator, node, args) -> Value | None:
    shape = _ints(args[0])
    fill = _attr(node, "value")
    if shape is None or len(shape) != 1 or fill is None or fill.data_type not in _INT_TYPES:
        return None
    return False, (_py(numpy_helper.to_array(fill).reshape(-1)[0]),) * shape[0]


# -- rewriting --------------------------------------------------------------------------------

#: ops that already are the chain TVM's frontend imports as a shape value: left as they are
_SHAPE_CHAIN = frozenset({"Shape", "Gather", "Unsqueeze", "Concat", "Squeeze", "Identity", "Cast", "Slice"})


class _Writer:
    def __init__(self, model: onnx.ModelProto, ev: _Evaluator):
        self.graph = model.graph
        self.ev = ev
        self.taken = (
            {n.name for n in model.graph.node}
            | {o for n in model.graph.node for o in n.output}
            | {t.name for t in model.graph.initializer}
            | {i.name for i in model.graph.input}
        )
        self.new_initializers: list[onnx.TensorProto] = []

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def constant(self, base: str, array: np.ndarray) -> str:
        name = self.fresh(base)
        self.new_initializers.append(numpy_helper.from_array(array, name))
        return name

    def materialise(self, node: onnx.NodeProto, value: Value, dtype: int) -> list[onnx.NodeProto] | None:
        """Nodes that compute `value` (1-D, some dims symbolic) from the tensors its dims come from."""
        if value[0]:
            return None
        base = f"{node.name}/folded"
        parts: list[str] = []
        nodes: list[onnx.NodeProto] = []
        run: list[int] = []

        def flush() -> None:
            if run:
                parts.append(self.constant(f"{base}_const", np.array(run, dtype=np.int64)))
                run.clear()

        for e in value[1]:
            if not isinstance(e, Sym):
                run.append(int(e))
                continue
            flush()
            tensor, axis = self.ev.origin[e.key]
            shape_out, dim_out, part = (self.fresh(f"{base}_{k}") for k in ("shape", "dim", "part"))
            index = self.constant(f"{base}_axis", np.array(axis, dtype=np.int64))
            axes = self.constant(f"{base}_axes", np.array([0], dtype=np.int64))
            nodes += [
                helper.make_node("Shape", [tensor], [shape_out], name=self.fresh(f"{base}/Shape")),
                helper.make_node("Gather", [shape_out, index], [dim_out], name=self.fresh(f"{base}/Gather")),
                helper.make_node("Unsqueeze", [dim_out, axes], [part], name=self.fresh(f"{base}/Unsqueeze")),
            ]
            parts.append(part)
        flush()
        concat_out = node.output[0] if dtype == onnx.TensorProto.INT64 else self.fresh(f"{base}_i64")
        nodes.append(
            helper.make_node("Concat", parts, [concat_out], axis=0, name=self.fresh(f"{base}/Concat"))
        )
        if concat_out != node.output[0]:
            nodes.append(
                helper.make_node(
                    "Cast", [concat_out], [node.output[0]], to=dtype, name=self.fresh(f"{base}/Cast")
                )
            )
        return nodes


_NUMPY = {
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.BOOL: np.bool_,
}


def fold_shape_computations(model: onnx.ModelProto) -> int:
    """Fold `model`'s known shape computations in place (nodes in topological order, shapes inferred);
    returns how many nodes were replaced."""
    graph = model.graph
    if (default_opset(model) or 0) < 13:  # Unsqueeze takes its axes as an input from 13 on
        return 0
    ev = _Evaluator(model)
    writer = _Writer(model, ev)
    outputs = {o.name for o in graph.output}
    new_nodes: list[onnx.NodeProto] = []
    folded = 0
    for node in graph.node:
        filled = _static_fill(ev, node)
        if filled is not None and node.output[0] not in outputs:
            tensor = numpy_helper.from_array(filled, node.output[0])
            writer.new_initializers.append(tensor)
            ev.add_initializer(tensor)
            folded += 1
            continue
        value = ev.run(node)
        if value is None:
            new_nodes.append(node)
            continue
        ev.values[node.output[0]] = value
        dtype = ev.types.get(node.output[0])
        if not _known(value) or node.output[0] in outputs or dtype not in _NUMPY:
            new_nodes.append(node)
            continue
        if all(not isinstance(e, Sym) for e in value[1]):
            array = np.array(value[1], dtype=_NUMPY[dtype]).reshape(() if value[0] else (-1,))
            writer.new_initializers.append(numpy_helper.from_array(array, node.output[0]))
            folded += 1
            continue
        replacement = None if node.op_type in _SHAPE_CHAIN else writer.materialise(node, value, dtype)
        if replacement is None:
            new_nodes.append(node)
        else:
            new_nodes += replacement
            folded += 1
    if not folded:
        return 0
    used = {o.name for o in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(new_nodes):  # drop what no longer feeds anything
        if any(o in used for o in node.output) or not node.output:
            kept.append(node)
            used.update(i for i in node.input if i)
            used |= implicit_inputs(node)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    declared = {i.name for i in graph.input}
    initializers = [
        t for t in [*graph.initializer, *writer.new_initializers] if t.name in used or t.name in declared
    ]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    return folded


#: largest ConstantOfShape written out as an initializer
_MAX_FILL_ELEMENTS = 4096


def _static_fill(ev: _Evaluator, node: onnx.NodeProto) -> np.ndarray | None:
    """A ConstantOfShape's output where its shape is known and small (a mask's scalar True, say)."""
    if node.op_type != "ConstantOfShape" or normalize_domain(node.domain) != "":
        return None
    shape = _ints(ev.values.get(node.input[0]))
    if shape is None or any(d < 0 for d in shape) or math.prod(shape) > _MAX_FILL_ELEMENTS:
        return None
    fill = _attr(node, "value")
    value = numpy_helper.to_array(fill).reshape(-1)[0] if fill is not None else np.float32(0)
    return np.full(shape, value, dtype=value.dtype)
