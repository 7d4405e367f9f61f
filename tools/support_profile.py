#!/usr/bin/env python
"""Generate `docs/support_profile.json`: what the TVM EP claims of onnx's backend node cases.

For every node case of the onnx wheel (`onnx.backend.test.loader.load_model_tests(kind="node")`,
the models `tests/test_onnx_backend.py` runs), the model is loaded as a session
loads it (checker, Constant folding, shape inference) and each node is put
through the TVM EP, giving per op type and opset how many nodes are claimed and
declined, and why (decline kind and detail, counted).

Two sections, two costs:

- ``checks``: per-node capability checks only (`partition.tvm_rules.check_node`:
  domain, converter, opset, dtypes and the op rules in `partition/tvm_rules/`).
  No TVM build; ~15 s. `tests/test_onnx_backend.py::test_support_profile_checks_are_current`
  recomputes it in the default test run, so any change to a rule that is not
  regenerated fails there.
- ``claims``: the real claims, `TvmExecutionProvider(claim_policy='all').claim(graph)`, which also
  builds every partition with TVM (declining nodes that fail to import or build,
  or cross a partition boundary untyped). This costs a TVM build per case (about
  as long as the backend suite itself, ~10-30 min on 2 cores), so it runs in forked
  workers (TVM can abort) and its freshness test is marked `slow`.
- ``claims_sample``: per case, claimed and total nodes for a deterministic 1/32 of
  the cases (crc32 of the name), rebuilt by the default test run in about a minute:
  a regression in a pass that every build runs (one declined 1,569 nodes across
  op types) fails there instead of waiting for the slow rebuild.

Both are made for one reference CPU, `REFERENCE_TARGET` (Zen 4: AVX-512, the machines this
project runs on), whatever the host: some rules depend on the target's ISA (Tile is declined
under AVX-512), so a profile of the host would change from one machine to the next. Builds
for it run on any x86-64 host (nothing built here is executed).

    python tools/support_profile.py                 # both sections -> docs/support_profile.json
    python tools/support_profile.py --checks-only   # recompute checks, keep the stored claims
    python tools/support_profile.py --sample-only   # recompute checks and the claims sample, keep the
                                                    # full claims
    python tools/support_profile.py --check         # exit 1 if the checks section is stale
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import os
import sys
import time
import warnings
import zlib
from collections import Counter, defaultdict
from multiprocessing.connection import wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROFILE = ROOT / "docs" / "support_profile.json"
REASON_CHARS = 200
#: the claims sample: cases whose name's crc32 is 0 modulo this
SAMPLE_MODULUS = 32


def node_cases() -> list:
    """onnx's backend node cases, sorted by name (models built in memory by the wheel)."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sorted(load_model_tests(kind="node"), key=lambda c: c.name)


def _load(model):
    from nxrt_tvm.graph.model import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model(model)


def _reason(decline_or_signal) -> str:
    kind = getattr(decline_or_signal.rejected, "value", str(decline_or_signal.rejected))
    detail = " ".join(str(decline_or_signal.detail).split())
    return f"{kind}: {detail}"[:REASON_CHARS]


def case_checks(case, ep) -> dict:
    """Per node of one case: (op, opset, None when accepted / the decline reason)."""
    from nxrt_tvm.api.claim import DeclineSignal
    from nxrt_tvm.partition.node_context import NodeContext

    try:
        graph = _load(case.model)
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:REASON_CHARS]}"}
    nodes = []
    for i, node in enumerate(graph.nodes):
        ctx = NodeContext(graph, i, ep.target_features)
        try:
            ep.check_node(ctx)
            reason = None
        except DeclineSignal as signal:
            reason = _reason(signal)
        nodes.append((node.op_type, node.domain or "", graph.opset_of(i), reason))
    return {"nodes": nodes}


def case_claims(case, ep) -> dict:
    """Per node of one case: (op, opset, None when claimed / the first decline reason), after builds."""
    try:
        graph = _load(case.model)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:REASON_CHARS]}"}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        result = ep.claim(graph)
    claimed = {i for c in result.claims for i in c.nodes}
    first: dict[str, str] = {}
    for d in result.declines:
        first.setdefault(d.node, _reason(d))
    nodes = []
    for i, node in enumerate(graph.nodes):
        reason = None if i in claimed else first.get(node.name, "unclaimed: no decline recorded")
        nodes.append((node.op_type, node.domain or "", graph.opset_of(i), reason))
    return {"nodes": nodes}


def summarise(per_case: dict[str, dict]) -> dict:
    """Aggregate per-case node results into {op: {opset: {nodes, claimed, declined, reasons}}}."""
    ops: dict = defaultdict(dict)
    errors = {}
    total = claimed = 0
    for name in sorted(per_case):
        rec = per_case[name]
        if "error" in rec:
            errors[name] = rec["error"]
            continue
        for op, domain, opset, reason in rec["nodes"]:
            key = op if not domain else f"{domain}::{op}"
            entry = ops[key].setdefault(
                str(opset), {"nodes": 0, "claimed": 0, "declined": 0, "reasons": Counter()}
            )
            entry["nodes"] += 1
            total += 1
            if reason is None:
                entry["claimed"] += 1
                claimed += 1
            else:
                entry["declined"] += 1
                entry["reasons"][reason] += 1
    out_ops = {}
    for op in sorted(ops):
        out_ops[op] = {}
        for opset in sorted(ops[op], key=int):
            e = ops[op][opset]
            out_ops[op][opset] = {
                "nodes": e["nodes"],
                "claimed": e["claimed"],
                "declined": e["declined"],
                "reasons": dict(sorted(e["reasons"].items(), key=lambda kv: (-kv[1], kv[0]))),
            }
    return {
        "cases": len(per_case),
        "unloadable_cases": errors,
        "nodes": total,
        "claimed_nodes": claimed,
        "declined_nodes": total - claimed,
        "op_types_claimed_somewhere": sum(
            1 for op in out_ops.values() if any(e["claimed"] for e in op.values())
        ),
        "op_types": len(out_ops),
        "ops": out_ops,
    }


#: the target the profile describes (see the module doc)
REFERENCE_TARGET = {"kind": "llvm", "mcpu": "znver4"}


def compute_checks() -> dict:
    from nxrt_tvm.providers.tvm import TvmExecutionProvider

    ep = TvmExecutionProvider(target=REFERENCE_TARGET, claim_policy="all")
    return summarise({case.name: case_checks(case, ep) for case in node_cases()})


# -- claims: one TVM build per case, in forked workers --------------------------------------


def _claims_worker(names: list[str], conn) -> None:
    from nxrt_tvm.providers.tvm import TvmExecutionProvider
    from nxrt_tvm.runtime.isolate import freeze_inherited

    freeze_inherited()  # forked from a process that may hold onnxruntime sessions in garbage

    cases = {c.name: c for c in node_cases() if c.name in set(names)}
    while True:
        name = conn.recv()
        if name is None:
            return
        ep = TvmExecutionProvider(target=REFERENCE_TARGET, claim_policy="all")  # fresh: keeps its modules
        conn.send((name, case_claims(cases[name], ep)))


def _sampled(name: str) -> bool:
    return zlib.crc32(name.encode()) % SAMPLE_MODULUS == 0


def sample_names() -> list[str]:
    return [c.name for c in node_cases() if _sampled(c.name)]


def sample_of(per_case: dict[str, dict]) -> dict[str, list[int] | str]:
    """Per sampled case: [claimed nodes, nodes], or the error that kept it from loading."""
    out: dict[str, list[int] | str] = {}
    for name in sorted(n for n in per_case if _sampled(n)):
        rec = per_case[name]
        out[name] = (
            rec["error"] if "error" in rec else [sum(r[3] is None for r in rec["nodes"]), len(rec["nodes"])]
        )
    return out


def compute_claims(workers: int = 2, timeout: float = 600.0, progress: bool | None = None) -> dict:
    return summarise(claim_cases(None, workers, timeout, progress))


def claim_cases(
    names: list[str] | None = None, workers: int = 2, timeout: float = 600.0, progress: bool | None = None
) -> dict[str, dict]:
    """`claim()` per case (all when `names` is None); a worker that
    dies or overruns `timeout` is replaced and the case recorded."""
    if progress is None:
        progress = sys.stderr.isatty()
    ctx = mp.get_context("fork")
    names = [c.name for c in node_cases()] if names is None else list(names)
    todo = list(names)
    results: dict[str, dict] = {}
    slots: list[list | None] = [None] * workers
    started = time.time()
    while todo or any(s is not None and s[2] is not None for s in slots):
        for k in range(workers):
            if slots[k] is None:
                a, b = ctx.Pipe()
                proc = ctx.Process(target=_claims_worker, args=(names, b), daemon=True)
                proc.start()
                slots[k] = [proc, a, None, 0.0]
            if slots[k][2] is None and todo:
                name = todo.pop(0)
                slots[k][1].send(name)
                slots[k][2], slots[k][3] = name, time.time()
        busy = [s for s in slots if s is not None and s[2] is not None]
        if not busy:
            break
        wait([s[1] for s in busy] + [s[0].sentinel for s in busy], timeout=5)
        for k, s in enumerate(slots):
            if s is None or s[2] is None:
                continue
            try:
                done = s[1].recv() if s[1].poll() else None
            except EOFError:  # the worker died while its pipe was being read
                done = None
            if done is not None:
                name, rec = done
                results[name] = rec
                s[2] = None
                if progress:
                    print(
                        f"\r{len(results)}/{len(names)} cases, {time.time() - started:.0f} s",
                        end="",
                        file=sys.stderr,
                        flush=True,
                    )
            elif not s[0].is_alive():
                results[s[2]] = {"error": f"worker died (exit code {s[0].exitcode}) while claiming"}
                slots[k] = None
            elif time.time() - s[3] > timeout:
                s[0].kill()
                s[0].join()
                results[s[2]] = {"error": f"claiming took over {timeout:.0f} s"}
                slots[k] = None
    for s in slots:
        if s is not None:
            s[1].send(None)
            s[0].join(timeout=10)
    if progress:
        print(file=sys.stderr)
    return results


def versions() -> dict:
    import onnx
    import tvm

    return {"onnx": onnx.__version__, "tvm": tvm.__version__}


def build_profile(checks: dict, claims: dict | None, sample: dict | None) -> dict:
    return {
        "about": (
            "TVM EP claims over onnx's backend node cases; regenerate with `python tools/support_profile.py`"
        ),
        "versions": versions(),
        "checks_method": (
            "TvmExecutionProvider.check_node per node (capability checks and op rules, no build)"
        ),
        "claims_method": (
            "TvmExecutionProvider(target=REFERENCE_TARGET, claim_policy='all').claim(graph) per case "
            "(checks, grouping, and a TVM build of every partition), "
            f"REFERENCE_TARGET = {json.dumps(REFERENCE_TARGET)}"
        ),
        "claims": claims,
        "claims_sample": sample,
        "checks": checks,
    }


def dump(profile: dict) -> str:
    return json.dumps(profile, indent=1, sort_keys=False) + "\n"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--checks-only", action="store_true", help="recompute the checks section, keep the stored claims"
    )
    parser.add_argument(
        "--sample-only",
        action="store_true",
        help="recompute checks and the claims sample, keep the full claims",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the stored checks section is stale")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("-o", "--output", type=Path, default=PROFILE)
    args = parser.parse_args(argv)
    checks = compute_checks()
    stored = json.loads(args.output.read_text()) if args.output.exists() else None
    if args.check:
        if stored is None or stored.get("checks") != json.loads(json.dumps(checks)):
            print(
                f"{args.output} is stale: run python tools/support_profile.py --checks-only", file=sys.stderr
            )
            return 1
        print(f"{args.output} is current")
        return 0
    if args.checks_only or args.sample_only:
        claims = stored.get("claims") if stored else None
        sample = stored.get("claims_sample") if stored else None
        if args.sample_only:
            sample = sample_of(claim_cases(sample_names(), args.workers))
    else:
        per_case = claim_cases(None, args.workers)
        claims, sample = summarise(per_case), sample_of(per_case)
    write_atomic(args.output, dump(build_profile(checks, claims, sample)))
    c = claims or {}
    print(
        f"wrote {args.output}: {checks['nodes']} nodes in {checks['cases']} node cases; "
        f"pass the checks: {checks['claimed_nodes']}; claimed after builds: {c.get('claimed_nodes', '?')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
