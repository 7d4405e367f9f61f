"""The recurrence of ONNX's LSTM and GRU as one scheduled TIR kernel: every time step in one call.

Relax has no recurrent op, and a step written as Relax ops is two kernels (the matmul, then the gates,
which read it at four strides and so do not fuse with it): a bidirectional two-layer LSTM over 64
tokens would be 512 kernel calls, each a few microseconds of call overhead against ~2 us of work.
So the importer (`frontend`) computes every step's input projection as one matmul and hands the
sequential part to this kernel: per direction (directions run in parallel), per step, the state's
product with the recurrent weights (`Ht-1 R^T`, `W` columns at a time in vector accumulators) and the
gate update, on the ONNX equations with their default activations. Sigmoid and tanh use TOPI's
`fast_exp` polynomial (LLVM lowers a vector `exp` to one libm call per lane).

Written as scheduled (`tirx.is_scheduled`; its variant reads ``default:Recurrence``), opaque to fusion.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import tvm
from tvm import tirx

__all__ = ["Recurrence", "recurrence_kernel"]

#: ONNX's `direction` attribute -> number of directions
_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}

#: the widest accumulator of the recurrent product: 128 floats, 8 AVX-512 registers (16 AVX2 ones) of
#: independent FMA chains
_TILE = 128


@dataclass(frozen=True)
class Recurrence:
    """What the kernel computes: the cell, its direction, its hidden size, and (GRU) where the reset
    gate applies."""

    cell: str  #: "LSTM" or "GRU"
    direction: str  #: "forward", "reverse" or "bidirectional"
    hidden: int
    linear_before_reset: bool = False  #: GRU only

    @property
    def directions(self) -> int:
        return _DIRECTIONS[self.direction]

    @property
    def gates(self) -> int:
        """Gates per hidden unit: LSTM's i, o, f, c; GRU's z, r, h."""
        return 4 if self.cell == "LSTM" else 3


def _f32(value: float) -> str:
    return f"T.float32({value!r})"


def _fast_exp(x: str) -> str:
    """TOPI's `fast_exp_float32` as TVMScript: clamp, split into 2^n and a degree-7 polynomial of the
    rest (~1e-7 relative)."""
    clamped = f"T.max(T.min({x}, {_f32(88.3762626647950)}), {_f32(-88.3762626647949)})"
    n = f"T.floor({clamped} * {_f32(1.44269504088896341)} + {_f32(0.5)})"
    f = f"({clamped} - {n} * {_f32(0.6931471805599453)})"
    poly = _f32(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        poly = f"({poly} * {f} + {_f32(c)})"
    y = f"({poly} * {f} * {f} + {f} + {_f32(1.0)})"
    scale = f'T.reinterpret("float32", T.shift_left(T.Cast("int32", {n} + {_f32(127.0)}), 23))'
    return f"({scale} * {y})"


def _sigmoid(x: str) -> str:
    return f"({_f32(1.0)} / ({_f32(1.0)} + {_fast_exp(f'({_f32(0.0)} - {x})')}))"


def _tanh(x: str) -> str:
    return f"({_f32(2.0)} / ({_f32(1.0)} + {_fast_exp(f'({_f32(-2.0)} * {x})')}) - {_f32(1.0)})"


def _widest(candidates: tuple[int, ...], width: int) -> int:
    return next(w for w in candidates if width % w == 0)


def _runs(width: int) -> list[tuple[int, int, int]]:
    """`width` columns as runs of equal power-of-two tiles, widest first: (start, tile, count). LLVM
    splits a vector of another length badly: a 96-wide accumulator ran an LSTM of 96 units 3x slower
    than 64 + 32 on a Zen 3."""
    runs, start = [], 0
    while start < width:
        tile = min(_TILE, 1 << ((width - start).bit_length() - 1))
        count = (width - start) // tile
        runs.append((start, tile, count))
        start += tile * count
    return runs


def _product(r: Recurrence, offset: int, width: int, source: str) -> list[str]:
    """``gates[offset:offset + width] = source @ RT[d, :, offset:offset + width]``: `w` output columns
    at a time, each kept in a vector accumulator while the hidden units are summed."""
    lines = []
    for start, w, count in _runs(width):
        cols = f"{offset + start} + jt * {w} + jj"
        lines += [
            f"for jt in range({count}):",
            f'    acc = T.alloc_buffer(({w},), "float32", scope="local")',
            f"    for jj in T.vectorized({w}):",
            f"        acc[jj] = {_f32(0.0)}",
            f"    for k in range({r.hidden}):",
            f"        for jj in T.vectorized({w}):",
            f"            acc[jj] = acc[jj] + {source} * RT[d, k, {cols}]",
            f"    for jj in T.vectorized({w}):",
            f"        gates[{cols}] = acc[jj]",
        ]
    return lines


def _lstm_update(r: Recurrence, j: str) -> list[str]:
    """ONNX LSTM, gates i, o, f, c: C = f * C + i * tanh(c); H = o * tanh(C); Y[t] = H (unit `j`).
    Each gate's input is summed into `gates` first: an activation's text repeats its argument about
    20 times (`_fast_exp`), so it gets a load, not a sum."""
    h = r.hidden

    def gate(k: int) -> str:
        return f"gates[{k * h} + {j}]"

    return [
        *(f"{gate(k)} = G[tt, n, d, {k * h} + {j}] + {gate(k)}" for k in range(4)),
        f"YC[d, n, {j}] = {_sigmoid(gate(2))} * YC[d, n, {j}] + {_sigmoid(gate(0))} * {_tanh(gate(3))}",
        f"YH[d, n, {j}] = {_sigmoid(gate(1))} * {_tanh(f'YC[d, n, {j}]')}",
        f"Y[tt, d, n, {j}] = YH[d, n, {j}]",
    ]


def _gru_update(r: Recurrence, j: str) -> list[str]:
    """ONNX GRU, gates z, r, h: H = (1 - z) * hh + z * H, with hh = tanh(x_h + r * (H R_h + Rb_h))
    (linear_before_reset) or tanh(x_h + (r * H) R_h) (its R_h product made after the reset gate). The
    gates are stored before use, as in `_lstm_update` (the reset gate inside hh's tanh made its text
    77 KB)."""
    h = r.hidden
    z, reset, x_h = f"gates[{j}]", f"gates[{h} + {j}]", f"G[tt, n, d, {2 * h} + {j}]"
    lines = [f"{z} = {_sigmoid(f'(G[tt, n, d, {j}] + {z})')}"]
    if r.linear_before_reset:
        lines.append(f"{reset} = {_sigmoid(f'(G[tt, n, d, {h} + {j}] + {reset})')}")
        lines.append(f"gates[{2 * h} + {j}] = {x_h} + {reset} * (gates[{2 * h} + {j}] + RBH[d, {j}])")
    else:
        lines.append(f"gates[{2 * h} + {j}] = {x_h} + gates[{2 * h} + {j}]")
    candidate = _tanh(f"gates[{2 * h} + {j}]")
    return [
        *lines,
        f"YH[d, n, {j}] = ({_f32(1.0)} - {z}) * {candidate} + {z} * YH[d, n, {j}]",
        f"Y[tt, d, n, {j}] = YH[d, n, {j}]",
    ]


def _units(r: Recurrence, body: list[str]) -> list[str]:
    """`body` (statements on unit `$j`) over every hidden unit, `v` lanes at a time. No `let` in the
    vector loop: TVM 0.27's vectoriser stored a let-bound vector value as one lane broadcast."""
    v = _widest((16, 8, 4, 2, 1), r.hidden)
    unit = f"(ko * {v} + kv)"
    return [
        f"for ko in range({r.hidden // v}):",
        f"    for kv in T.vectorized({v}):",
        *("        " + line.replace("$j", unit) for line in body),
    ]


def _source(r: Recurrence) -> str:
    """The kernel as TVMScript. An `s_tir` function: copied for its constant weights by TVM 0.27's
    `AttachAttrLayoutFreeBuffers`, a plain TIR function's buffers kept their symbolic sizes' old
    variables in their layouts ("variables (S, N) are used, but are not passed in as API arguments")."""
    d, h, width = r.directions, r.hidden, r.gates * r.hidden
    reverse = {"forward": "False", "reverse": "True", "bidirectional": "d == 1"}[r.direction]
    lstm = r.cell == "LSTM"
    params = ["g: T.handle", "rt: T.handle", "h0: T.handle"]
    params += ["c0: T.handle"] if lstm else (["rbh: T.handle"] if r.linear_before_reset else [])
    params += ["y: T.handle", "yh: T.handle"] + (["yc: T.handle"] if lstm else [])
    buffers = [
        f'G = T.match_buffer(g, (S, N, {d}, {width}), "float32")',
        f'RT = T.match_buffer(rt, ({d}, {h}, {width}), "float32")',
        f'H0 = T.match_buffer(h0, ({d}, N, {h}), "float32")',
    ]
    if lstm:
        buffers.append(f'C0 = T.match_buffer(c0, ({d}, N, {h}), "float32")')
    elif r.linear_before_reset:
        buffers.append(f'RBH = T.match_buffer(rbh, ({d}, {h}), "float32")')
    buffers += [
        f'Y = T.match_buffer(y, (S, {d}, N, {h}), "float32")',
        f'YH = T.match_buffer(yh, ({d}, N, {h}), "float32")',
    ]
    if lstm:
        buffers.append(f'YC = T.match_buffer(yc, ({d}, N, {h}), "float32")')
    init = ["YH[d, n, $j] = H0[d, n, $j]"] + (["YC[d, n, $j] = C0[d, n, $j]"] if lstm else [])
    if lstm or r.linear_before_reset:
        step = _product(r, 0, width, "YH[d, n, k]")
    else:  # z and r from H; h from r * H, once r is known
        reset = _sigmoid(f"(G[tt, n, d, {h} + $j] + gates[{h} + $j])")
        step = [
            *_product(r, 0, 2 * h, "YH[d, n, k]"),
            *_units(r, [f"rh[$j] = {reset} * YH[d, n, $j]"]),
            *_product(r, 2 * h, h, "rh[k]"),
        ]
    step += _units(r, _lstm_update(r, "$j") if lstm else _gru_update(r, "$j"))
    lines = [
        "@T.prim_func(private=True, s_tir=True)",
        f"def recurrence({', '.join(params)}):",
        '    T.func_attr({"tirx.noalias": True, "op_pattern": 8, "tirx.is_scheduled": True,'
        ' "nxrt.schedule_rule": "Recurrence"})',
        "    S = T.int64()",
        "    N = T.int64()",
        *("    " + b for b in buffers),
        f"    for d in T.parallel({d}):",
        f'        gates = T.alloc_buffer(({width},), "float32")',
        *([f'        rh = T.alloc_buffer(({h},), "float32")'] if "rh[" in "".join(step) else []),
        "        for n in range(N):",
        *("            " + line for line in _units(r, init)),
        "        for t in range(S):",
        "            for n in range(N):",
        f"                tt = T.if_then_else({reverse}, S - T.int64(1) - t, t)",
        *("                " + line for line in step),
    ]
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=64)
def recurrence_kernel(r: Recurrence) -> tirx.PrimFunc:
    """The kernel: inputs ``G [S, N, D, gates * H]`` (every step's input projection plus the biases
    that add to it), ``RT [D, H, gates * H]`` (R transposed), ``H0 [D, N, H]``, then LSTM's ``C0`` or
    a linear-before-reset GRU's ``Rb_h [D, H]``; outputs ``Y [S, D, N, H]``, ``Y_h`` and (LSTM) ``Y_c``
    ``[D, N, H]``."""
    return tvm.script.from_source(_source(r))
