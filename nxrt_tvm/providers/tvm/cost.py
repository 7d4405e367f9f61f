"""Measured claims: a built partition is kept only where TVM runs it at least as fast as the fallback.

`claim_policy='auto'` (the default) keeps a partition that is not the whole model where TVM measured at
least 5% faster than onnxruntime running it alone (the margin covers timing noise and the session's own
per-run cost) and by `SPLIT_US` more; a partition that is the whole model where TVM measured no more
than `WHOLE_TOLERANCE` slower, since the session then times the plan against onnxruntime on the user's
own model, which is what the user would otherwise run (`InferenceSession._check_against_whole`: Silero
VAD 16k's If branches, taken before claims, left onnxruntime 107 us on our graph against 145 us on the
model as exported), so the default never makes a model slower than onnxruntime alone;
`'cost'` keeps it only where TVM measured 5% faster plus one fallback run (the run a split adds);
`'all'` measures nothing. A timing is taken once per compiled partition and remembered with it in
the compile cache, so the choice does not flip with timing noise from one session to the next.
"""

from __future__ import annotations

from ...api.claim import Cost, DeclineSignal, Rejected
from ...runtime.measure import PartitionTiming

__all__ = ["CLAIM_POLICIES", "COST_MARGIN", "WHOLE_TOLERANCE", "SPLIT_US", "judge_cost", "cannot_win"]

CLAIM_POLICIES = ("auto", "all", "cost")

#: how much faster than the fallback a partition must measure on TVM (timing noise, the session's per-run
#: cost: the bundled model measured 285 us on TVM against 266 us in one session and 5% the other way in the
#: next, and a session adds ~20 us to a kernel's time)
COST_MARGIN = 0.05

#: how much slower a partition that is the whole model may measure and stay, for the session's check against
#: onnxruntime on the whole model to judge (more passes, and the user's own model): this only spares that
#: check a clear loser. At 5%, one measurement read SqueezeNet's plan at 1.22x onnxruntime's time (2919 us
#: against 2392 us) where the plan runs 0.89x, and the model went to onnxruntime.
WHOLE_TOLERANCE = 0.25

#: what a partition that is not the whole model costs the session besides its kernels: values handed
#: between partitions in Python and the fallback split around it (silero_vad at 2 threads: 15-20 us per
#: extra partition; its 1-node TVM partitions measured faster alone and made the model 2x slower)
SPLIT_US = 15.0


def cannot_win(
    policy: str, nodes: int, ort_alone: tuple[float, str], floor_us: float, whole: bool
) -> DeclineSignal | None:
    """A decline, before any build, for a partition onnxruntime runs alone faster than a TVM call could
    cost: a call into a TVM kernel costs at least onnxruntime's own per-run floor (measured: 4.3-4.4 us
    for one-node TVM partitions against a 3.2 us floor), so `judge_cost` would decline it whatever TVM
    measured. Silero VAD's and Magika's few-node partitions were each compiled (0.2-1 s, bisected where
    they failed) to be declined this way."""
    ort_us, sizes = ort_alone
    if policy == "auto":
        split = 0.0 if whole else SPLIT_US
        least = floor_us * (1 + COST_MARGIN) + split
        rule = f"a TVM call costs at least {floor_us:.1f} us" + (
            "" if whole else f", plus {SPLIT_US:.0f} us for the split"
        )
    else:
        least = floor_us * (1 + COST_MARGIN) + 2 * floor_us
        rule = f"a TVM call costs at least {floor_us:.1f} us, plus one fallback run"
    if ort_us >= least:
        return None
    at = f" at {sizes}" if sizes else ""
    return DeclineSignal(
        Rejected.PARTITION,
        f"claim_policy={policy!r}: onnxruntime runs its partition ({nodes} nodes) alone in "
        f"{ort_us:.1f} us{at}; {rule} (not built)",
        "partitions measured at least as fast on TVM as on the fallback",
        "use claim_policy='all' to compile it anyway",
    )


def _source(timing: PartitionTiming, remembered: bool) -> str:
    at = f" at {timing.sizes}" if timing.sizes else ""
    memo = ", remembered" if remembered else ""
    return f"measured{at}{memo}; onnxruntime alone {timing.ort_alone_us:.1f} us"


def judge_cost(
    policy: str, nodes: int, timing: PartitionTiming | None, remembered: bool, whole: bool = True
) -> tuple[Cost, DeclineSignal | None]:
    """The partition's cost for the plan, and a decline where `policy` leaves it to the fallback
    (`whole`: the partition is the whole model, so it splits nothing)."""
    if timing is None:
        return Cost(None, "unmeasured (onnxruntime cannot run it alone on representative inputs); kept"), None
    cost = Cost(timing.tvm_us, _source(timing, remembered))
    if policy == "auto":
        # Where it sits between fallback partitions, declining it also saves the switches, so this is the
        # bar. Where it is the whole model, the session's check against the user's model decides.
        if whole and timing.tvm_us <= timing.ort_alone_us * (1 + WHOLE_TOLERANCE):
            return cost, None
        if not whole and timing.tvm_us * (1 + COST_MARGIN) + SPLIT_US <= timing.ort_alone_us:
            return cost, None
        if whole:
            rule = (
                f"TVM must be at most {WHOLE_TOLERANCE:.0%} slower than onnxruntime running it alone (the "
                "session then times it against onnxruntime on the whole model)"
            )
        else:
            rule = (
                f"TVM must be {COST_MARGIN:.0%} faster than onnxruntime running it alone, plus "
                f"{SPLIT_US:.0f} us for the split it makes of the model"
            )
    else:
        # TVM must win by the timing noise and by the fallback run that splitting the graph adds: the
        # bundled model's conv partition measured level with onnxruntime, and taking it made the session
        # 1.35x slower.
        if timing.tvm_us * (1 + COST_MARGIN) + timing.floor_us <= timing.ort_us:
            return cost, None
        rule = f"TVM must be {COST_MARGIN:.0%} faster, plus one fallback run"
    at = f" at {timing.sizes}" if timing.sizes else ""
    return cost, DeclineSignal(
        Rejected.PARTITION,
        f"claim_policy={policy!r}: its partition ({nodes} nodes) measured {timing.tvm_us:.1f} us on TVM "
        f"vs {timing.ort_alone_us:.1f} us on onnxruntime alone{at} ({timing.ort_us:.1f} us net of its "
        f"{timing.floor_us:.1f} us per-run cost); {rule}",
        "partitions measured at least as fast on TVM as on the fallback",
        "tune it (nxrt-tvm tune), or use claim_policy='all' to compile it anyway",
    )
