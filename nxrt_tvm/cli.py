"""The `nxrt-tvm` command: plan, run (and check against onnxruntime) a model."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from .api.errors import EpError, InvalidProviderOptions
from .api.provider import inlined_ops
from .data import default_model_path
from .epcontext.codec import is_ep_context
from .epcontext.loader import restore_sources
from .graph.model import GraphView, load_model
from .lower.schedules import CONV_ALGORITHMS
from .ort.cli import add_cli as _add_ort_plugin_cli
from .partition.plan import make_plan
from .providers import FALLBACK_EP
from .runtime.ort_session import ort_session
from .runtime.specialise import SPECIALISE_AFTER
from .session import InferenceSession
from .session_options import SessionOptions
from .timing import PhaseTimes, interleaved_medians, phase, record_phases

__all__ = ["main"]


def _tvm_options(args: argparse.Namespace) -> dict:
    options: dict = {"target": args.target}
    if args.min_subgraph_size is not None:
        options["min_subgraph_size"] = args.min_subgraph_size
    if args.exclude:
        options["op_types_to_exclude"] = args.exclude
    if getattr(args, "tuning_logs", None) is not None:
        options["tuning_logs"] = str(args.tuning_logs)
    if args.conv_algorithm != "auto":
        options["conv_algorithm"] = args.conv_algorithm
    return options


def _provider_args(args: argparse.Namespace) -> tuple[list[str], list[dict]]:
    return ["TvmExecutionProvider", "CPUExecutionProvider"], [_tvm_options(args), {}]


def _dim_sizes(args: argparse.Namespace) -> dict[str, list[int]]:
    """--dim NAME=SIZE[,SIZE...] as {name: sizes}."""
    dims = {}
    for item in args.dim:
        name, sep, sizes = item.partition("=")
        values = sizes.split(",")
        if not sep or not name or not all(v.isdigit() for v in values):
            raise InvalidProviderOptions(
                f"--dim takes NAME=SIZE (run --check and tune: NAME=SIZE,SIZE,...), got {item!r}"
            )
        dims[name] = [int(v) for v in values]
    return dims


def _dims(args: argparse.Namespace) -> dict[str, int]:
    """The dims fixed at compile time: those given one size. Several sizes keep a dim symbolic where a
    command has a use for them (run --check checks each, tune tunes each); elsewhere they are refused,
    not dropped."""
    sizes = _dim_sizes(args)
    several = sorted(name for name, values in sizes.items() if len(values) > 1)
    if several and args.command not in ("run", "tune"):
        raise InvalidProviderOptions(
            f"{args.command} takes one size per --dim (got several for {', '.join(several)}); several "
            "sizes are for run --check (one symbolic build checked at each) and tune (each tuned)"
        )
    return {name: values[0] for name, values in sizes.items() if len(values) == 1}


def _session_options(args: argparse.Namespace, at_load: bool = False) -> SessionOptions:
    """The session's options: `--dim` sizes fixed; `at_load`: a symbolic plan built when the session
    is made (`run` shows and checks it), not deferred until input shapes recur."""
    options = SessionOptions()
    for name, size in _dims(args).items():
        options.add_free_dimension_override_by_name(name, size)
    if at_load:
        options.add_session_config_entry("nxrt.symbolic_compile", "load")
    return options


def _add_model_args(p: argparse.ArgumentParser, tuning: bool = True) -> None:
    p.add_argument("model", nargs="?", type=Path, help="ONNX model (default: the bundled demo model)")
    p.add_argument("--target", default="llvm", help="'llvm' (host CPU), 'cuda', or a JSON target dict")
    p.add_argument("--min-subgraph-size", type=int, help="smallest partition the TVM EP compiles")
    p.add_argument("--exclude", help="comma-separated op types the TVM EP must not claim")
    p.add_argument(
        "--conv-algorithm",
        choices=CONV_ALGORITHMS,
        default="auto",
        help="'auto': 3x3 stride-1 convolutions as Winograd where they fit; 'direct': all direct "
        "(tune with the algorithm you compile with: they make different kernels)",
    )
    p.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=SIZE",
        help="fix a symbolic input dim (static shapes let TVM claim and tune more); "
        "run --check: NAME=SIZE,SIZE,... keeps it symbolic and checks every size; "
        "tune: NAME=SIZE,SIZE,... tunes every size, and symbolic sessions run them as tuned",
    )
    if tuning:
        p.add_argument(
            "--tuning-logs",
            type=Path,
            help="folder of per-device tuning databases to apply (e.g. tuning_logs)",
        )
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _add_timings_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timings",
        action="store_true",
        help="where the time to the plan or session went: per phase (claim checks, proof builds, "
        "bisection, Relax import, passes, schedules, codegen, export), per TVM partition, and the builds",
    )


def _tvm_variants(providers) -> dict[str, list]:
    for ep in providers:
        if getattr(ep, "variants", None) is not None:
            return ep.variants
    return {}


def _model(args: argparse.Namespace) -> Path:
    return args.model if args.model is not None else default_model_path()


def _cmd_plan(args: argparse.Namespace) -> int:
    from .session import _make_providers

    providers = _make_providers(*_provider_args(args))
    started = time.perf_counter()
    with record_phases() as times:
        with phase("load"):
            graph = load_model(_model(args), free_dims=_dims(args), inline=inlined_ops(providers))
        with phase("plan"):
            plan = make_plan(graph, providers)
    seconds = time.perf_counter() - started
    variants = _tvm_variants(providers)
    report = plan.to_json(graph, variants)
    if args.timings:
        report["timings"] = _timings(times, seconds, providers)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(plan.format(graph, variants))
    if args.timings:
        _print_timings(report["timings"])
    return 0


def _timings(times: PhaseTimes, seconds: float, providers) -> dict:
    """Where the time to a plan (or a session) went: per phase, per TVM partition, and the builds."""
    builder = next((ep.builder for ep in providers if hasattr(ep, "builder")), None)
    return {
        "total_s": round(seconds, 3),
        "phases": times.to_json(),
        "partitions_s": {} if builder is None else {k: round(v, 3) for k, v in builder.seconds.items()},
        "builds": {} if builder is None else dict(builder.stats),
    }


def _print_timings(timings: dict) -> None:
    print(f"\ntimings: {timings['total_s']:.2f} s in all")
    for path, t in timings["phases"].items():
        depth = path.count("/")
        calls = f" x{t['calls']}" if t["calls"] > 1 else ""
        print(f"  {t['seconds']:9.3f} s  {'  ' * depth}{path.rsplit('/', 1)[-1]}{calls}")
    if timings["partitions_s"]:
        print("  per TVM partition (proof: cache, build, bisection):")
        for name, s in sorted(timings["partitions_s"].items(), key=lambda kv: -kv[1]):
            print(f"  {s:9.3f} s  {name}")
    builds = timings["builds"]
    print(
        f"  builds: {builds.get('builds', 0)} ({builds.get('bisections', 0)} bisected), "
        f"cache hits {builds.get('cache_hits', 0)}, "
        f"failures remembered {builds.get('failures_remembered', 0)}"
    )


def random_feeds(graph: GraphView, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for a model: normal floats, small non-negative ints, symbolic dims from `dims` (else 1)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in graph.inputs:
        shape = [d if isinstance(d, int) else dims.get(str(d), 1) for d in (info.shape or ())]
        dtype = info.dtype if info.dtype is not None else np.dtype(np.float32)
        if dtype.kind == "f":
            feeds[info.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[info.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[info.name] = rng.integers(0, 2, shape).astype(dtype)
    return feeds


def _reference(model: Path):
    """onnxruntime on the same model (its source, for EPContext models) with TVM's thread count."""
    threads = int(os.environ["TVM_NUM_THREADS"])
    proto = onnx.load(str(model))
    if any(is_ep_context(n) for n in proto.graph.node):  # compare with the source the blobs came from
        proto = restore_sources(proto)
    return ort_session(proto.SerializeToString(), threads), threads


def _size_sets(args: argparse.Namespace) -> list[dict[str, int]]:
    """Every combination of the sizes given to --dim (one set where each dim has one size)."""
    sizes = _dim_sizes(args)
    names = list(sizes)
    return [dict(zip(names, combo)) for combo in itertools.product(*(sizes[n] for n in names))] or [{}]


def _compare(
    got: list[np.ndarray], want: list[np.ndarray], names: list[str], rtol: float, atol: float
) -> dict:
    """Per output: the largest |difference|, the worst error
    relative to the output's scale, and whether it is close."""
    diffs = {}
    for name, g, w in zip(names, got, want):
        if g.shape != w.shape:
            diffs[name] = {
                "max_abs_diff": None,
                "max_rel_err": None,
                "ok": False,
                "detail": f"shape {list(g.shape)}, onnxruntime {list(w.shape)}",
            }
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        err = float(np.max(np.abs(g64 - w64))) if g.size else 0.0
        scale = float(np.max(np.abs(w64))) if w.size else 0.0
        close = bool(np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True))
        diffs[name] = {"max_abs_diff": err, "max_rel_err": err / scale if scale > 0 else err, "ok": close}
    return diffs


def _check_at(sess: InferenceSession, ref, feeds: dict, args: argparse.Namespace) -> dict:
    """One size: both runtimes on the same feeds; an error on both sides agrees, on one side it does not."""
    names = [o.name for o in sess.get_outputs()]
    try:
        want = ref.run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors are reported, not raised
        want = exc
    try:
        got = sess.run(None, feeds)
    except EpError as exc:
        got = exc
    if isinstance(want, Exception) or isinstance(got, Exception):
        agree = isinstance(want, Exception) and isinstance(got, Exception)
        return {
            "ok": agree,
            "nxrt_tvm_error": None if not isinstance(got, Exception) else f"{type(got).__name__}: {got}",
            "onnxruntime_error": None if not isinstance(want, Exception) else str(want).splitlines()[0],
        }
    diffs = _compare(got, want, names, args.rtol, args.atol)
    return {
        "ok": all(d["ok"] for d in diffs.values()),
        "outputs": diffs,
        "shapes": {name: list(g.shape) for name, g in zip(names, got)},
    }


def _cmd_run(args: argparse.Namespace) -> int:
    model = _model(args)
    providers, options = _provider_args(args)
    sess = InferenceSession(
        model, _session_options(args, at_load=True), providers=providers, provider_options=options
    )
    if args.inputs:
        with np.load(args.inputs) as data:
            feed_sets = [({}, {k: data[k] for k in data.files})]
    else:
        feed_sets = [(dims, random_feeds(sess.graph, dims, args.seed)) for dims in _size_sets(args)]
    if not args.check and len(feed_sets) > 1:
        raise InvalidProviderOptions(
            "several sizes in --dim need --check (each size is checked against onnxruntime)"
        )
    report: dict = {
        "model": str(model),
        "plan": sess.plan.to_json(sess.graph, sess.kernel_variants()),
        "session_load_s": round(sess.load_seconds, 4),
    }
    if args.timings:
        providers = [sess.provider(ep) for ep in sess.get_providers()]
        report["timings"] = _timings(sess.compile_times, sess.load_seconds, providers)
    ok = True
    if not args.check:
        outputs = sess.run(None, feed_sets[0][1])
        report["outputs"] = {o.name: list(v.shape) for o, v in zip(sess.get_outputs(), outputs)}
    else:
        ref, threads = _reference(model)
        checks = []
        for dims, feeds in feed_sets:
            checks.append({"dims": dims, **_check_at(sess, ref, feeds, args)})
        ok = all(c["ok"] for c in checks)
        report["outputs"] = checks[-1].pop("shapes", {})
        for check in checks:
            check.pop("shapes", None)
        report["check"] = {"rtol": args.rtol, "atol": args.atol, "sizes": checks, "ok": ok}
        feeds = feed_sets[-1][1]
        if "outputs" in checks[-1]:
            times = _latency(sess, ref, feeds, args.repeat)
            nx_s, ort_s = times["nx"], times["ort"]
            report["latency_ms"] = {
                "nxrt_tvm": round(nx_s * 1e3, 4),
                "onnxruntime": round(ort_s * 1e3, 4),
                "ratio": round(nx_s / ort_s, 3),
                "threads": threads,
                "repeat": args.repeat,
                "dims": feed_sets[-1][0],
                # where the plan left every node to the fallback, both columns time onnxruntime
                "onnxruntime_only": all(p.ep == FALLBACK_EP for p in sess.plan.partitions),
            }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_run(sess, report, args)
    return 0 if ok else 1


def _print_run(sess: InferenceSession, report: dict, args: argparse.Namespace) -> None:
    print(f"model: {report['model']}")
    print(sess.plan.format(sess.graph, sess.kernel_variants()))
    print(f"session ready in {sess.load_seconds:.3f} s (partition + compile)")
    if args.timings:
        _print_timings(report["timings"])
    for name, shape in report.get("outputs", {}).items():
        print(f"output {name}: shape {shape}")
    if not args.check:
        return
    for check in report["check"]["sizes"]:
        at = " ".join(f"{k}={v}" for k, v in check["dims"].items()) or "the given sizes"
        if "outputs" not in check:
            verdict = "ok: both raised" if check["ok"] else "MISMATCH"
            print(
                f"check at {at}: {verdict}: nxrt-tvm {check['nxrt_tvm_error'] or 'ran'}; "
                f"onnxruntime {check['onnxruntime_error'] or 'ran'}"
            )
            continue
        for name, d in check["outputs"].items():
            if d["max_abs_diff"] is None:
                print(f"check at {at}, {name}: MISMATCH: {d['detail']}")
                continue
            print(
                f"check at {at}, {name}: worst relative error "
                f"{d['max_rel_err']:.3g} (max |diff| {d['max_abs_diff']:.3g}) "
                f"-> {'ok' if d['ok'] else 'MISMATCH'} (rtol {args.rtol}, atol {args.atol})"
            )
    if "latency_ms" in report:
        lat = report["latency_ms"]
        print(
            f"latency (median of {LATENCY_ROUNDS} interleaved rounds of up to {lat['repeat']} calls, "
            f"{lat['threads']} "
            f"threads): nxrt-tvm {lat['nxrt_tvm']:.3f} ms, "
            f"onnxruntime {lat['onnxruntime']:.3f} ms, ratio {lat['ratio']:.2f}x"
        )
        if lat["onnxruntime_only"]:
            print(
                "  (every node ran on onnxruntime, so the ratio is onnxruntime against itself: its spread "
                "is this machine's noise; the declines above say why TVM took nothing)"
            )


def _cmd_compile(args: argparse.Namespace) -> int:
    from .aot import compile_model

    options = _tvm_options(args)
    options.pop("target")
    report = compile_model(
        _model(args),
        args.output,
        target=args.target,
        embed=not args.external,
        weightless=args.weightless,
        keep_source=not args.no_source,
        provider_options=options,
        progress=None if not args.json else False,
        sign=args.sign,
        cpus=None if args.cpus is None else args.cpus.split(","),
        free_dims=_dims(args),
    )
    summary = {
        "output": str(report.output),
        "signature": None if report.signature is None else str(report.signature),
        "files": [{"path": str(f), "bytes": f.stat().st_size} for f in report.files],
        "compiled_partitions": report.compiled_partitions,
        "fallback_partitions": len(report.plan.partitions) - report.compiled_partitions,
        "declines": len(report.plan.declines),
        "seconds": round(report.seconds, 3),
        "cpus": None if args.cpus is None else args.cpus.split(","),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"wrote {report.output}: {report.compiled_partitions} EPContext partitions, "
            f"{summary['fallback_partitions']} fallback partitions, "
            f"{report.bytes_written} bytes in {len(report.files)} file(s), "
            f"{report.seconds:.2f} s" + (f", signed ({report.signature.name})" if report.signature else "")
        )
    return 0


def _cmd_revalidate(args: argparse.Namespace) -> int:
    from .tuning.revalidate import revalidate

    if args.model is not None:
        raise InvalidProviderOptions(
            "tune --revalidate measures the records already under --log-dir (they carry their kernels); "
            "it takes no model: drop MODEL, or drop --revalidate to tune the model"
        )
    report = revalidate(
        target=args.target,
        log_dir=args.log_dir,
        rpc_tracker=args.rpc_tracker,
        rpc_key=args.rpc_key,
        progress=None if not args.json else False,
    )
    summary = {
        "device_key": report.device_key,
        "directory": str(report.directory),
        "sources": list(report.sources),
        "measured": report.measured,
        "done_before": report.done_before,
        "failed": report.failed,
        "seconds": round(report.seconds, 1),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    elif not report.sources:
        print(
            f"device key {report.device_key}: no compatible key under {args.log_dir}; nothing to revalidate"
        )
    else:
        print(
            f"device key {report.device_key}: {report.measured} kernels measured here from "
            f"{', '.join(report.sources)} ({report.done_before} done before, {report.failed} failed) "
            f"in {report.seconds:.0f} s -> {report.directory}"
        )
    return 0


def _cmd_keygen(args: argparse.Namespace) -> int:
    from .epcontext.signing import ECDSA_P256, ED25519, generate_key

    private, public = generate_key(args.output, ED25519 if args.ed25519 else ECDSA_P256)
    print(
        f"wrote {private} (private key: keep it secret; compile --sign) and {public} (for nxrt.trusted_keys)"
    )
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .epcontext.signing import SignaturePolicy, verify_artifacts

    if not args.model.is_file():
        raise InvalidProviderOptions(f"model file {str(args.model)!r} does not exist")
    trust = verify_artifacts(args.model, SignaturePolicy.from_paths(tuple(map(str, args.key)), required=True))
    problem, manifest = trust.problem, trust.manifest
    if args.json:
        print(
            json.dumps(
                {
                    "verified": problem is None,
                    "check": None if problem is None else problem.check,
                    "reason": None if problem is None else f"{problem.reason}; {problem.remedy}",
                    "key_fingerprint": trust.key_fingerprint or None,
                    "algorithm": trust.algorithm or None,
                    "files": [] if problem is not None or manifest is None else dict(manifest.files()),
                },
                indent=2,
            )
        )
    elif problem is not None:
        print(f"{args.model}: NOT verified ({problem.check}): {problem.reason}; {problem.remedy}")
    else:
        print(f"{args.model}: verified, signed by {trust.key_fingerprint} ({trust.algorithm})")
        for name, digest in manifest.files() if manifest is not None else ():
            print(f"  {name}  sha256 {digest}")
    return 0 if problem is None else 1


def _cmd_tune(args: argparse.Namespace) -> int:
    from .tuning.tune import tune_model

    if args.revalidate:
        return _cmd_revalidate(args)

    report = tune_model(
        _model(args),
        target=args.target,
        trials=args.trials,
        time_budget=args.time_budget,
        log_dir=args.log_dir,
        rpc_tracker=args.rpc_tracker,
        rpc_key=args.rpc_key,
        free_dims=_dim_sizes(args),  # several sizes: tuned at each, and kept for symbolic sessions
        conv_algorithm=args.conv_algorithm,
        progress=None if not args.json else False,
    )
    rows = [
        {
            "task": t.name,
            "weight": t.weight,
            "gflop": round(t.flops / 1e9, 4),
            "trials": t.trials,
            "total_trials": t.total_trials,
            "best_us": None if t.best_us is None else round(t.best_us, 2),
            "default_us": None if t.rule_us is None else round(t.rule_us, 2),
            "default_fastest": t.best_is_rule,
            "resumed": t.skipped,
        }
        for t in report.tasks
    ]
    if args.json:
        print(
            json.dumps(
                {
                    "device_key": report.device_key,
                    "directory": str(report.directory),
                    "trials": report.trials,
                    "seconds": round(report.seconds, 1),
                    "tasks": rows,
                },
                indent=2,
            )
        )
    else:
        print(
            f"device key {report.device_key}: {len(rows)} tasks, {report.trials} "
            f"trials in {report.seconds:.0f} s -> {report.directory}"
        )
        for r in rows:
            best = "-" if r["best_us"] is None else f"{r['best_us']:.1f} us"
            default = "" if r["default_us"] is None else f", default rules {r['default_us']:.1f} us"
            note = (" (default rules fastest)" if r["default_fastest"] else "") + (
                " (done before)" if r["resumed"] else ""
            )
            print(
                f"  {r['task']:<60} x{r['weight']:<3} trials "
                f"{r['total_trials']:>4}  best {best}{default}{note}"
            )
    return 0


#: the CLI's latency comparison (`interleaved_medians`): untimed calls first, then rounds alternating the
#: runtimes, each settled first and then `repeat` calls or its share of the budget (at least 3 calls).
#: 5 unsettled rounds of 20 calls put the demo at 0.64-1.48x onnxruntime in four runs on a Zen 3
LATENCY_WARMUP_S, LATENCY_SETTLE_S, LATENCY_ROUNDS, LATENCY_BUDGET_S = 0.25, 0.05, 15, 3.0


def _latency(sess: InferenceSession, ref: ort.InferenceSession, feeds: dict, repeat: int) -> dict[str, float]:
    """Median seconds per call of the session ("nx") and onnxruntime alone ("ort")."""
    return interleaved_medians(
        {"nx": lambda: sess.run(None, feeds), "ort": lambda: ref.run(None, feeds)},
        repeat,
        rounds=LATENCY_ROUNDS,
        budget_s=LATENCY_BUDGET_S,
        warmup_s=LATENCY_WARMUP_S,
        settle_s=LATENCY_SETTLE_S,
    )


def _cmd_bench(args: argparse.Namespace) -> int:
    model = _model(args)
    providers, options = _provider_args(args)
    sess = InferenceSession(model, _session_options(args), providers=providers, provider_options=options)
    feeds = random_feeds(sess.graph, _dims(args), args.seed)
    for _ in range(SPECIALISE_AFTER):  # a model with symbolic dims is built for the feeds' shapes here
        sess.run(None, feeds)
    serving = sess.session_for(feeds)
    ref, threads = _reference(model)
    times = _latency(sess, ref, feeds, args.repeat)
    nx_s, ort_s = times["nx"], times["ort"]
    variants = serving.kernel_variants()
    counts: dict[str, int] = {}
    for vs in variants.values():
        for v in vs:
            counts[v.variant] = counts.get(v.variant, 0) + 1
    report = {
        "model": str(model),
        "threads": threads,
        "repeat": args.repeat,
        "nxrt_tvm_ms": round(nx_s * 1e3, 4),
        "onnxruntime_ms": round(ort_s * 1e3, 4),
        "ratio": round(nx_s / ort_s, 3),
        "shape_build_s": None if serving is sess else round(serving.load_seconds, 3),
        "kernels": counts,
        "variants": {p: [v.__dict__ for v in vs] for p, vs in variants.items()},
    }
    profile = _profile_rows(serving, feeds, args.repeat, variants) if args.profile else None
    if profile is not None:
        report["profile"] = profile
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"{model}: nxrt-tvm {report['nxrt_tvm_ms']:.3f} ms, "
            f"onnxruntime {report['onnxruntime_ms']:.3f} ms, "
            f"ratio {report['ratio']:.2f}x ({threads} threads, "
            f"median of {LATENCY_ROUNDS} interleaved rounds of up to {args.repeat} calls)"
        )
        if serving is not sess:
            print(f"built for the feeds' shapes on their third call, in {serving.load_seconds:.2f} s")
        print("kernels: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
        if profile is None:
            for part, vs in variants.items():
                for v in vs:
                    print(f"  {part} {v.name:<50} {v.variant:<24} {v.reason}")
        else:
            _print_profile(profile, args.repeat)
    return 0


#: the variant a profile shows for a VM builtin (allocation, shape checks, tuple handling)
_VM = "vm"


def _profile_rows(sess: InferenceSession, feeds: dict, repeat: int, variants: dict) -> list[dict]:
    """`sess.profile` as rows: per partition its time and ep, and per function its time and variant."""
    rows = []
    for part in sess.profile(feeds, repeat):
        known = {v.name: v.variant for v in variants.get(part.partition, [])}
        rows.append(
            {
                "partition": part.partition,
                "ep": part.ep,
                "ms": round(part.seconds * 1e3, 4),
                "functions": [
                    {"name": name, "variant": known.get(name, _VM), "ms": round(s * 1e3, 4), "calls": n}
                    for name, s, n in part.functions
                ],
            }
        )
    return rows


def _print_profile(rows: list[dict], repeat: int) -> None:
    """Partitions slowest first, each with its functions (slowest first; builtins of the VM as 'vm')."""
    total = sum(r["ms"] for r in rows) or 1.0
    print(f"profile (each partition timed alone, median of {repeat} calls; {total:.3f} ms in all):")
    for r in sorted(rows, key=lambda r: -r["ms"]):
        print(f"  {r['ms']:9.3f} ms {r['ms'] / total:6.1%}  {r['partition']} ({r['ep']})")
        for f in r["functions"]:
            calls = f" x{f['calls']}" if f["calls"] > 1 else ""
            print(f"    {f['ms']:9.3f} ms  {f['variant']:<24} {f['name']}{calls}")


def _cmd_cache(args: argparse.Namespace) -> int:
    from .epcontext.cache import CompileCache

    if not args.cache_dir.is_dir():
        raise InvalidProviderOptions(f"{args.cache_dir} is not a compile cache folder (no such directory)")
    cache = CompileCache(args.cache_dir)
    if args.action == "clear":
        before = cache.total_bytes()
        cache.clear()
        print(f"removed {before} bytes of compiled partitions from {args.cache_dir}")
        return 0
    entries = cache.entries()
    if args.json:
        print(json.dumps({"entries": [e.__dict__ for e in entries], "total_bytes": cache.total_bytes()}))
        return 0
    print(f"{len(entries)} compiled partition(s), {cache.total_bytes()} bytes, in {args.cache_dir}")
    for e in entries:
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.last_used))
        print(f"  {e.key[:16]}  {e.size:>12} bytes  last used {used}")
    return 0


def _cmd_rules(args: argparse.Namespace) -> int:
    from .partition.tvm_rules import support_table

    rows = support_table()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"TVM claim policy: {len(rows)} ops (each also passes the generic domain/opset/dtype checks)")
    for r in rows:
        extra = f" [compile-time inputs {r['import_time_inputs']}]" if r["import_time_inputs"] else ""
        print(f"  {r['op_type']:<28} opset>={r['since_opset']:<3} {r['guards']}{extra}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nxrt-tvm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="show which EP claims which subgraph, and every decline")
    _add_model_args(plan)
    _add_timings_arg(plan)
    plan.set_defaults(func=_cmd_plan)
    run = sub.add_parser("run", help="compile and run a model on given or random inputs")
    _add_model_args(run)
    _add_timings_arg(run)
    run.add_argument("--inputs", type=Path, help=".npz file of inputs, keyed by input name")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--check", action="store_true", help="compare with onnxruntime and time both")
    run.add_argument("--rtol", type=float, default=1e-3)
    run.add_argument("--atol", type=float, default=1e-4)
    run.add_argument("--repeat", type=int, default=20, help="timed runs per engine with --check")
    run.set_defaults(func=_cmd_run)
    comp = sub.add_parser("compile", help="compile ahead of time into a model with EPContext nodes")
    _add_model_args(comp)
    comp.add_argument("-o", "--output", type=Path, required=True, help="where to write the EPContext model")
    mode = comp.add_mutually_exclusive_group()
    mode.add_argument("--embed", action="store_true", default=True, help="blobs inside the model (default)")
    mode.add_argument(
        "--external", action="store_true", help="blob files beside the model, paths relative to it"
    )
    comp.add_argument(
        "--weightless", action="store_true", help="code-only blobs; weights bound from the model at load"
    )
    comp.add_argument(
        "--no-source",
        action="store_true",
        help="drop the source subgraphs kept for hosts that cannot load a blob",
    )
    comp.add_argument(
        "--sign",
        type=Path,
        metavar="KEY",
        help="sign the model and its blobs with this PEM private key (writes OUT.sig)",
    )
    comp.add_argument(
        "--cpus",
        metavar="CPU,...",
        help="one build per CPU (LLVM names, e.g. x86-64-v3,znver4,sapphirerapids) in each partition; "
        "a host loads the closest it can run",
    )
    comp.set_defaults(func=_cmd_compile)
    keygen = sub.add_parser("keygen", help="make a key pair for compile --sign and nxrt.trusted_keys")
    keygen.add_argument(
        "output",
        type=Path,
        help="private key file (e.g. signing.pem); the public key goes beside it (signing.pub.pem)",
    )
    keygen.add_argument("--ed25519", action="store_true", help="an Ed25519 key (default: ECDSA P-256)")
    keygen.set_defaults(func=_cmd_keygen)
    verify = sub.add_parser("verify", help="check an EPContext model's signature and the files it covers")
    verify.add_argument("model", type=Path, help="the EPContext model (its .sig beside it)")
    verify.add_argument(
        "--key", type=Path, action="append", required=True, help="a trusted PEM public key or certificate"
    )
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    verify.set_defaults(func=_cmd_verify)
    tune = sub.add_parser(
        "tune", help="autotune the TVM partitions for a device (MetaSchedule + XGBoost), resumable"
    )
    _add_model_args(tune, tuning=False)
    tune.add_argument(
        "--trials", type=int, default=256, help="measurement trials in all (spent where the weighted cost is)"
    )
    tune.add_argument(
        "--time-budget",
        type=float,
        help="seconds; later tasks get only the trials that fit in what is left, none once it is spent",
    )
    tune.add_argument(
        "--log-dir", type=Path, default=Path("tuning_logs"), help="databases go to LOG_DIR/<device key>/"
    )
    tune.add_argument(
        "--rpc-tracker", metavar="HOST:PORT", help="measure on the device behind this TVM RPC tracker"
    )
    tune.add_argument("--rpc-key", help="the device key its RPC server registered with the tracker")
    tune.add_argument(
        "--revalidate",
        action="store_true",
        help="no search: measure the records of compatible device keys under LOG_DIR and the default rules "
        "on this host, and write this host's key with both (resumable; takes no MODEL)",
    )
    tune.set_defaults(func=_cmd_tune)
    bench = sub.add_parser("bench", help="time the session against onnxruntime with the same thread count")
    _add_model_args(bench)
    bench.add_argument("--repeat", type=int, default=50)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument(
        "--profile",
        action="store_true",
        help="also time each partition alone and each TVM kernel inside it (variant and share)",
    )
    bench.set_defaults(func=_cmd_bench)
    cache = sub.add_parser("cache", help="list or clear a compile cache (the cache_dir provider option)")
    cache.add_argument("action", choices=("ls", "clear"))
    cache.add_argument("cache_dir", type=Path)
    cache.add_argument("--json", action="store_true", help="machine-readable output")
    cache.set_defaults(func=_cmd_cache)
    rules = sub.add_parser("rules", help="print the TVM claim policy: every op it claims, and its checks")
    rules.add_argument("--json", action="store_true", help="machine-readable output")
    rules.set_defaults(func=_cmd_rules)
    _add_ort_plugin_cli(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except EpError as exc:
        print(f"nxrt-tvm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
