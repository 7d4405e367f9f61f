#!/usr/bin/env python
"""Export the small torch encoder used by the tests to ONNX.

Writes tests/data/torch_encoder.onnx and tests/data/torch_encoder.npz
(``x``: an input, ``y``: torch's output for it) and checks that
onnxruntime reproduces torch's output (atol 1e-4).

Model: TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128,
batch_first=True) -> mean over the sequence -> Linear(64, 10).
Input ``x`` [batch, 16, 64] with a dynamic batch dim; output ``logits``
[batch, 10]. Random init with a fixed seed; eval mode (no dropout).

Needs torch (pinned: pip install torch==2.13.0). Uses the legacy
TorchScript exporter (dynamo=False), which needs no onnxscript; pass
--dynamo to use the torch.export-based exporter instead.

Also, when ``transformers`` is importable (HF_HUB_OFFLINE=1, nothing is
downloaded): a tiny random-init BERT (BertConfig: vocab 1000, hidden 64,
2 layers, 4 heads, intermediate 128, eager attention) exported to
tests/data/tiny_bert.onnx + tests/data/tiny_bert.npz. Inputs ``input_ids``
and ``attention_mask`` (int64 [batch, seq], both dims dynamic); outputs
``last_hidden_state`` [batch, seq, 64] and ``pooler_output`` [batch, 64].
Skip it with --no-bert.

And a tiny random-init T5 encoder (T5Config: vocab 256, d_model 32, d_kv 8, 4 heads,
d_ff 64, 1 block, gated GELU, relative attention with 32 buckets and max distance 128)
to tests/data/tiny_t5_int8.onnx: exported at dynamic batch and sequence, then quantised
with onnxruntime.quantization.quantize_dynamic (QInt8 weights, reduce_range=True:
DynamicQuantizeLinear, MatMulInteger, DequantizeLinear). Its relative-position bucket
is `int(log(rel / 8) / log(16) * 8)` for distances past 8, a Log whose result is cast
to an integer. reduce_range keeps the weights to 7 bits: on CPUs without AVX-512 VNNI
onnxruntime's u8s8 MatMulInteger sums pairs of products in saturating int16
(vpmaddubsw) and differs from the ONNX definition (and from nxrt-tvm) for full-range
weights; with 7-bit weights no pair saturates, so onnxruntime is an exact reference.

Usage: python tools/export_torch_model.py [--out-dir tests/data] [--dynamo] [--no-bert]
(--no-bert skips both transformers exports)
"""

from __future__ import annotations

import argparse
import os
import pathlib
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
SEQ, D_MODEL, NHEAD, FF, NUM_CLASSES = 16, 64, 4, 128, 10
OPSET = 17
SEED = 0


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(
            d_model=D_MODEL, nhead=NHEAD, dim_feedforward=FF, batch_first=True, dropout=0.1
        )
        self.head = torch.nn.Linear(D_MODEL, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layer(x)
        return self.head(h.mean(dim=1))


def build() -> Encoder:
    torch.manual_seed(SEED)
    model = Encoder().eval()
    return model


def export(out_dir: pathlib.Path, dynamo: bool = False) -> pathlib.Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = out_dir / "torch_encoder.onnx"
    npz_path = out_dir / "torch_encoder.npz"

    model = build()
    example = torch.from_numpy(
        np.random.default_rng(SEED).standard_normal((2, SEQ, D_MODEL)).astype(np.float32)
    )

    # The fused "fast path" of TransformerEncoderLayer is only taken when
    # autograd is off and is not traceable; export with grad enabled so the
    # exporter sees the plain ops.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            batch = torch.export.Dim("batch", min=1, max=1024)
            torch.onnx.export(
                model,
                (example,),
                str(onnx_path),
                input_names=["x"],
                output_names=["logits"],
                opset_version=OPSET,
                dynamo=True,
                dynamic_shapes={"x": {0: batch}},
                external_data=False,
            )
        else:
            torch.onnx.export(
                model,
                (example,),
                str(onnx_path),
                input_names=["x"],
                output_names=["logits"],
                opset_version=OPSET,
                dynamo=False,
                dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
            )

    m = onnx.load(str(onnx_path))
    onnx.checker.check_model(m, full_check=True)

    # Reference input/output: use a different batch size than the export
    # example to exercise the dynamic dim.
    x = np.random.default_rng(SEED + 1).standard_normal((3, SEQ, D_MODEL)).astype(np.float32)
    with torch.no_grad():
        y_torch = model(torch.from_numpy(x)).numpy()
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (y_ort,) = sess.run(None, {"x": x})
    err = float(np.abs(y_ort - y_torch).max())
    if not np.allclose(y_ort, y_torch, atol=1e-4, rtol=0):
        raise SystemExit(f"onnxruntime output differs from torch: max abs err {err}")
    np.savez(npz_path, x=x, y=y_torch)

    print(
        f"wrote {onnx_path} ({onnx_path.stat().st_size} bytes, {len(m.graph.node)} nodes, "
        f"ops={sorted({n.op_type for n in m.graph.node})})"
    )
    print(f"wrote {npz_path} ({npz_path.stat().st_size} bytes); ORT vs torch max abs err {err:.2e}")
    return onnx_path


def _transformers(what: str):
    """`transformers`, offline (HF_HUB_OFFLINE=1: nothing
    is downloaded), or None (said) when it is missing."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        print(f"transformers not installed: skipping {what}")
        return None
    return transformers


def export_tiny_bert(out_dir: pathlib.Path) -> pathlib.Path | None:
    """Export a tiny random-init BERT; returns None when transformers is missing."""
    transformers = _transformers("tiny_bert.onnx")
    if transformers is None:
        return None
    BertConfig, BertModel = transformers.BertConfig, transformers.BertModel

    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = out_dir / "tiny_bert.onnx"
    npz_path = out_dir / "tiny_bert.npz"

    torch.manual_seed(SEED)
    cfg = BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    bert = BertModel(cfg).eval()

    class Wrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            o = self.m(input_ids=input_ids, attention_mask=attention_mask)
            return o.last_hidden_state, o.pooler_output

    model = Wrapper(bert).eval()
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=gen)
    mask = torch.ones_like(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (ids, mask),
            str(onnx_path),
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state", "pooler_output"],
            opset_version=OPSET,
            dynamo=False,
            dynamic_axes={
                "input_ids": {0: "batch", 1: "seq"},
                "attention_mask": {0: "batch", 1: "seq"},
                "last_hidden_state": {0: "batch", 1: "seq"},
                "pooler_output": {0: "batch"},
            },
        )
    m = onnx.load(str(onnx_path))
    onnx.checker.check_model(m, full_check=True)

    # Reference feed: another batch/seq size, with some padding in the mask.
    ids2 = torch.randint(0, cfg.vocab_size, (3, 12), generator=gen)
    mask2 = torch.ones_like(ids2)
    mask2[1, 8:] = 0
    with torch.no_grad():
        hidden, pooled = (t.numpy() for t in model(ids2, mask2))
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    o_hidden, o_pooled = sess.run(None, {"input_ids": ids2.numpy(), "attention_mask": mask2.numpy()})
    err = max(float(np.abs(o_hidden - hidden).max()), float(np.abs(o_pooled - pooled).max()))
    if err > 1e-4:
        raise SystemExit(f"tiny_bert: onnxruntime output differs from torch: max abs err {err}")
    np.savez(
        npz_path,
        input_ids=ids2.numpy(),
        attention_mask=mask2.numpy(),
        last_hidden_state=hidden,
        pooler_output=pooled,
    )
    print(f"wrote {onnx_path} ({onnx_path.stat().st_size} bytes, {len(m.graph.node)} nodes)")
    print(f"wrote {npz_path} ({npz_path.stat().st_size} bytes); ORT vs torch max abs err {err:.2e}")
    return onnx_path


def export_tiny_t5(out_dir: pathlib.Path) -> pathlib.Path | None:
    """Export the tiny int8 T5 encoder; returns None when transformers is missing."""
    transformers = _transformers("tiny_t5_int8.onnx")
    if transformers is None:
        return None
    T5Config, T5EncoderModel = transformers.T5Config, transformers.T5EncoderModel
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out_dir.mkdir(parents=True, exist_ok=True)
    float_path, onnx_path = out_dir / "tiny_t5.float.onnx", out_dir / "tiny_t5_int8.onnx"
    torch.manual_seed(SEED)
    cfg = T5Config(
        vocab_size=256,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
    )
    model = T5EncoderModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(SEED))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (ids, torch.ones_like(ids)),
            str(float_path),
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            opset_version=OPSET,
            dynamo=False,
            dynamic_axes={
                "input_ids": {0: "batch", 1: "seq"},
                "attention_mask": {0: "batch", 1: "seq"},
                "last_hidden_state": {0: "batch", 1: "seq"},
            },
        )
        quantize_dynamic(str(float_path), str(onnx_path), weight_type=QuantType.QInt8, reduce_range=True)
    float_path.unlink()
    m = onnx.load(str(onnx_path))
    onnx.checker.check_model(m, full_check=True)
    print(
        f"wrote {onnx_path} ({onnx_path.stat().st_size} bytes, {len(m.graph.node)} nodes, "
        f"ops={sorted({n.op_type for n in m.graph.node})})"
    )
    return onnx_path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=str(ROOT / "tests" / "data"))
    ap.add_argument("--dynamo", action="store_true", help="use the dynamo exporter (needs onnxscript)")
    ap.add_argument("--no-bert", action="store_true", help="skip the transformers tiny BERT export")
    args = ap.parse_args(argv)
    export(pathlib.Path(args.out_dir), dynamo=args.dynamo)
    if not args.no_bert:
        export_tiny_bert(pathlib.Path(args.out_dir))
        export_tiny_t5(pathlib.Path(args.out_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
