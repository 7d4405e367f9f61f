"""What every default CPU rule shares: the rule base class, the driver pass, small loop helpers.

A rule is a `tvm.s_tir.dlight` `ScheduleRule` whose `schedule` either returns a
`Schedule` or None (does not fit). `CpuRule.apply` turns any scheduling error
into None, so a rule can never make a build fail: the function keeps TVM's
default (or the next rule's schedule).
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Sequence
from functools import lru_cache

import tvm
from tvm import ir, s_tir, sym, tirx
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr, normalize_prim_func
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target
from tvm.target.codegen import target_has_features

from ..strict import own_failure, own_pass, raised_by_us

__all__ = [
    "CpuRule",
    "KernelStart",
    "ApplySchedules",
    "schedule_with_rules",
    "RULE_ATTR",
    "vector_lanes",
    "vector_registers",
    "has_feature",
    "dividing_lanes",
    "extent_of",
    "uses_div_mod",
    "division_run",
    "split_iterator",
    "div_mod_of",
    "parallel_vectorize",
    "parallel_outer",
    "parallel",
    "kernel_work",
    "MIN_PARALLEL_WORK",
]

log = logging.getLogger(__name__)

#: PrimFunc attribute naming the rule that scheduled it (tests and debugging read it).
RULE_ATTR = "nxrt.schedule_rule"


class CpuRule(ScheduleRule):
    """A default CPU schedule rule; subclasses implement `schedule(sch, blocks, target)`.

    `blocks` are the normalised `SBlockInfo`s of the function (dlight's
    `normalize_prim_func`); `schedule` returns `sch` scheduled, or None when the
    rule does not fit. A TVM schedule primitive that refuses also means "does not fit";
    an exception raised by the rule's own code is a bug (`lower.strict`).
    """

    name = "rule"

    def schedule(self, sch: s_tir.Schedule, blocks: list, target: Target) -> s_tir.Schedule | None:
        raise NotImplementedError

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        return self.apply_to(KernelStart(func), target)

    def apply_to(self, start: KernelStart, target: Target) -> s_tir.Schedule | None:
        """`apply`, from a kernel's shared starting point (`schedule_with_rules` tries rule after rule)."""
        if target.kind.name != "llvm":
            return None
        token = _SERIAL.set(start.serial)
        try:
            fresh = start.fresh()
            if fresh is None:
                return None
            return self.schedule(*fresh, target)
        except Exception as exc:  # noqa: BLE001 - TVM refusing a primitive means "does not fit"
            if raised_by_us(exc):  # our own code failed: a bug in the rule (raises in strict mode)
                own_failure(f"schedule rule {self.name!r} on kernel {_kernel_name(start.func)}", exc)
            else:
                log.debug(
                    "schedule rule %s does not fit a function: %s",
                    self.name,
                    str(exc).splitlines()[0] if str(exc) else exc,
                )
            return None
        finally:
            _SERIAL.reset(token)


class KernelStart:
    """A kernel's schedule after dlight's normalisation, made once and copied for each rule that tries it:
    making and normalising it was 60% of the schedule phase (YOLOv8n: 6.3 of 10.2 s, 725 rule tries
    over 142 kernels). A copy keeps the state, the trace and every random variable of the original, so
    each rule starts where a fresh schedule would."""

    def __init__(self, func: tirx.PrimFunc):
        self.func = func
        self._start: tuple[s_tir.Schedule, list] | None = None
        self._made = False
        work = kernel_work(func)
        #: too little work to pay for a parallel launch: every rule leaves it on one thread (`parallel`)
        self.serial = work is not None and work < MIN_PARALLEL_WORK

    def fresh(self) -> tuple[s_tir.Schedule, list] | None:
        """A schedule of its own for one rule, and the normalised blocks (None: dlight cannot normalise
        the function). The block infos are shared: rules read them, never change them."""
        if not self._made:
            self._made = True
            sch = s_tir.Schedule(self.func)
            blocks = normalize_prim_func(sch)
            self._start = (sch, blocks) if blocks else None
        if self._start is None:
            return None
        sch, blocks = self._start
        return sch.copy(), blocks


#: the kernel `ApplySchedules` is scheduling, for bug reports (rules see only the PrimFunc)
_KERNEL: contextvars.ContextVar[str] = contextvars.ContextVar("nxrt_kernel", default="")


def _kernel_name(func: tirx.PrimFunc) -> str:
    symbol = _KERNEL.get() or (func.attrs.get("global_symbol") if func.attrs is not None else None)
    return repr(str(symbol)) if symbol else "(unnamed)"


def _is_scheduled(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))


def schedule_with_rules(
    func: tirx.PrimFunc, target: Target, rules: Sequence[CpuRule]
) -> tuple[str, s_tir.Schedule] | None:
    """(rule name, schedule) of the first rule that fits `func`, or None.

    The schedule is traced, so tuning can measure it and keep it as a candidate record.
    """
    start = KernelStart(func)
    for rule in rules:
        sch = rule.apply_to(start, target)
        if sch is not None:
            return rule.name, sch
    return None


#: Element operations (stores times the loops around them) below which a kernel runs on one thread. A
#: parallel loop costs about 0.6 us to launch with the workers spinning, and more between kernels that
#: hand each other data across cores: BERT-tiny at batch 3 x 12 tokens ran 74 us with every kernel
#: parallel, 61 us with this threshold (1 << 15 to 1 << 18 measured alike).
MIN_PARALLEL_WORK = 1 << 16

#: whether the kernel being scheduled runs on one thread (`parallel` then leaves loops serial)
_SERIAL: contextvars.ContextVar[bool] = contextvars.ContextVar("nxrt_serial", default=False)


def parallel(sch: s_tir.Schedule, loop) -> None:
    """Run `loop` on the thread pool, unless the kernel is too small to pay for the launch."""
    if not _SERIAL.get():
        sch.parallel(loop)


def kernel_work(func: tirx.PrimFunc) -> int | None:
    """Element operations of an unscheduled kernel: each store counted once per iteration of the loops
    around it, a reduction's init not at all (None when a loop's extent is symbolic)."""
    total = 0
    stack: list[tuple[object, int]] = [(func.body, 1)]
    while stack:
        node, times = stack.pop()
        if isinstance(node, tirx.BufferStore):
            total += times
            continue
        if isinstance(node, tirx.For):
            if not isinstance(node.extent, tirx.IntImm):
                return None
            stack.append((node.body, times * int(node.extent.value)))
            continue
        if isinstance(node, tirx.SeqStmt):
            stack.extend((child, times) for child in node.seq)
            continue
        for field in ("block", "body", "then_case", "else_case"):
            child = getattr(node, field, None)
            if isinstance(child, tirx.Stmt):
                stack.append((child, times))
    return total


@tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.ApplyCpuSchedules")
class ApplySchedules:
    """Schedule every unscheduled PrimFunc with the first rule that fits; tag it with the rule's name.

    Functions already scheduled (e.g. by MetaSchedule records) are left alone.
    """

    def __init__(self, rules: Sequence[CpuRule]):
        self.rules = list(rules)

    @own_pass
    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = Target.current(allow_none=True)
        updates = {}
        for gvar, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or _is_scheduled(func):
                continue
            func_target = func.attrs.get("target") if func.attrs is not None else None
            func_target = func_target or target
            if func_target is None:
                continue
            token = _KERNEL.set(gvar.name_hint)
            try:
                found = schedule_with_rules(func, func_target, self.rules)
            finally:
                _KERNEL.reset(token)
            if found is not None:
                rule, sch = found
                updates[gvar] = (
                    sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr(RULE_ATTR, rule)
                )
        for gvar, func in updates.items():
            mod[gvar] = func
        return mod


#: x86 vector registers by ISA feature, widest first
_X86_VECTORS = (("avx512f", 512), ("avx", 256))


def vector_bits(target: Target) -> int:
    """Width of the target CPU's widest vector register, read from its ISA features. LLVM's own
    answer (`llvm_get_vector_width`) is 512 for every x86 CPU in TVM 0.27, znver3 and haswell
    included: AVX2 hosts got tiles of 16-lane vectors, each split in two, twice the registers they
    have, and spilled (the bundled model ran slower than onnxruntime on a Zen 3)."""
    return _vector_bits(str(target))


@lru_cache(maxsize=None)
def _vector_bits(target_json: str) -> int:
    """`vector_bits` by the target's JSON text (targets hash by identity)."""
    target = Target(target_json)
    if _x86(target):
        return next((bits for feature, bits in _X86_VECTORS if _has_feature(target_json, feature)), 128)
    return 128  # NEON (AArch64), and what any other CPU target has at least


def has_feature(target: Target, feature: str) -> bool:
    """Whether the LLVM target `target` has the ISA `feature` (``"avx512vnni"``)."""
    return target.kind.name == "llvm" and _has_feature(str(target), feature)


@lru_cache(maxsize=None)
def _has_feature(target_json: str, feature: str) -> bool:
    """`has_feature` by the target's JSON text (targets hash by identity): each LLVM feature query costs
    ~0.2 ms, and every rule asks for every kernel."""
    return bool(target_has_features(feature, Target(target_json)))


def _x86(target: Target) -> bool:
    """Whether `target` is an x86 CPU: its triple, else the host's."""
    triple = str(target.attrs.get("mtriple", "")) or str(tvm.target.codegen.llvm_get_system_triple())
    return "x86" in triple


def vector_registers(target: Target) -> int:
    """Vector registers the target CPU has: 32 with AVX-512 and on AArch64, 16 on other x86."""
    return 16 if _x86(target) and vector_bits(target) < 512 else 32


def vector_lanes(target: Target, dtype_bits: int = 32) -> int:
    """Lanes of the target's widest vector register for `dtype_bits` (16 fp32 lanes with AVX-512)."""
    return max(vector_bits(target) // dtype_bits, 1)


def dividing_lanes(extent: int, lanes: int, least: int = 4) -> int | None:
    """The widest vector that divides `extent`: a whole one, else a half or a quarter one of `least`
    lanes or more. AVX-512's 16 fp32 lanes divide fewer extents than AVX2's 8 (a 24-wide row, 40
    elements): a half vector keeps them vectorised where a whole one would leave them scalar."""
    return next((t for t in (lanes, lanes // 2, lanes // 4) if t >= least and extent % t == 0), None)


def extent_of(sch: s_tir.Schedule, loop) -> int | None:
    """A loop's constant extent, or None when it is symbolic."""
    extent = sch.get(loop).extent
    return int(extent.value) if isinstance(extent, tirx.IntImm) else None


#: parallel loops shorter than this are fused with the next one
_MIN_PARALLEL = 64


def parallel_vectorize(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Run an injective block's leading loops in parallel and vectorise its innermost loop.

    Loops are never all fused into one (broadcasts would turn into div/mod
    gathers) and an innermost axis read through div/mod stays scalar, unless it reads whole vectors
    between the divisions (`contiguous_segment`): it is then split there and vectorised within.
    """
    loops = sch.get_loops(block)
    if not loops:
        return
    stmt = sch.get(block)
    inner_var_index = len(stmt.iter_vars) - 1
    whole = len(loops) == len(stmt.iter_vars)
    gathers = whole and uses_div_mod(sch, block, inner_var_index)
    segment = contiguous_segment(sch, block, inner_var_index, lanes) if gathers else None
    vectorise = whole and (not gathers or segment is not None)
    inner = loops[-1]
    if segment is not None:  # whole segments: the division is by the outer part only, the lanes read plainly
        outer_part, inner = sch.split(inner, factors=[None, segment])
        loops = [*loops[:-1], outer_part, inner]
        lanes = dividing_lanes(segment, lanes)  # whole vectors within the segment
    if vectorise:
        extent = extent_of(sch, inner)
        if extent is None or extent > lanes:
            outer_part, inner = sch.split(inner, factors=[None, lanes])
            loops = [*loops[:-1], outer_part]
        else:
            loops = loops[:-1]
        sch.vectorize(inner)
    else:
        loops = loops[:-1]
    parallel_outer(sch, loops)


def parallel_outer(sch: s_tir.Schedule, loops: Sequence) -> None:
    """Fuse leading `loops` until there is enough work per
    thread (not all of them), and run that loop in parallel."""
    lead, work, symbolic = [], 1, False
    for loop in loops:
        extent = extent_of(sch, loop)
        if extent is None:
            if symbolic:  # a second symbolic loop ends the fused one
                break
            if lead:
                # Not fused with the static loops before it: TVM 0.27's index analysis fails a build on
                # a fused `4 * (2h - 1)` loop read through `% (2h - 1) // 2` (a symbolic ConvTranspose's
                # dilated input), a failed check rather than a schedule error. It runs in parallel alone.
                lead = [loop]
                break
            # a leading symbolic loop (a batch) is fused with the static loops after it: alone, a batch
            # of 1 ran the whole loop nest on one thread
            lead, symbolic = [loop], True
            continue
        lead.append(loop)
        work *= extent
        if work >= _MIN_PARALLEL:
            break
    if lead:
        parallel(sch, sch.fuse(*lead) if len(lead) > 1 else lead[0])


#: a producer is copied into a consumer that reads it more than once only while it is this small
INLINE_COPY_NODES = 24


def _children(expr) -> list:
    children = [
        getattr(expr, name)
        for name in ("a", "b", "value", "condition", "true_value", "false_value")
        if hasattr(expr, name)
    ]
    children += list(getattr(expr, "args", ()))
    return [c for c in children if isinstance(c, tvm.ir.expr.Expr)]


#: consumer expressions larger than this are not searched for reads (nor copied into)
_SCAN_LIMIT = 4096


def _scan(value, source, limit: int) -> tuple[int, int]:
    """(nodes of `value`, up to limit + 1; its loads of `source`): stops at the limit, so an expression that
    shares subtrees costs no more than that to look at."""
    nodes, loads, stack = 0, 0, [value]
    while stack and nodes <= limit:
        expr = stack.pop()
        nodes += 1
        if isinstance(expr, tvm.ir.TensorLoad) and expr.source.same_as(source):
            loads += 1
        stack.extend(_children(expr))
    return nodes, loads


def inline(sch: s_tir.Schedule, block) -> None:
    """`compute_inline` the block, unless that copies a costly expression into a consumer that reads it
    more than once; otherwise (or where it cannot be inlined at all) it keeps its own loops.

    Inlining substitutes the producer's expression for each read: fast tanh/erf polynomials read their
    input several times, so a chain of them (Tanh -> Mul -> Tanh ...) grew exponentially, and a fused
    chain of four took 196 s to compile (eight never finished).
    """
    stmt = sch.get(block)
    if len(stmt.writes) != 1 or not isinstance(stmt.body, tirx.BufferStore):
        return
    nodes, _ = _scan(stmt.body.value, None, INLINE_COPY_NODES)
    if nodes > INLINE_COPY_NODES:
        for consumer in sch.get_consumers(block):
            body = sch.get(consumer).body
            if not isinstance(body, tirx.BufferStore):
                return
            size, loads = _scan(body.value, stmt.writes[0].source, _SCAN_LIMIT)
            if loads > 1 or size > _SCAN_LIMIT:
                return
    try:
        sch.compute_inline(block)
    except s_tir.ScheduleError:
        pass  # e.g. a block with two consumers that cannot be recomputed: it keeps its loops


def uses_div_mod(sch: s_tir.Schedule, block, var_index: int) -> bool:
    """Whether a read of `block` indexes through a division or modulo of its `var_index`-th iterator.

    Such gathers (Tile, Reshape of broadcasts) are kept scalar: TVM 0.27's LLVM
    AVX-512 codegen has been seen to miscompile them once vectorised.
    """
    stmt = sch.get(block)
    var = stmt.iter_vars[var_index].var
    return any(div_mod_of(rng.min, var) for region in stmt.reads for rng in region.region)


_DIV_MOD = (tirx.FloorDiv, tirx.FloorMod, tirx.Div, tirx.Mod)


def contiguous_segment(sch: s_tir.Schedule, block, var_index: int, lanes: int) -> int | None:
    """The length of the runs in which a div/mod-indexed iterator reads its operands plainly, where
    they are whole vectors: a reshape fused with a transpose, ``out[s, c] = in[c // 32, s, c % 32]``
    (attention heads merged back), reads 32-element runs; split by 32, the inner loop's index is
    ``in[o, s, i]``, a vector load, where the whole loop read one scalar at a time through div/mod
    (ViT's head merge: 12 us for 25K elements). None where no such run divides the loop."""
    stmt = sch.get(block)
    var = stmt.iter_vars[var_index].var
    extent = stmt.iter_vars[var_index].dom.extent
    indices = [rng.min for region in stmt.reads for rng in region.region]
    run = division_run(indices, var)
    if (
        not isinstance(extent, tirx.IntImm)
        or not run
        or int(extent.value) % run
        or not dividing_lanes(run, lanes)
    ):
        return None
    analyzer = sym.Analyzer()
    _, lane = split_iterator(analyzer, var, int(extent.value), run)
    if any(div_mod_of(analyzer.simplify(index), lane) for index in indices):
        return None
    return run


def split_iterator(analyzer: sym.Analyzer, var, extent: int, run: int) -> tuple[tirx.Var, tirx.Var]:
    """Bind `var` in `analyzer` as ``high * run + low`` (its simplify then substitutes it), the pieces
    bound to their ranges; returns (high, low)."""
    high, low = tirx.Var("high", var.ty), tirx.Var("low", var.ty)
    analyzer.bind(high, ir.Range(0, extent // run))
    analyzer.bind(low, ir.Range(0, run))
    analyzer.bind(var, high * run + low)
    return high, low


def division_run(indices: Sequence, var) -> int:
    """The least common multiple of the constants that `indices` divide `var` (or a sum with it) by:
    the length of the runs over which `var` reads plainly; 0 where none divides it. Only the innermost
    divisions count: ``(v % 4 * 34 + v // 4) // 34`` (a shuffle, then a reshape) runs in 4s."""
    divisors = {
        int(node.b.value)
        for index in indices
        for node in _div_mods(index)
        if isinstance(node.b, tirx.IntImm) and _mentions(node.a, var) and not _div_mods(node.a)
    }
    return math.lcm(*divisors) if divisors else 0


def _mentions(expr, var) -> bool:
    return any(v.same_as(var) for v in collect_vars_used_in_prim_expr(expr))


def _div_mods(expr) -> list:
    """The divisions and modulos in `expr`, outermost first."""
    found = [expr] if isinstance(expr, _DIV_MOD) else []
    for child in _children(expr):
        found.extend(_div_mods(child))
    return found


def div_mod_of(expr, var) -> bool:
    """Whether `expr` holds a division or modulo whose operands mention `var`."""
    return any(_mentions(node, var) for node in _div_mods(expr))
