"""Differential tests: the torch/transformers exports in tests/data at many sizes against onnxruntime.

Default options, dynamic batch and sequence (no overrides): one compiled session per export
serves every size. Each export runs in a child process (`export_sizes.py`), so a size that
crashes the process fails its test instead of killing the run. Per size:
- onnxruntime runs: nxrt-tvm runs and its worst error relative to each output's scale is at
  most 1e-4 (float32 measures 1e-7..4e-7). Int8 with dynamic quantisation: an activation
  within an ulp of a rounding half-point quantises to either neighbour depending on summation
  order (onnxruntime on another CPU differs the same way), and that one step shows in its row:
  at most 1% of the outputs may be off by more than 1e-3, none by more than 5e-2 (measured:
  2 rows of 512 at 1.1e-2, every other size 2e-7);
- onnxruntime refuses the size (a sequence past BERT's 64 positions): nxrt-tvm raises a typed
  `EpError` too, never returns numbers and never dies by a signal. One exception: an empty batch or
  sequence, which onnxruntime refuses only because its Reshape cannot infer a -1 dim from zero
  elements, while nxrt-tvm knows that dim from the model (64 / 16 heads) and returns the empty outputs
  (every output zero elements; BERT's pooler, which reads token 0, still raises IndexOutOfBounds).

The sizes cover batch 1 and 2 (and 0), sequence 1, 8, 64 and 512 where the model allows, zero-size
dims, too-long and far-too-long sequences. `tiny_t5_int8` is a T5 encoder with relative position
buckets (a Log cast to an integer for distances past 8) and int8 dynamic quantisation, the
structure of the real model that once gave wrong numbers past sequence 8. The slow run (-m slow)
adds random sizes and seeds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("export_sizes.py")
#: export -> (worst error relative to an output's scale, share of elements allowed past 1e-3 of it)
TOLERANCE = {"tiny_bert": (1e-4, 0.0), "torch_encoder": (1e-4, 0.0), "tiny_t5_int8": (5e-2, 0.01)}

#: export -> (batch, seq) sizes; torch_encoder's sequence is fixed at 16 (its seq entry is unused)
SIZES = {
    "tiny_bert": [
        (1, 1),
        (1, 8),
        (2, 8),
        (3, 12),
        (1, 64),
        (2, 64),
        (1, 65),
        (1, 128),
        (2, 4096),
        (0, 8),
        (1, 0),
    ],
    "tiny_t5_int8": [(1, 1), (1, 8), (2, 16), (1, 64), (2, 64), (1, 512), (0, 8), (1, 0)],
    "torch_encoder": [(1, 16), (2, 16), (5, 16), (0, 16)],
}


def run_sizes(name: str, sizes, cache_dir: str, seed: int = 0) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(CHILD), name, json.dumps(sizes), str(seed), cache_dir],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, (
        f"{name}: the process died (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-1500:]}"
    )
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def check(name: str, rows: list[dict], sizes) -> None:
    assert [tuple(r["size"]) for r in rows] == [tuple(s) for s in sizes], rows
    table = "\n".join(
        f"  {r['size']}: onnxruntime {r['want'][:60]!r}, nxrt-tvm {r['got'][:90]!r}, "
        f"rel {r['rel']}, off {r['off']}"
        for r in rows
    )
    worst, share = TOLERANCE[name]
    for r in rows:
        if r["want"] == "ok":
            assert r["got"] == "ok" and r["rel"] <= worst and r["off"] <= share, (
                f"{name} at {r['size']}:\n{table}"
            )
        elif r["got"] == "ok":  # only an empty input's empty result, where onnxruntime's Reshape balks
            assert 0 in r["size"] and "Reshape" in r["want"] and not any(r["elements"]), (
                f"{name} at {r['size']}: onnxruntime refuses it, nxrt-tvm returned numbers\n{table}"
            )


@pytest.mark.parametrize("name", sorted(SIZES))
def test_export_at_many_sizes(name, exports_cache):
    check(name, run_sizes(name, SIZES[name], exports_cache), SIZES[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SIZES))
def test_export_at_random_sizes_and_seeds(name, exports_cache):
    """Hypothesis draws 24 sizes and a seed per export (derandomized: the same draws every run)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    seq = st.just(16) if name == "torch_encoder" else st.integers(1, 64 if name == "tiny_bert" else 600)
    drawn = []

    @settings(
        max_examples=1,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(st.tuples(st.integers(1, 4), seq), min_size=24, max_size=24), st.integers(0, 2**16))
    def draw(sizes, seed):
        drawn.append((sizes, seed))

    draw()
    sizes, seed = drawn[0]
    check(name, run_sizes(name, sizes, exports_cache, seed), sizes)
