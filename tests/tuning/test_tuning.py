"""Tuning with tiny budgets: a valid per-device database, the default rules as the baseline record, resume,
device keys, records applied (exact and by anchor op), RPC on loopback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import model_zoo
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from parity import assert_parity, ort_run

import nxrt_tvm as nx
from nxrt_tvm.lower.pipeline import RULE_KEPT
from nxrt_tvm.lower.target import make_target
from nxrt_tvm.tuning import device_key, open_database

TRIALS = 4


def _matmul_model(epilogue: str | None = None, rows: int | str = 32, cols: int = 48):
    """x [rows, 64] @ w [64, cols], then an optional elementwise epilogue (fused into the same kernel)."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((64, cols)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y" if epilogue is None else "m"])]
    if epilogue is not None:
        nodes.append(helper.make_node(epilogue, ["m"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _record_applied(variant) -> bool:
    """A kernel ran its tuning record: a searched schedule, or the default rule's where none beat it."""
    return variant.variant.startswith("tuned") or variant.reason.startswith(RULE_KEPT)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    logs = tmp_path_factory.mktemp("tuning_logs")
    report = nx.tune_model(
        _matmul_model(), trials=TRIALS, trials_per_iter=TRIALS, log_dir=logs, progress=False
    )
    return logs, report


@pytest.fixture(scope="module")
def tuned_sizes(tmp_path_factory):
    """Records of a matmul over a symbolic row count `n`, tuned at n=32 and n=8 (one trial each)."""
    logs = tmp_path_factory.mktemp("sized_logs")
    report = nx.tune_model(
        _matmul_model(rows="n"),
        trials=1,
        trials_per_iter=1,
        log_dir=logs,
        free_dims={"n": [32, 8]},
        progress=False,
    )
    return logs, report


def test_tuning_at_named_sizes_tunes_each_and_keeps_the_sizes(tuned_sizes):
    _, report = tuned_sizes
    assert len(report.tasks) == 2  # the kernel at each size
    assert json.loads((report.directory / "sizes.json").read_text()) == {"n": [8, 32]}
    with pytest.raises(nx.InvalidProviderOptions, match=r"free_dims\['n'\]"):
        nx.tune_model(_matmul_model(rows="n"), free_dims={"n": [0]}, progress=False)


def test_a_symbolic_session_runs_the_build_tuned_at_the_call_s_sizes(tuned_sizes, tmp_path, caplog):
    """A session over the symbolic model builds the partition at n=32 and n=8 too, with their records,
    and runs the build whose sizes a call has (its kernels' names carry the sizes), the symbolic one
    otherwise; the EPContext keeps the symbolic build and says so."""
    from nxrt_tvm.api.tensor import TensorView
    from nxrt_tvm.runtime.dispatch import SizeDispatchKernel

    logs, _ = tuned_sizes
    model = _matmul_model(rows="n")
    sess = nx.InferenceSession(model, provider_options=[{"tuning_logs": str(logs)}, {}])
    (kernel,) = sess.kernels().values()
    assert isinstance(kernel, SizeDispatchKernel)
    variants = {v.name.partition("@")[2]: v for v in kernel.variants()}
    assert sorted(variants) == ["", "n=32", "n=8"]
    assert not _record_applied(variants[""])
    assert _record_applied(variants["n=32"]) and _record_applied(variants["n=8"])
    rng = np.random.default_rng(3)
    for rows, label in ((32, "@n=32"), (8, "@n=8"), (5, None)):
        feeds = {"x": rng.standard_normal((rows, 64)).astype(np.float32)}
        assert_parity(sess.run(None, feeds), ort_run(model, feeds), rtol=1e-5, atol=1e-5)
        ran = kernel.function_times([TensorView(feeds["x"])], 1)
        kernels = [name for name in ran if not name.startswith("vm.")]
        assert kernels and all(name.endswith(label) if label else "@" not in name for name in kernels)

    out = tmp_path / "ctx.onnx"
    with caplog.at_level("WARNING", logger="nxrt_tvm.aot"):
        nx.compile_model(model, out, tuning_logs=logs, progress=False)
    assert "tuned at n=8; n=32" in caplog.text and "keeps the symbolic build" in caplog.text
    feeds = {"x": rng.standard_normal((32, 64)).astype(np.float32)}
    assert_parity(nx.InferenceSession(str(out)).run(None, feeds), ort_run(model, feeds), rtol=1e-5, atol=1e-5)


def test_small_budget_writes_a_valid_database(tuned):
    logs, report = tuned
    key = device_key(make_target("llvm"))
    assert report.device_key == key and report.directory == logs / key
    assert len(report.tasks) == 1 and report.trials == TRIALS and report.tasks[0].best_us > 0
    db = open_database(logs, make_target("llvm"))
    assert db is not None and len(db) >= 1
    with open(report.directory / "database_tuning_record.json") as f:
        records = [json.loads(line) for line in f if line.strip()]
    assert records and all(len(r) == 2 for r in records)  # [workload index, record]


@pytest.mark.parametrize("ratio,wins", [(0.97, "rule"), (0.90, "searched")])
def test_a_searched_record_must_beat_the_rule_by_the_margin(tuned, tmp_path, ratio, wins):
    """Within SEARCHED_MARGIN of the rule's time a searched record is noise, not a win: the rule stays."""
    from tvm.s_tir import meta_schedule as ms

    from nxrt_tvm.lower.tuned import SEARCHED_MARGIN, TuningDatabase, is_searched

    assert 1 - SEARCHED_MARGIN == pytest.approx(0.95)
    logs, report = tuned
    source = open_database(logs, make_target("llvm"))
    rule = source.baseline.get_all_tuning_records()[0]
    searched = next(r for r in source.database.get_all_tuning_records() if is_searched(r.trace))
    rule_s = float(np.mean([float(t) for t in rule.run_secs]))
    directory = tmp_path / report.device_key
    for folder, record, secs in (
        (directory, searched, rule_s * ratio),
        (directory / "default_schedules", rule, rule_s),
    ):
        folder.mkdir(parents=True)
        db = ms.database.JSONDatabase(
            str(folder / "database_workload.json"), str(folder / "database_tuning_record.json")
        )
        workload = db.commit_workload(rule.workload.mod)
        db.commit_tuning_record(
            ms.database.TuningRecord(record.trace, workload, [secs], record.target, record.args_info)
        )
    best = TuningDatabase(directory, report.device_key).best(rule.workload.mod)
    assert best.how == "exact" and is_searched(best.record.trace) == (wins == "searched")


def test_applying_reads_each_workloads_fastest_record_only(tuned):
    """Sessions open the database `fastest_only`: one record per workload, the one the whole database
    ranks first, so every kernel gets the record it got from MetaSchedule's whole database; read-only."""
    from nxrt_tvm.lower.tuned import TuningDatabase

    logs, report = tuned
    whole = TuningDatabase(report.directory, report.device_key)
    fastest = TuningDatabase(report.directory, report.device_key, fastest_only=True)
    assert len(whole.database) == TRIALS  # every candidate the search measured
    assert len(fastest.database) == 1 and len(fastest.baseline) == 1
    mod = whole.database.get_all_tuning_records()[0].workload.mod
    top = whole.database.get_top_k(whole.database.commit_workload(mod), 1)[0]
    rule = whole.baseline.get_top_k(whole.baseline.commit_workload(mod), 1)[0]
    secs = [[float(s) for s in r.run_secs] for r in fastest.all_records()]
    assert secs == [[float(s) for s in r.run_secs] for r in (top, rule)]
    for find in ("best", "exact", "anchor"):  # anchor: the workload is its own anchor class's only member
        a, b = getattr(whole, find)(mod), getattr(fastest, find)(mod)
        assert (a.how, a.mean_us, str(a.record.trace)) == (b.how, b.mean_us, str(b.record.trace))
    with pytest.raises(RuntimeError, match="read-only"):
        fastest.commit_searched(mod, top.trace, top.run_secs, make_target("llvm"), top.args_info)


def test_opening_parses_no_record_until_a_kernel_asks(tuned, monkeypatch):
    """Parsing a record replays its trace (about 5 ms each; 1.3 s of every session with the shipped logs):
    a session opens its records unparsed, and parses only the one a kernel matches."""
    from tvm.s_tir import meta_schedule as ms

    from nxrt_tvm.lower.tuned import TuningDatabase

    logs, report = tuned
    mod = TuningDatabase(report.directory, report.device_key).all_records()[0].workload.mod
    parsed = []
    from_json = ms.database.TuningRecord.from_json
    monkeypatch.setattr(
        ms.database.TuningRecord, "from_json", staticmethod(lambda *a: parsed.append(1) or from_json(*a))
    )
    fastest = TuningDatabase(report.directory, report.device_key, fastest_only=True)
    assert parsed == []
    assert fastest.best(mod) is not None
    assert len(parsed) == 2  # the searched record and the rule's, to compare them
    fastest.best(mod)
    assert len(parsed) == 2  # each parsed once


def test_tuning_writes_an_index_that_sessions_read_instead_of_every_candidate(tuned, monkeypatch):
    """MetaSchedule keeps every candidate it measured (35 MB in the shipped Zen 4 logs: 0.2 s of JSON in
    every session): tuning writes each workload's fastest beside them, and opening reads only that, with
    the same answers as from the candidates."""
    from nxrt_tvm.lower import tuned as tuned_module
    from nxrt_tvm.lower.tuned import INDEX_FILE, TuningDatabase

    logs, report = tuned
    assert (report.directory / INDEX_FILE).is_file()
    assert (report.directory / "default_schedules" / INDEX_FILE).is_file()
    mod = TuningDatabase(report.directory, report.device_key).all_records()[0].workload.mod
    read = []
    lines = tuned_module._lines
    monkeypatch.setattr(tuned_module, "_lines", lambda path: read.append(path.name) or lines(path))
    indexed = TuningDatabase(report.directory, report.device_key, fastest_only=True).best(mod)
    assert read == ["database_workload.json"] * 2  # the records (every candidate) were not read
    monkeypatch.setattr(tuned_module, "_read_index", lambda directory, digest: None)
    scanned = TuningDatabase(report.directory, report.device_key, fastest_only=True).best(mod)
    assert "database_tuning_record.json" in read
    assert (indexed.how, indexed.mean_us, str(indexed.record.trace)) == (
        scanned.how,
        scanned.mean_us,
        str(scanned.record.trace),
    )


def test_an_index_older_than_its_database_is_not_read(tuned, tmp_path):
    """Records added after the index was written (a tuning run killed before its end) count: the index
    no longer matches the files, so the files are read."""
    import shutil

    from nxrt_tvm.lower.tuned import TuningDatabase

    logs, report = tuned
    directory = tmp_path / report.device_key
    shutil.copytree(report.directory, directory)
    whole = TuningDatabase(directory, report.device_key)
    top = next(r for r in whole.all_records() if whole.top_searched(r.workload.mod) is not None)
    mod = top.workload.mod
    best = whole.top_searched(mod)
    faster = [float(s) / 10 for s in best.run_secs]
    whole.commit_searched(mod, best.trace, faster, make_target("llvm"), best.args_info)
    opened = TuningDatabase(directory, report.device_key, fastest_only=True).top_searched(mod)
    assert [float(s) for s in opened.run_secs] == pytest.approx(faster)


def test_default_rule_is_the_baseline_record(tuned):
    """The rules' schedule is measured like a trial: the best record is never slower than it."""
    logs, report = tuned
    task = report.tasks[0]
    assert task.rule_us is not None and task.rule_us > 0
    assert task.best_us <= task.rule_us and task.speedup >= 1.0
    assert task.best_is_rule == (task.best_us == task.rule_us)
    state = json.loads((report.directory / "nxrt_tuning_state.json").read_text())
    assert state[task.workload]["rule"] == "matmul" and state[task.workload]["trials"] == TRIALS
    # kept beside MetaSchedule's database, in its format, not inside it (the search seeds itself from its own)
    baseline = report.directory / "default_schedules" / "database_tuning_record.json"
    assert baseline.is_file() and len(baseline.read_text().splitlines()) == 1


def test_the_rule_is_measured_where_it_packs_the_weight_padded(tmp_path):
    """1001 columns: no register tile divides them, so the matmul rule packs the weight padded to whole
    tiles, a copy through a select. MetaSchedule's removal of the packing for measurement took only plain
    copies: the rule went unmeasured, and compile applied any searched record, however slow."""
    report = nx.tune_model(
        _matmul_model(cols=1001), trials=1, trials_per_iter=1, log_dir=tmp_path, progress=False
    )
    (task,) = report.tasks
    assert task.rule_us is not None and task.rule_us > 0
    state = json.loads((report.directory / "nxrt_tuning_state.json").read_text())
    assert state[task.workload]["rule"] == "matmul"


def test_resume_adds_nothing_for_finished_tasks(tuned):
    logs, _ = tuned
    before = (logs / device_key(make_target("llvm")) / "database_tuning_record.json").read_bytes()
    started = time.perf_counter()
    again = nx.tune_model(
        _matmul_model(), trials=TRIALS, trials_per_iter=TRIALS, log_dir=logs, progress=False
    )
    assert again.trials == 0 and all(t.skipped for t in again.tasks)
    assert (logs / device_key(make_target("llvm")) / "database_tuning_record.json").read_bytes() == before
    assert time.perf_counter() - started < 60


def test_resume_after_a_run_killed_mid_task_keeps_its_trials(tuned, tmp_path):
    """A kill inside a task's search leaves its records but
    not the state's count: the database's count is used."""
    logs, report = tuned
    copy = tmp_path / "logs"
    shutil.copytree(logs, copy)
    state_path = copy / report.device_key / "nxrt_tuning_state.json"
    state = json.loads(state_path.read_text())
    for entry in state.values():
        entry["trials"] = 0  # as if killed before the task's end was written
    state_path.write_text(json.dumps(state))
    again = nx.tune_model(
        _matmul_model(), trials=TRIALS, trials_per_iter=TRIALS, log_dir=copy, progress=False
    )
    assert again.trials == 0 and all(t.skipped for t in again.tasks)


def test_a_changed_default_rule_is_measured_again(tuned, tmp_path):
    """A baseline measured on another version of the rules (or code generation) is
    stale: the next run measures the rule again (a new baseline record) and the best
    searched schedule beside it (one more search record), and searches nothing more."""
    logs, report = tuned
    copy = tmp_path / "logs"
    shutil.copytree(logs, copy)
    searched = copy / report.device_key / "database_tuning_record.json"
    records = len(searched.read_text().splitlines())
    state_path = copy / report.device_key / "nxrt_tuning_state.json"
    state = json.loads(state_path.read_text())
    (entry,) = state.values()
    assert entry["rule_digest"]
    entry["rule_digest"] = "an-older-rule"
    state_path.write_text(json.dumps(state))
    again = nx.tune_model(
        _matmul_model(), trials=TRIALS, trials_per_iter=TRIALS, log_dir=copy, progress=False
    )
    assert again.trials == 0
    baseline = copy / report.device_key / "default_schedules" / "database_tuning_record.json"
    assert len(baseline.read_text().splitlines()) == 2
    assert len(searched.read_text().splitlines()) == records + 1
    assert json.loads(state_path.read_text())[again.tasks[0].workload]["rule_digest"] != "an-older-rule"


def test_baselines_are_stale_when_code_generation_changes(monkeypatch):
    from nxrt_tvm.tuning import tune

    found = tune._rule_schedule(_tasks(_matmul_model())[0], make_target("llvm"))
    entry = {"rule_us": 1.0, "rule_digest": tune.rule_digest(found[1])}
    assert not tune._stale_baseline(entry, found)
    monkeypatch.setattr(tune, "MEASURED_PIPELINE", "another code generation")
    assert tune._stale_baseline(entry, found)


def test_time_budget_cuts_a_task_to_the_trials_that_fit():
    """At this run's measured rate: 100 s left at 2.5 s a trial fit 40 trials, 32 in rounds of 16."""
    from nxrt_tvm.tuning.tune import _trials_in_budget

    assert _trials_in_budget(224, 100.0, 2.5, 16) == 32
    assert _trials_in_budget(224, 10.0, 2.5, 16) == 16  # one round while time is left
    assert _trials_in_budget(224, -1.0, 2.5, 16) == 0
    assert _trials_in_budget(224, 1000.0, 2.5, 16) == 224
    assert _trials_in_budget(304, 840.0, None, 16) == 304  # the first task: no rate measured yet
    assert _trials_in_budget(224, None, 2.5, 16) == 224  # no budget


def test_records_apply_to_this_device_only(tuned, tmp_path):
    logs, _ = tuned
    model = _matmul_model()
    feeds = {"x": np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)}
    sess = nx.InferenceSession(model, provider_options=[{"tuning_logs": str(logs)}, {}])
    variants = [v for k in sess.kernels().values() for v in k.variants()]
    assert len(variants) == 1 and _record_applied(variants[0]), variants
    assert_parity(sess.run(None, feeds), ort_run(model, feeds), rtol=1e-4, atol=1e-4)

    # The same records under another device's key must not be applied here.
    other = tmp_path / "logs"
    shutil.copytree(logs / device_key(make_target("llvm")), other / "llvm-x86_64-othercpu-2c-00000000")
    sess = nx.InferenceSession(model, provider_options=[{"tuning_logs": str(other)}, {}])
    assert not any(_record_applied(v) for k in sess.kernels().values() for v in k.variants())


def _key_for(features: frozenset[str], mcpu: str, logs, source) -> str:
    """Another device's key folder holding `source`'s records, declared as built for `features`."""
    from nxrt_tvm.lower.device_key import DEVICE_FILE, _digest
    from nxrt_tvm.lower.target import host_arch

    key = f"llvm-{host_arch()}-{mcpu}-2c-{_digest(features)}"
    shutil.copytree(source, logs / key)
    (logs / key / DEVICE_FILE).write_text(json.dumps({"key": key, "features": sorted(features)}))
    return key


def test_records_of_a_compatible_key_apply_with_their_provenance(tuned, tmp_path):
    """Where this host's key has no records, a key whose ISA features are all here applies (closest
    first); a key needing one feature more is never applied, however close its name."""
    from nxrt_tvm.epcontext.codec import decode_node
    from nxrt_tvm.lower.device_key import compatible_keys, refused_keys
    from nxrt_tvm.lower.target import hardware_of

    logs, _ = tuned
    target = make_target("llvm")
    host = frozenset(hardware_of(target)[1])
    own = logs / device_key(target)
    model = _matmul_model()
    feeds = {"x": np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)}

    wider = tmp_path / "wider"
    refused = _key_for(host | {"amx-tile"}, str(target.attrs["mcpu"]), wider, own)  # one more feature
    assert compatible_keys(wider, target) == []
    assert "need amx-tile, which this CPU" in refused_keys(wider, target)[refused]  # said, in `plan`
    sess = nx.InferenceSession(model, provider_options=[{"tuning_logs": str(wider)}, {}])
    assert not any(_record_applied(v) for k in sess.kernels().values() for v in k.variants())

    fleet = tmp_path / "fleet"
    narrower = _key_for(host - {sorted(host)[0]}, "othercpu", fleet, own)
    _key_for(host | {"amx-tile"}, "futurecpu", fleet, own)
    assert [k.key for k in compatible_keys(fleet, target)] == [narrower]
    sess = nx.InferenceSession(model, provider_options=[{"tuning_logs": str(fleet)}, {}])
    (variant,) = [v for k in sess.kernels().values() for v in k.variants()]
    assert _record_applied(variant) and narrower in f"{variant.variant} {variant.reason}", variant
    assert_parity(sess.run(None, feeds), ort_run(model, feeds), rtol=1e-4, atol=1e-4)

    out = tmp_path / "ctx.onnx"
    nx.compile_model(model, out, tuning_logs=fleet)
    (node,) = [n for n in onnx.load(str(out)).graph.node if n.op_type == "EPContext"]
    assert decode_node(node, tmp_path).tuning_sources == (narrower,)


def test_revalidate_measures_transferred_records_here_once(tuned, tmp_path, capsys):
    """--revalidate measures a compatible key's records and the default rule on this host, writes this
    host's key with both (which compile then prefers), and a second run measures nothing."""
    from nxrt_tvm.cli import main as cli
    from nxrt_tvm.lower.target import hardware_of
    from nxrt_tvm.lower.tuned import TuningDatabase
    from nxrt_tvm.tuning.revalidate import revalidate

    logs, _ = tuned
    target = make_target("llvm")
    fleet = tmp_path / "fleet"
    source = _key_for(
        frozenset(hardware_of(target)[1]) - {"64bit"}, "othercpu", fleet, logs / device_key(target)
    )
    (fleet / source / "sizes.json").write_text('{"n": [4, 16]}')
    report = revalidate(log_dir=fleet, progress=False)
    assert report.sources == (source,) and (report.measured, report.done_before, report.failed) == (1, 0, 0)
    own = TuningDatabase(fleet / device_key(target), device_key(target))
    assert own.sizes == {"n": (4, 16)}  # the sizes the records were tuned at come with them
    assert own.baseline is not None and len(own.baseline) == 1 and len(own.database) >= 1

    model = _matmul_model()
    sess = nx.InferenceSession(model, provider_options=[{"tuning_logs": str(fleet)}, {}])
    (variant,) = [v for k in sess.kernels().values() for v in k.variants()]
    assert _record_applied(variant) and source not in f"{variant.variant} {variant.reason}", variant

    again = revalidate(log_dir=fleet, progress=False)
    assert (again.measured, again.done_before) == (0, 1)
    assert cli(["tune", "--revalidate", "--log-dir", str(fleet), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measured"] == 0
    assert cli(["tune", "model.onnx", "--revalidate", "--log-dir", str(fleet)]) == 2
    assert "takes no model" in capsys.readouterr().err


def _variants_with_logs(model, feeds, logs) -> list[str]:
    """Compile with `logs`, check the session against onnxruntime, and return its kernels' variants."""
    sess = nx.InferenceSession(model, provider_options=[{"tuning_logs": str(logs)}, {}])
    assert_parity(sess.run(None, feeds), ort_run(model, feeds), rtol=1e-4, atol=1e-4)
    return [v.variant for k in sess.kernels().values() for v in k.variants()]


def test_record_of_the_same_anchor_op_is_transferred(tuned, tmp_path):
    """A searched record of MatMul transfers to MatMul+Relu (same anchor block, another epilogue), exactly."""
    from nxrt_tvm.lower.tuned import TuningDatabase, is_searched

    _, report = tuned
    directory = report.directory
    # Keep only searched records, so the transfer is tested even where the rule measured fastest.
    db = TuningDatabase(directory, report.device_key)
    searched = [r for r in db.database.get_all_tuning_records() if is_searched(r.trace)]
    assert searched, "4 trials produced no searched record"
    only = tmp_path / "searched" / report.device_key
    only.mkdir(parents=True)
    kept = TuningDatabase(only, report.device_key)
    for record in searched:
        kept.database.commit_tuning_record(
            type(record)(
                record.trace,
                kept.database.commit_workload(record.workload.mod),
                record.run_secs,
                record.target,
                record.args_info,
            )
        )
    model = _matmul_model("Relu")
    feeds = {"x": np.random.default_rng(2).standard_normal((32, 64)).astype(np.float32)}
    assert _variants_with_logs(model, feeds, only.parent) == ["tuned:anchor"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(port: int, key: str, timeout: float = 60.0) -> None:
    """Until the tracker lists a free server for `key` (starting Python processes takes a while here)."""
    from tvm import rpc

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            summary = rpc.connect_tracker("127.0.0.1", port).summary()
            if any(key in str(q) for q in summary.get("queue_info", {})):
                return
        except Exception:  # the tracker is still starting
            pass
        time.sleep(1)
    raise AssertionError(f"no RPC server registered under {key!r} within {timeout} s")


@pytest.mark.slow  # a second whole tuning run (about 55 s on 2 cores); the local path runs by default
def test_rpc_tuning_on_loopback(tmp_path):
    port = _free_port()
    # Own process groups: the server forks popen workers that outlive a plain terminate().
    tracker = subprocess.Popen(  # loopback only: both would bind 0.0.0.0 unless told
        [
            sys.executable,
            "-m",
            "tvm.exec.rpc_tracker",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--port-end",
            str(port + 1),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    server = None
    try:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tvm.exec.rpc_server",
                "--host",
                "127.0.0.1",
                "--tracker",
                f"127.0.0.1:{port}",
                "--key",
                "nxrt-test",
                "--custom-addr",
                "127.0.0.1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _wait_for_server(port, "nxrt-test")
        report = nx.tune_model(
            _matmul_model(),
            trials=TRIALS,
            trials_per_iter=TRIALS,
            log_dir=tmp_path,
            progress=False,
            rpc_tracker=f"127.0.0.1:{port}",
            rpc_key="nxrt-test",
        )
        assert report.trials == TRIALS and report.tasks[0].best_us > 0
    finally:
        for proc in (server, tracker):
            if proc is not None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)


def test_bad_rpc_arguments():
    with pytest.raises(nx.InvalidProviderOptions, match="HOST:PORT"):
        nx.tune_model(_matmul_model(), trials=1, rpc_tracker="localhost", rpc_key="k", progress=False)


def _layer_norm_model(input_name: str):
    """LayerNormalization of [64, 128]: its TIR block names
    follow the input's name (`x_sum`, `features_sum`)."""
    rng = np.random.default_rng(0)
    scale = numpy_helper.from_array(rng.standard_normal(128).astype(np.float32), "scale")
    bias = numpy_helper.from_array(rng.standard_normal(128).astype(np.float32), "bias")
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", [input_name, "scale", "bias"], ["y"], axis=-1)],
        "ln",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [64, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 128])],
        [scale, bias],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _tasks(model, **tvm_options):
    from nxrt_tvm.graph.model import load_model
    from nxrt_tvm.partition.plan import make_plan
    from nxrt_tvm.providers.cpu import CPUExecutionProvider
    from nxrt_tvm.providers.tvm import TvmExecutionProvider
    from nxrt_tvm.tuning.tasks import extract_tasks

    graph, target = load_model(model), make_target("llvm")
    ep = TvmExecutionProvider(target=target, **tvm_options)
    plan = make_plan(graph, [ep, CPUExecutionProvider()])
    return extract_tasks([(graph, p) for p in plan.partitions if p.ep == ep.ep_id], target, ep.lowering)


def test_searched_record_replays_on_a_kernel_whose_names_differ(tmp_path):
    """The database matches workloads structurally (names ignored), but a trace finds blocks by name: a record
    made on one model's LayerNorm must replay on another's, whose input (so whose block names) differ.

    The record is a searched-looking trace (it samples) written as a search would, so no tuning run is needed.
    """
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from nxrt_tvm.lower.tuned import TuningDatabase

    (task,) = _tasks(_layer_norm_model("x"))
    assert [task.workload] == [
        t.workload for t in _tasks(_layer_norm_model("features"))
    ]  # one workload, two names
    mod = task.extracted.dispatched[0]
    sch = s_tir.Schedule(mod)
    block = sch.get_sblock("x_sum")
    outer, _ = sch.get_loops(block)
    sch.parallel(outer)
    sch.sample_categorical([1, 2], [0.5, 0.5])  # what makes a trace a search's
    directory = tmp_path / "logs" / device_key(make_target("llvm"))
    directory.mkdir(parents=True)
    db = TuningDatabase(directory, directory.name).database
    db.commit_tuning_record(
        ms.database.TuningRecord(
            sch.trace,
            db.commit_workload(mod),
            [1e-6],
            make_target("llvm"),
            ms.arg_info.ArgInfo.from_prim_func(mod["main"]),
        )
    )
    model = _layer_norm_model("features")
    feeds = {"features": np.random.default_rng(3).standard_normal((64, 128)).astype(np.float32)}
    assert _variants_with_logs(model, feeds, directory.parent) == ["tuned"]


def test_tasks_follow_the_conv_algorithm_compiled_with(tmp_path):
    """Winograd and direct convolutions are different kernels: tune with the option you compile with.
    Winograd's tunable kernel is its batched matmul; its transforms reduce nothing (sums unrolled over
    constant matrices) and keep their own rule, like other data movement."""
    auto = {t.name for t in _tasks(model_zoo.conv3x3())}
    direct = {t.name for t in _tasks(model_zoo.conv3x3(), conv_algorithm="direct")}
    assert any("matmul" in n for n in auto) and not any("conv2d" in n for n in auto), auto
    assert any("conv2d" in n for n in direct) and not any("matmul" in n for n in direct), direct
    with pytest.raises(nx.InvalidProviderOptions, match="conv_algorithm"):
        nx.tune_model(
            model_zoo.conv3x3(),
            trials=TRIALS,
            conv_algorithm="fft",
            log_dir=tmp_path / "logs",
            progress=False,
        )
    assert not (tmp_path / "logs").exists()  # bad options fail before anything is written
