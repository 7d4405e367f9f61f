#!/usr/bin/env python
"""Probe which ONNX nodes the TVM EP may honestly claim, using onnx's backend node test cases.

Every case (`onnx.backend.test.case.node.collect_testcases()`) goes through:

  1. the claim loop's generic checks, re-implemented here simply (default domain,
     op in the Relax frontend's convert map, opset >= the converter's oldest
     `_impl_vN`, known element types from a supported set and known ranks, no
     graph attributes);
  2. the op rules in `nxrt_tvm.partition.tvm_rules.TVM_OP_RULES`;
  3. `from_onnx` -> `tvm.compile(..., relax_pipeline=get_default_pipeline)` ->
     `relax.VirtualMachine` -> comparison with the case's expected outputs
     (rtol 1e-3, atol 1e-4 for floats; integers and bools exact; dtype and shape
     must match).

A case is claimed when every node of its model is claimed. The report counts
claimed&pass, claimed&fail (the bugs: each one needs a rule) and declined.

TVM can abort the process, so each of the 2 workers is a forked process fed
one case at a time; a worker that dies or overruns the per-case timeout is
replaced and the case recorded as crash/timeout. Results go to /tmp only.

    python tools/probe_frontend.py                    # all cases
    python tools/probe_frontend.py -k 'reshape|tile'  # a subset (regex on case name)
    python tools/probe_frontend.py --extra-dtypes uint16,uint32,uint64,bfloat16
    python tools/probe_frontend.py --no-rules         # generic checks only (the "before" counts)
    python tools/probe_frontend.py --const-inputs     # inputs 1.. as initializers (shapes, axes, weights)
    python tools/probe_frontend.py --symbolic         # dim 0 of input 0 symbolic ('N')
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import re
import sys
import time
import traceback
import warnings
from multiprocessing.connection import wait
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SUPPORTED_DTYPES = {"float16", "float", "double", "int8", "int16", "int32", "int64", "uint8", "bool"}
OUT_DIR = Path("/tmp/probe_frontend")

# ----------------------------------------------------------------------------------------------
# claim checks (generic, as the EP's claim loop does them, then the op rules)


def _min_impl_version(converter) -> int:
    versions = [int(n[len("_impl_v") :]) for n in dir(converter) if n.startswith("_impl_v")]
    return min(versions) if versions else 1


def claim_node(ctx, convert_map, dtypes: set[str], use_rules: bool) -> str | None:
    """None when the node is claimed, otherwise a one-line reason."""
    from nxrt_tvm.api.claim import DeclineSignal
    from nxrt_tvm.partition.tvm_rules import TVM_OP_RULES

    node = ctx.node
    if ctx.domain:
        return f"generic: domain {ctx.domain}"
    if node.op_type not in convert_map:
        return "generic: op not in convert map"
    if ctx.opset < _min_impl_version(convert_map[node.op_type]):
        return f"generic: opset {ctx.opset} < {_min_impl_version(convert_map[node.op_type])}"
    for info in [*ctx.inputs, *ctx.outputs]:
        if info is None:
            continue
        if info.elem_type is None:
            return f"generic: unknown type of {info.name}"
        name = onnx.TensorProto.DataType.Name(info.elem_type).lower()
        if name not in dtypes:
            return f"generic: dtype {name}"
        if info.shape is None:
            return f"generic: unknown rank of {info.name}"
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return "generic: graph attribute"
    if not use_rules:
        return None
    rule = TVM_OP_RULES.lookup(ctx.domain, node.op_type, ctx.opset)
    if rule is None:
        return None
    try:
        rule(ctx)
    except DeclineSignal as sig:
        return f"rule: {sig.rejected.value}: {sig.detail}"
    except Exception as exc:  # a bug in a rule: surface it
        return f"RULE-ERROR: {type(exc).__name__}: {exc}"
    return None


# ----------------------------------------------------------------------------------------------
# worker side


_TVM = None


def _tvm():
    global _TVM
    if _TVM is None:
        import tvm
        from tvm import relax
        from tvm.relax.frontend.onnx import from_onnx
        from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

        target = tvm.target.Target(
            {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(), "num-cores": 2}
        )
        _TVM = (tvm, relax, from_onnx, _get_convert_map(), target)
    return _TVM


def _compare(got, want) -> str | None:
    want = np.asarray(want)
    got = np.asarray(got)
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != expected {want.dtype}"
    if got.shape != want.shape:
        return f"shape {got.shape} != expected {want.shape}"
    if want.dtype.kind in "fc":
        if not np.allclose(got, want, rtol=1e-3, atol=1e-4, equal_nan=True):
            err = np.nanmax(np.abs(got.astype(np.float64) - want.astype(np.float64))) if got.size else 0
            return f"values differ (max abs err {err:.3g})"
    elif not np.array_equal(got, want):
        return f"values differ ({int(np.sum(got != want))} of {got.size} elements)"
    return None


def variant(case, const_inputs: bool, symbolic: bool):
    """The case's model and data sets, with inputs 1.. turned into initializers and/or dim 0 made symbolic."""
    model, data_sets = case.model, list(case.data_sets)
    if not (const_inputs or symbolic):
        return model, data_sets
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    if const_inputs and len(graph.input) > 1:
        first = data_sets[0][0]
        if any(not isinstance(x, (np.ndarray, np.generic)) for x in first):
            return model, data_sets
        names = [i.name for i in graph.input]
        keep = [graph.input[0]]
        for name, value in zip(names[1:], first[1:]):
            graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value), name))
        del graph.input[:]
        graph.input.extend(keep)
        data_sets = [([ins[0]], outs) for ins, outs in data_sets[:1]]
    if symbolic and graph.input:
        t = graph.input[0].type
        if t.HasField("tensor_type") and t.tensor_type.HasField("shape") and len(t.tensor_type.shape.dim):
            d = t.tensor_type.shape.dim[0]
            d.Clear()
            d.dim_param = "N"
            for o in graph.output:
                ot = o.type
                if ot.HasField("tensor_type") and ot.tensor_type.HasField("shape"):
                    for k, od in enumerate(ot.tensor_type.shape.dim):
                        od.Clear()
                        od.dim_param = f"{o.name}_d{k}"
            del graph.value_info[:]
    return model, data_sets


def run_case(
    case, dtypes: set[str], use_rules: bool, const_inputs: bool = False, symbolic: bool = False
) -> dict:
    from nxrt_tvm.graph.model import load_model
    from nxrt_tvm.partition.node_context import NodeContext

    tvm, relax, from_onnx, convert_map, target = _tvm()
    rec = {"name": case.name, "ops": sorted({n.op_type for n in case.model.graph.node})}
    try:
        model, data_sets = variant(case, const_inputs, symbolic)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gv = load_model(model)
    except Exception as exc:
        rec.update(status="declined", reason=f"load: {str(exc)[:200]}")
        return rec
    for i in range(len(gv.nodes)):
        reason = claim_node(NodeContext(gv, i), convert_map, dtypes, use_rules)
        if reason is not None:
            rec.update(status="declined", reason=reason, node_op=gv.nodes[i].op_type)
            return rec
    if not gv.nodes:
        rec.update(status="declined", reason="no nodes left after constant folding")
        return rec
    for inputs, _ in data_sets:
        if any(not isinstance(x, (np.ndarray, np.generic)) for x in inputs):
            rec.update(status="declined", reason="non-tensor input data")
            return rec
    stage = "import"
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = from_onnx(gv.model)
            stage = "compile"
            ex = tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target))
        stage = "run"
        vm = relax.VirtualMachine(ex, tvm.cpu())
        real_inputs = [i.name for i in gv.model.graph.input if i.name not in gv.initializers]
        for inputs, outputs in data_sets:
            feed = dict(zip([i.name for i in model.graph.input], inputs))
            args = [tvm.runtime.tensor(np.array(feed[n], order="C")) for n in real_inputs]
            stage = "run"
            res = vm["main"](*args)
            got = [res] if len(outputs) == 1 else list(res)
            stage = "compare"
            if len(got) != len(outputs):
                raise AssertionError(f"{len(got)} outputs, expected {len(outputs)}")
            for k, (g, w) in enumerate(zip(got, outputs)):
                # a Shape-valued output comes back as a runtime Shape, not a tensor
                value = g.numpy() if hasattr(g, "numpy") else np.asarray(list(g), dtype=np.int64)
                msg = _compare(value, w)
                if msg:
                    raise AssertionError(f"output {k}: {msg}")
    except Exception as exc:
        text = str(exc).strip().splitlines()
        last = next((ln for ln in reversed(text) if ln.strip()), "") if text else ""
        rec.update(status="fail", stage=stage, error=f"{type(exc).__name__}: {last[:300]}")
        rec["trace"] = traceback.format_exc()[-1500:]
        return rec
    rec.update(status="pass", seconds=round(time.perf_counter() - t0, 3))
    return rec


def _worker(conn, cases, dtypes, use_rules, const_inputs, symbolic):
    from nxrt_tvm.runtime.isolate import freeze_inherited

    freeze_inherited()  # forked: the parent's objects are never finalised here
    os.environ.setdefault("TVM_NUM_THREADS", "1")
    while True:
        msg = conn.recv()
        if msg is None:
            return
        try:
            rec = run_case(cases[msg], dtypes, use_rules, const_inputs, symbolic)
        except Exception as exc:  # never let the worker die on a Python error
            rec = {"name": cases[msg].name, "status": "fail", "stage": "probe", "error": repr(exc)[:300]}
        conn.send(rec)


# ----------------------------------------------------------------------------------------------
# parent: a 2-process pool that survives aborts and hangs


class _Slot:
    def __init__(self, ctx, *args):
        self.ctx, self.args = ctx, args
        self.start()

    def start(self):
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child, *self.args), daemon=True)
        self.proc.start()
        child.close()
        self.case = None
        self.since = 0.0

    def kill(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()


def probe(
    cases, dtypes, use_rules, const_inputs=False, symbolic=False, workers=2, timeout=180.0
) -> list[dict]:
    os.environ["TVM_NUM_THREADS"] = "1"
    ctx = mp.get_context("fork")
    slots = [_Slot(ctx, cases, dtypes, use_rules, const_inputs, symbolic) for _ in range(workers)]
    todo = collections.deque(range(len(cases)))
    results: list[dict] = []
    done = 0
    while todo or any(s.case is not None for s in slots):
        for s in slots:
            if s.case is None and todo:
                s.case = todo.popleft()
                s.since = time.monotonic()
                s.conn.send(s.case)
        busy = [s for s in slots if s.case is not None]
        ready = wait([s.conn for s in busy] + [s.proc.sentinel for s in busy], timeout=5)
        for s in busy:
            rec = None
            if s.conn in ready:
                try:
                    rec = s.conn.recv()
                except EOFError:
                    rec = None
            if rec is None and (s.proc.sentinel in ready or not s.proc.is_alive()):
                rec = {
                    "name": cases[s.case].name,
                    "status": "fail",
                    "stage": "crash",
                    "error": f"worker died (exit code {s.proc.exitcode})",
                    "ops": sorted({n.op_type for n in cases[s.case].model.graph.node}),
                }
                s.kill()
                s.start()
            elif rec is None and time.monotonic() - s.since > timeout:
                rec = {
                    "name": cases[s.case].name,
                    "status": "fail",
                    "stage": "timeout",
                    "error": f"no result after {timeout:.0f} s",
                    "ops": sorted({n.op_type for n in cases[s.case].model.graph.node}),
                }
                s.kill()
                s.start()
            if rec is not None:
                results.append(rec)
                s.case = None
                done += 1
                if done % 100 == 0:
                    print(f"  {done}/{len(cases)}", file=sys.stderr, flush=True)
    for s in slots:
        try:
            s.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        s.proc.join(timeout=5)
        s.kill()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", "--select", help="regex on case names")
    ap.add_argument("--extra-dtypes", default="", help="comma-separated ONNX type names to accept too")
    ap.add_argument("--no-rules", action="store_true", help="generic checks only")
    ap.add_argument(
        "--const-inputs",
        action="store_true",
        help="turn inputs 1.. into initializers (first data set): the constant-operand path real models take",
    )
    ap.add_argument("--symbolic", action="store_true", help="make dim 0 of input 0 symbolic ('N')")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per case")
    ap.add_argument("--out", default=str(OUT_DIR / "results.json"))
    ap.add_argument("-v", "--verbose", action="store_true", help="list declined cases too")
    args = ap.parse_args()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        cases = [c for c in collect_testcases() if c.model is not None and c.data_sets]
    if args.select:
        cases = [c for c in cases if re.search(args.select, c.name)]
    dtypes = SUPPORTED_DTYPES | {d.strip() for d in args.extra_dtypes.split(",") if d.strip()}
    t0 = time.monotonic()
    results = probe(cases, dtypes, not args.no_rules, args.const_inputs, args.symbolic, timeout=args.timeout)
    elapsed = time.monotonic() - t0
    results.sort(key=lambda r: r["name"])

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))

    by = collections.defaultdict(list)
    for r in results:
        by[r["status"]].append(r)
    fails = by["fail"]
    if fails:
        print("claimed & fail:")
        for r in fails:
            print(f"  {r['name']:60s} [{','.join(r.get('ops', []))}] {r['stage']}: {r['error'][:200]}")
    if args.verbose:
        print("declined:")
        for r in by["declined"]:
            print(f"  {r['name']:60s} {r['reason'][:160]}")
    rule_errors = [r for r in by["declined"] if r["reason"].startswith("RULE-ERROR")]
    for r in rule_errors:
        print(f"  RULE ERROR {r['name']}: {r['reason']}")
    print(
        f"\n{len(results)} cases in {elapsed:.0f} s: claimed&pass {len(by['pass'])}, "
        f"claimed&fail {len(fails)}, declined {len(by['declined'])} "
        f"(by rules {sum(r['reason'].startswith('rule:') for r in by['declined'])})"
    )
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
