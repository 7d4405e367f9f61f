"""The nxrt-tvm command: plan (text and JSON) and run --check, on the bundled and given models."""

from __future__ import annotations

import json

import model_zoo
import numpy as np
import onnx
import pytest

import nxrt_tvm as nx
from nxrt_tvm.cli import main


def test_plan_json_on_bundled_model(capsys):
    """The bundled model is one TVM partition: its Celu (an ONNX function op) is inlined and fused."""
    assert main(["plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [p["ep"] for p in plan["partitions"]] == ["TvmExecutionProvider"] and not plan["declines"]
    assert "Celu" not in plan["partitions"][0]["op_types"] and "Elu" in plan["partitions"][0]["op_types"]


def test_plan_timings_say_where_compile_time_went(capsys, tmp_path):
    """Per phase (a forked build's own phases under its build), per partition, and the build counts."""
    path = tmp_path / "cnn.onnx"
    onnx.save(model_zoo.cnn(), path)
    assert main(["plan", str(path), "--timings", "--json"]) == 0
    timings = json.loads(capsys.readouterr().out)["timings"]
    phases = {p: t["seconds"] for p, t in timings["phases"].items()}
    for step in ("relax import", "lower/relax passes", "lower/schedules", "lower/codegen", "export"):
        assert f"plan/proof builds/build/{step}" in phases, sorted(phases)
    assert phases["plan/proof builds/build"] >= phases["plan/proof builds/build/lower"] > 0
    assert timings["total_s"] >= phases["plan"] + phases["load"] - 1e-3  # (each rounded)
    assert timings["builds"]["builds"] == 1 and len(timings["partitions_s"]) == 1
    assert main(["plan", str(path), "--timings"]) == 0
    assert "proof builds" in capsys.readouterr().out


def test_plan_json_names_the_decline(capsys, tmp_path):
    path = tmp_path / "split.onnx"
    onnx.save(model_zoo.split_model(), path)
    assert main(["plan", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    eps = [p["ep"] for p in plan["partitions"]]
    assert eps == ["TvmExecutionProvider", "CPUExecutionProvider", "TvmExecutionProvider"]
    (decline,) = plan["declines"]
    assert decline["op_type"] == model_zoo.SPLIT_OP and decline["remediation"]


def test_plan_text_names_declines(capsys, tmp_path):
    path = tmp_path / "trap.onnx"
    onnx.save(model_zoo.cycle_trap(), path)
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "3 partitions" in out and "declined node" in out and "LpNormalization" in out


def test_run_check_with_inputs_file(capsys, tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(model_zoo.mlp(), path)
    np.savez(tmp_path / "in.npz", x=np.ones((3, 64), np.float32))
    assert (
        main(["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--check", "--repeat", "2", "--json"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["check"]["ok"] and report["outputs"]["probs"] == [3, 10]
    latency = report["latency_ms"]
    assert latency["nxrt_tvm"] > 0 and latency["onnxruntime"] > 0 and latency["repeat"] == 2
    # the times are rounded to 0.1 us: a few-microsecond model's ratio of them is off by up to that share
    rounding = 5e-5 * (1 + latency["ratio"]) / latency["onnxruntime"]
    assert latency["ratio"] == pytest.approx(
        latency["nxrt_tvm"] / latency["onnxruntime"], abs=rounding + 1e-3
    )
    assert latency["onnxruntime_only"] is False


def test_run_check_says_when_both_columns_are_onnxruntime(capsys):
    """A plan that leaves every node to the fallback times onnxruntime against itself: the ratio is
    noise (the demo printed 0.70x with onnxruntime in both columns), and the output says so."""
    assert main(["run", "--check", "--repeat", "2", "--min-subgraph-size", "1000"]) == 0
    out = capsys.readouterr().out
    assert "ratio" in out and "ratio is onnxruntime against itself" in out


def test_run_check_default_model(capsys):
    assert main(["run", "--check", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "-> ok" in out and "ratio" in out


def test_run_check_at_several_sizes_reports_the_worst_relative_error(capsys, tmp_path):
    """NAME=S1,S2 keeps the dim symbolic: one compiled session, checked against onnxruntime at each size."""
    path = tmp_path / "mlp.onnx"
    onnx.save(model_zoo.mlp(), path)
    assert main(["run", str(path), "--check", "--dim", "N=1,7,64", "--repeat", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    sizes = report["check"]["sizes"]
    assert [s["dims"] for s in sizes] == [{"N": 1}, {"N": 7}, {"N": 64}]
    for size in sizes:
        (probs,) = size["outputs"].values()
        assert size["ok"] and 0 <= probs["max_rel_err"] <= 1e-3 and probs["max_abs_diff"] >= 0
    assert report["outputs"]["probs"] == [64, 10]
    assert main(["run", str(path), "--check", "--dim", "N=2,3", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "check at N=2, probs: worst relative error" in out and "check at N=3" in out


def test_run_check_agrees_when_both_runtimes_refuse_a_size(capsys):
    """tiny_bert at sequence 128, past its position table: onnxruntime refuses it (an invalid
    Expand), and so does nxrt-tvm (its size check). (torch_encoder's empty batch no longer serves:
    onnxruntime cannot infer a Reshape's -1 from zero elements, TVM computes it from the batch.)"""
    from parity import DATA

    assert (
        main(
            [
                "run",
                str(DATA / "tiny_bert.onnx"),
                "--check",
                "--dim",
                "seq=128,8",
                "--repeat",
                "2",
                "--json",
            ]
        )
        == 0
    )
    first, second = json.loads(capsys.readouterr().out)["check"]["sizes"]
    assert first["ok"] and first["nxrt_tvm_error"] and first["onnxruntime_error"]
    assert second["ok"] and "outputs" in second


def test_several_sizes_need_check(capsys, tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(model_zoo.mlp(), path)
    assert main(["run", str(path), "--dim", "N=1,2"]) == 2
    assert "--check" in capsys.readouterr().err


def test_bad_model_is_an_error_not_a_traceback(capsys, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["plan", str(bad)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_bench_reports_ratio_and_kernel_variants(capsys, tmp_path):
    path = tmp_path / "cnn.onnx"
    onnx.save(model_zoo.cnn(), path)
    assert main(["bench", str(path), "--repeat", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["nxrt_tvm_ms"] > 0 and report["onnxruntime_ms"] > 0 and report["threads"] >= 1
    assert report["ratio"] == pytest.approx(
        report["nxrt_tvm_ms"] / report["onnxruntime_ms"], rel=0.01, abs=1e-3
    )
    assert sum(report["kernels"].values()) >= 1
    assert all(v["reason"] for vs in report["variants"].values() for v in vs)


def test_bench_profile_times_every_partition_and_kernel(capsys, tmp_path):
    """The split demo model: a TVM partition on each side of a fallback LpNormalization. Every partition is
    timed; each TVM kernel the VM calls appears with its variant, and the kernels fit in their partition."""
    path = tmp_path / "split.onnx"
    onnx.save(model_zoo.split_model(), path)
    assert main(["bench", str(path), "--repeat", "10", "--json", "--profile"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["profile"]
    assert {r["partition"] for r in rows if r["ep"] == "TvmExecutionProvider"} == set(report["variants"])
    assert {r["ep"] for r in rows} == {"TvmExecutionProvider", "CPUExecutionProvider"}
    for r in rows:
        assert r["ms"] > 0
        if r["ep"] == "CPUExecutionProvider":
            assert r["functions"] == []
            continue
        compiled = {v["name"]: v["variant"] for v in report["variants"][r["partition"]]}
        timed = {f["name"]: f["variant"] for f in r["functions"] if f["variant"] != "vm"}
        assert timed and set(timed) <= set(compiled), (timed, compiled)
        assert all(compiled[n] == v for n, v in timed.items())
        # per run, not summed over the 10 repeats; the instrument and timing noise get a wide margin
        assert sum(f["ms"] for f in r["functions"]) <= r["ms"] * 3 + 0.1
    assert main(["bench", str(path), "--repeat", "2", "--profile"]) == 0
    text = capsys.readouterr().out
    assert "profile (each partition timed alone" in text and "(CPUExecutionProvider)" in text


def test_kernel_variants_are_reported_per_partition_by_name(capsys, tmp_path):
    """A partition whose outputs nothing uses has no kernel:
    it must not shift the variants onto the wrong partition."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("LpNormalization", ["x"], ["dead"], name="unused_lpnorm"),
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Exp", ["r"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
    )
    path = tmp_path / "dead.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["run", str(path), "--json"]) == 0
    partitions = json.loads(capsys.readouterr().out)["plan"]["partitions"]
    dead, live = partitions
    assert dead["ep"] == "CPUExecutionProvider" and not dead["outputs"] and not dead["kernels"]
    assert live["ep"] == "TvmExecutionProvider" and [k["variant"] for k in live["kernels"]] == [
        "default:injective"
    ]


def test_plan_shows_kernel_variants(capsys):
    assert main(["plan"]) == 0
    assert "kernels:" in capsys.readouterr().out


def test_bad_dim_is_a_clear_error(capsys):
    assert main(["plan", "--dim", "N"]) == 2
    assert "NAME=SIZE" in capsys.readouterr().err


def test_several_sizes_of_a_dim_are_refused_where_a_command_has_no_use_for_them(capsys, tmp_path):
    """plan, bench and compile take one size per dim; several were dropped without a word."""
    for command in (["plan"], ["bench"], ["compile", "-o", str(tmp_path / "out.onnx")]):
        assert main([*command, "--dim", "N=2,3"]) == 2
        assert "takes one size per --dim (got several for N)" in capsys.readouterr().err


def test_compile_fixes_the_dims_it_is_given(tmp_path):
    """compile --dim fixes a symbolic input dim (it was ignored): the written model declares the size
    and its partition runs at it."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    src, out = tmp_path / "relu.onnx", tmp_path / "relu_ctx.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    assert main(["compile", str(src), "-o", str(out), "--dim", "n=3"]) == 0
    (x,) = onnx.load(str(out)).graph.input
    assert [d.dim_value for d in x.type.tensor_type.shape.dim] == [3, 4]
    feeds = {"x": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)}
    np.testing.assert_array_equal(
        nx.InferenceSession(str(out)).run(None, feeds)[0], np.maximum(feeds["x"], 0)
    )


def test_conv_algorithm_option_reaches_the_compile(capsys, tmp_path):
    path = tmp_path / "conv.onnx"
    onnx.save(model_zoo.conv3x3(), path)
    kernels = {}
    for algorithm in ("auto", "direct"):
        assert main(["plan", str(path), "--conv-algorithm", algorithm, "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        kernels[algorithm] = " ".join(v["name"] for p in plan["partitions"] for v in p.get("kernels", []))
    assert (
        "winograd" in kernels["auto"]
        and "winograd" not in kernels["direct"]
        and "conv2d" in kernels["direct"]
    )
    with pytest.raises(SystemExit) as exit_info:  # argparse's usage error, naming the choices
        main(["plan", str(path), "--conv-algorithm", "fft"])
    assert exit_info.value.code == 2 and "choose from 'auto', 'direct'" in capsys.readouterr().err


def test_cache_ls_and_clear(capsys, tmp_path):
    cache_dir = tmp_path / "cache"
    nx.InferenceSession(model_zoo.cnn(), provider_options=[{"cache_dir": str(cache_dir)}, {}])
    assert main(["cache", "ls", str(cache_dir), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert len(listing["entries"]) == 1 and listing["total_bytes"] == listing["entries"][0]["size"] > 0
    assert main(["cache", "clear", str(cache_dir)]) == 0
    assert f"removed {listing['total_bytes']} bytes" in capsys.readouterr().out
    assert main(["cache", "ls", str(cache_dir)]) == 0
    assert "0 compiled partition(s), 0 bytes" in capsys.readouterr().out
    assert main(["cache", "ls", str(tmp_path / "missing")]) == 2
    assert "not a compile cache folder" in capsys.readouterr().err


def test_rules_prints_the_claim_policy_table(capsys):
    from nxrt_tvm.frontend import convert_map

    assert main(["rules", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_op = {r["op_type"]: r for r in rows}
    assert set(by_op) == set(convert_map())  # every op the frontend converts, each with what guards it
    assert all(r["guards"] for r in rows)
    assert by_op["Reshape"]["import_time_inputs"] == [1] and "runtime shape" in by_op["Reshape"]["guards"]
    assert "index guard" in by_op["Gather"]["guards"] and by_op["Gather"]["since_opset"] >= 1
