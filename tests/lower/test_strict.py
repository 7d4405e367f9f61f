"""Our own bugs surface: a failing pass or rule raises InternalError in strict mode (the suite's),
and is a warning naming it (plus a decline or TVM's default schedule) in normal use."""

from __future__ import annotations

import logging

import model_zoo
import numpy as np
import pytest
from conftest import assert_parity, ort_run

import nxrt_tvm as nx
from nxrt_tvm.lower import precision, strict
from nxrt_tvm.lower.schedules import matmul

OPTIONS = [{"compile_isolation": "none"}, {}]


def _bug(*_args, **_kwargs):
    raise ZeroDivisionError("a bug of ours")


def _break_matmul_rule(monkeypatch):
    """The rule's own code fails (arithmetic on a None vector width): a bug, not a TVM refusal."""
    monkeypatch.setattr(matmul, "vector_lanes", lambda _target: None)


def _feeds():
    return {"x": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}


def test_the_suite_runs_strict():
    assert strict.strict()


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_rule_bug_raises_in_strict_mode(monkeypatch, isolation):
    _break_matmul_rule(monkeypatch)
    with pytest.raises(nx.InternalError, match=r"schedule rule 'matmul' on kernel 'fused_matmul.*TypeError"):
        nx.InferenceSession(model_zoo.mlp(batch=4), provider_options=[{"compile_isolation": isolation}, {}])


def test_rule_bug_is_a_warning_and_the_default_schedule_in_normal_use(monkeypatch, caplog):
    monkeypatch.setenv(strict.STRICT_ENV, "0")
    _break_matmul_rule(monkeypatch)
    model = model_zoo.mlp(batch=4)
    with caplog.at_level(logging.WARNING, logger="nxrt_tvm.lower.strict"):
        sess = nx.InferenceSession(model, provider_options=OPTIONS)
    assert "schedule rule 'matmul' on kernel" in caplog.text and "TypeError" in caplog.text
    variants = [v for vs in sess.kernel_variants().values() for v in vs]
    assert not any(v.variant == "default:matmul" for v in variants), variants
    assert_parity(sess.run(None, _feeds()), ort_run(model, _feeds()))


def test_pass_bug_raises_in_strict_mode(monkeypatch):
    monkeypatch.setattr(precision, "exact_vars", _bug)
    with pytest.raises(nx.InternalError, match=r"pass precision\.PreciseFastMath\.transform_module"):
        nx.InferenceSession(model_zoo.mlp(batch=4), provider_options=OPTIONS)


def test_pass_bug_is_a_warning_and_a_decline_in_normal_use(monkeypatch, caplog):
    monkeypatch.setenv(strict.STRICT_ENV, "0")
    monkeypatch.setattr(precision, "exact_vars", _bug)
    model = model_zoo.mlp(batch=4)
    with caplog.at_level(logging.WARNING, logger="nxrt_tvm.lower.strict"):
        sess = nx.InferenceSession(model, provider_options=OPTIONS)
    assert "pass precision.PreciseFastMath.transform_module raised ZeroDivisionError" in caplog.text
    assert_parity(sess.run(None, _feeds()), ort_run(model, _feeds()))
