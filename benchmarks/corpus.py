"""A development corpus of real ONNX models, made or fetched offline into a cache folder.

    python benchmarks/corpus.py [--dir DIR] [--only NAME,...] [--list]

DIR defaults to ``$NXRT_CORPUS`` or ``~/.cache/nxrt-tvm/corpus`` (the models stay out of git).
Each model is written as ``DIR/<name>.onnx`` with a feed ``DIR/<name>.feeds.npz`` (realistic inputs
from a fixed seed: token ids inside the vocabulary, attention masks of ones with zero padding at the
end, pixels in [0, 1] or normalised the way the model's pipeline does it, audio in [-1, 1]), and
``DIR/manifest.json`` lists them: per model ``name``, ``file``, ``source`` (where it came from, with
package versions), ``feeds``, ``notes``, the feed shapes and the file size. None is built from ONNX
helper nodes:

- ``onnx``'s own backend-test "light" models (AlexNet ... ZFNet, copied from the installed wheel);
- ``transformers`` tiny configs with random weights (BERT, GPT-2, T5 encoder, ViT, Whisper encoder),
  exported with ``torch.onnx.export`` (``HF_HUB_OFFLINE=1``: nothing is downloaded);
- architectures written in ``torch.nn`` with random init (MobileNetV2/V3, EfficientNet, UNet, a
  YOLO-style FPN, a Conv1d audio net, LSTM, GRU), BatchNorm statistics recalibrated on random feeds
  so the activations keep a realistic scale;
- int8 models quantised with ``onnxruntime.quantization`` (static QDQ of a CNN, dynamic BERT);
- pretrained models shipped inside PyPI wheels (PP-OCRv4 det/rec/cls, Silero VAD, Magika, NudeNet's
  YOLOv8n), fetched with ``pip download --no-deps NAME==VERSION``.

Idempotent: a model whose ``.onnx`` and feeds are present is kept as it is; files are written to a
temporary name and moved into place. Every new model is run in onnxruntime (CPU) with its feeds,
and exports are compared with the framework's own output; a model that fails is dropped with the
reason printed. Needs torch (pinned: ``pip install torch==2.13.0``) and transformers for the
exported models; those are skipped, said, when missing. ``--list`` needs neither.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

OPSET = 17
SEED = 0
#: Channel mean/std of the ImageNet-trained pipelines (PP-OCR det, the classic CNNs).
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)

Feeds = dict[str, np.ndarray]


def default_dir() -> Path:
    return Path(os.environ.get("NXRT_CORPUS") or Path.home() / ".cache" / "nxrt-tvm" / "corpus")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _tmp_path(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.tmp-{os.getpid()}")


def _replace(tmp: Path, dest: Path) -> None:
    os.replace(tmp, dest)


# ------------------------------------------------------------------ feeds


def _rng(name: str) -> np.random.Generator:
    """A fixed generator per model (the feeds do not depend on which other models are made)."""
    return np.random.default_rng([SEED, *name.encode()])


def _scene(rng: np.random.Generator, batch: int, h: int, w: int) -> np.ndarray:
    """A photo-like image in [0, 1]: smooth colour gradients, a few flat blobs, sensor noise."""
    yy, xx = np.meshgrid(np.linspace(0, 1, h, dtype=np.float32), np.linspace(0, 1, w, dtype=np.float32))
    img = np.empty((batch, 3, h, w), np.float32)
    for b in range(batch):
        for c in range(3):
            a, bx, by = rng.uniform(0.2, 0.8), rng.uniform(-0.4, 0.4), rng.uniform(-0.4, 0.4)
            img[b, c] = a + bx * xx.T + by * yy.T
        for _ in range(6):
            y0, x0 = rng.integers(0, h), rng.integers(0, w)
            y1, x1 = min(h, y0 + rng.integers(h // 8, h // 2)), min(w, x0 + rng.integers(w // 8, w // 2))
            img[b, :, y0:y1, x0:x1] = rng.uniform(0, 1, (3, 1, 1))
    img += rng.normal(0, 0.02, img.shape).astype(np.float32)
    return np.clip(img, 0, 1)


def _document(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A scanned-text-like image in [0, 1] (1x3xHxW): light paper, rows of dark glyph-sized strokes."""
    img = np.full((1, 3, h, w), 0.92, np.float32) + rng.normal(0, 0.02, (1, 3, h, w)).astype(np.float32)
    line_h = max(8, h // 12) if h > 64 else int(h * 0.6)
    top = rng.integers(2, max(3, line_h // 2))
    while top + line_h < h:
        x = rng.integers(2, max(3, w // 20))
        while x < w - 4:
            gw = int(rng.integers(max(2, line_h // 3), line_h))
            img[0, :, top : top + line_h, x : x + max(1, gw // 3)] = rng.uniform(0.0, 0.25)
            img[0, :, top + line_h // 2 : top + line_h // 2 + 2, x : x + gw] = rng.uniform(0.0, 0.25)
            x += gw + int(rng.integers(1, line_h // 2 + 2))
            if rng.random() < 0.1:
                x += line_h
        top += line_h + int(rng.integers(line_h // 2, line_h * 2))
    return np.clip(img, 0, 1)


def _imagenet(img: np.ndarray) -> np.ndarray:
    return ((img - IMAGENET_MEAN) / IMAGENET_STD).astype(np.float32)


def _half(img: np.ndarray) -> np.ndarray:
    """(x - 0.5) / 0.5: PP-OCR rec/cls and ViT's normalisation."""
    return ((img - 0.5) / 0.5).astype(np.float32)


def _audio(rng: np.random.Generator, batch: int, n: int, sr: int = 16000) -> np.ndarray:
    """Speech-like audio in [-1, 1]: a few harmonics with a syllable envelope, plus noise."""
    t = np.arange(n, dtype=np.float32) / sr
    out = np.empty((batch, n), np.float32)
    for b in range(batch):
        f0 = rng.uniform(90, 250)
        voice = sum(np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6.3)) / k for k in range(1, 6))
        envelope = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(2, 5) * t)
        out[b] = 0.3 * voice * envelope + rng.normal(0, 0.02, n)
    return np.clip(out, -1, 1).astype(np.float32)


def _token_feeds(
    rng: np.random.Generator, vocab: int, batch: int, seq: int, pad: int, token_types: bool = False
) -> Feeds:
    """input_ids in [1, vocab) with the padded tail set to 0 (the pad id), attention_mask 1 then 0."""
    ids = rng.integers(1, vocab, (batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), np.int64)
    if pad:
        ids[:, seq - pad :] = 0
        mask[:, seq - pad :] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    if token_types:
        types = np.zeros((batch, seq), np.int64)
        types[:, (seq - pad) // 2 : seq - pad] = 1  # a sentence pair
        feeds["token_type_ids"] = types
    return feeds


def _image_feed(name: str, batch: int, h: int, w: int, norm: Callable | None = None) -> Callable:
    def make(rng: np.random.Generator) -> Feeds:
        img = _scene(rng, batch, h, w)
        return {name: norm(img) if norm else img}

    return make


# ------------------------------------------------------------------ entries


@dataclass(frozen=True)
class Model:
    name: str
    source: str
    make: Callable[[Path, Path], None]  # (destination .onnx, corpus dir): writes the model atomically
    feeds: Callable[[np.random.Generator], Feeds]
    notes: str
    needs: tuple[str, ...] = ()  # modules that must be importable
    after: tuple[str, ...] = ()  # corpus models it is made from (it takes the feed of the first)


def _light(file: str) -> Callable[[Path, Path], None]:
    def make(dest: Path, _dir: Path) -> None:
        spec = importlib.util.find_spec("onnx")
        src = Path(spec.origin).parent / "backend" / "test" / "data" / "light" / file
        tmp = _tmp_path(dest)
        shutil.copyfile(src, tmp)
        _replace(tmp, dest)

    return make


# -- torch


def _torch_export(
    build: Callable[[], object],
    example: Callable[[], tuple],
    input_names: list[str],
    output_names: list[str],
    dynamic_axes: dict | None = None,
    feeds: Callable[[np.random.Generator], Feeds] | None = None,
    name: str = "",
) -> Callable[[Path, Path], None]:
    """Export torch module `build()` (eval mode) traced at `example()`, check onnxruntime reproduces
    torch on the corpus feeds (relative 1e-3), and move it into place."""

    def make(dest: Path, _dir: Path) -> None:
        import onnx
        import onnxruntime as ort
        import torch

        torch.manual_seed(SEED)
        model = build().eval()
        args = example()
        tmp = _tmp_path(dest)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                args,
                str(tmp),
                input_names=input_names,
                output_names=output_names,
                opset_version=OPSET,
                dynamo=False,
                dynamic_axes=dynamic_axes or {},
            )
        model.eval()  # the exporter restores the mode the module had: keep it in eval for the check
        try:
            onnx.checker.check_model(onnx.load(str(tmp)), full_check=True)
            feed = feeds(_rng(name)) if feeds else {n: a.numpy() for n, a in zip(input_names, args)}
            so = ort.SessionOptions()
            so.log_severity_level = 3
            sess = ort.InferenceSession(str(tmp), so, providers=["CPUExecutionProvider"])
            got = sess.run(None, feed)
            with torch.no_grad():
                want = model(*(torch.from_numpy(feed[n]) for n in input_names))
            want = want if isinstance(want, (tuple, list)) else (want,)
            for out, g, w in zip(output_names, got, want):
                w = w.numpy()
                err = (
                    float(np.abs(g - w).max()) / max(float(np.abs(w).max()), 1e-6)
                    if g.shape == w.shape
                    else 1
                )
                if err > 1e-3:
                    raise RuntimeError(
                        f"onnxruntime differs from torch on {out}: shape {g.shape} vs {w.shape}, "
                        f"rel err {err:.2e}"
                    )
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _replace(tmp, dest)

    return make


def _recalibrate_bn(model, batches: list) -> None:
    """Replace BatchNorm's default running stats (0, 1) by those of random feeds, so that deep
    random-init nets keep unit-scale activations instead of exploding or vanishing."""
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average
    model.train()
    with torch.no_grad():
        for x in batches:
            model(x)
    model.eval()


def _bn_calibrated(factory: Callable[[], object], shape: tuple[int, ...]) -> Callable[[], object]:
    def build():
        import torch

        model = factory()
        gen = torch.Generator().manual_seed(SEED)
        _recalibrate_bn(model, [torch.rand((4, *shape[1:]), generator=gen) * 2 - 1 for _ in range(3)])
        return model

    return build


def _nets():
    """The torch.nn architectures (imported lazily: torch is optional for --list)."""
    import torch
    from torch import nn

    def divisible(v: float, d: int = 8) -> int:
        return max(d, int(v + d / 2) // d * d)

    def conv_bn(cin, cout, k, s=1, groups=1, act: type | None = nn.ReLU6):
        layers = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act is not None:
            layers.append(act())
        return nn.Sequential(*layers)

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, s, t):
            super().__init__()
            hidden = cin * t
            layers = [conv_bn(cin, hidden, 1)] if t != 1 else []
            layers += [conv_bn(hidden, hidden, 3, s, groups=hidden), conv_bn(hidden, cout, 1, act=None)]
            self.block = nn.Sequential(*layers)
            self.residual = s == 1 and cin == cout

        def forward(self, x):
            y = self.block(x)
            return x + y if self.residual else y

    class MobileNetV2(nn.Module):
        """MobileNetV2 (Sandler et al.), width 0.5: depthwise convs, ReLU6, inverted residuals."""

        def __init__(self, width=0.5, classes=1000):
            super().__init__()
            cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1)]
            cfg += [(6, 160, 3, 2), (6, 320, 1, 1)]
            cin = divisible(32 * width)
            layers = [conv_bn(3, cin, 3, 2)]
            for t, c, n, s in cfg:
                cout = divisible(c * width)
                for i in range(n):
                    layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                    cin = cout
            layers.append(conv_bn(cin, 1280, 1))
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

        def forward(self, x):
            return self.classifier(self.features(x).mean((2, 3)))

    class SqueezeExcite(nn.Module):
        def __init__(self, c, squeeze, act=nn.ReLU, gate=nn.Hardsigmoid):
            super().__init__()
            self.fc1, self.fc2 = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)
            self.act, self.gate = act(), gate()

        def forward(self, x):
            s = x.mean((2, 3), keepdim=True)
            return x * self.gate(self.fc2(self.act(self.fc1(s))))

    class V3Block(nn.Module):
        def __init__(self, cin, k, exp, cout, se, act, s):
            super().__init__()
            layers = [conv_bn(cin, exp, 1, act=act)] if exp != cin else []
            layers.append(conv_bn(exp, exp, k, s, groups=exp, act=act))
            if se:
                layers.append(SqueezeExcite(exp, divisible(exp // 4)))
            layers.append(conv_bn(exp, cout, 1, act=None))
            self.block = nn.Sequential(*layers)
            self.residual = s == 1 and cin == cout

        def forward(self, x):
            y = self.block(x)
            return x + y if self.residual else y

    class MobileNetV3Small(nn.Module):
        """MobileNetV3-Small (Howard et al.): hardswish, hardsigmoid squeeze-excite, 5x5 depthwise."""

        def __init__(self, classes=1000):
            super().__init__()
            re, hs = nn.ReLU, nn.Hardswish
            cfg = [(3, 16, 16, True, re, 2), (3, 72, 24, False, re, 2), (3, 88, 24, False, re, 1)]
            cfg += [(5, 96, 40, True, hs, 2), (5, 240, 40, True, hs, 1), (5, 240, 40, True, hs, 1)]
            cfg += [(5, 120, 48, True, hs, 1), (5, 144, 48, True, hs, 1), (5, 288, 96, True, hs, 2)]
            cfg += [(5, 576, 96, True, hs, 1), (5, 576, 96, True, hs, 1)]
            layers, cin = [conv_bn(3, 16, 3, 2, act=hs)], 16
            for k, exp, cout, se, act, s in cfg:
                layers.append(V3Block(cin, k, exp, cout, se, act, s))
                cin = cout
            layers.append(conv_bn(cin, 576, 1, act=hs))
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Sequential(
                nn.Linear(576, 1024), hs(), nn.Dropout(0.2), nn.Linear(1024, classes)
            )

        def forward(self, x):
            return self.classifier(self.features(x).mean((2, 3)))

    class MBConv(nn.Module):
        def __init__(self, cin, cout, k, s, t):
            super().__init__()
            hidden = cin * t
            layers = [conv_bn(cin, hidden, 1, act=nn.SiLU)] if t != 1 else []
            layers.append(conv_bn(hidden, hidden, k, s, groups=hidden, act=nn.SiLU))
            layers.append(SqueezeExcite(hidden, max(1, cin // 4), act=nn.SiLU, gate=nn.Sigmoid))
            layers.append(conv_bn(hidden, cout, 1, act=None))
            self.block = nn.Sequential(*layers)
            self.residual = s == 1 and cin == cout

        def forward(self, x):
            y = self.block(x)
            return x + y if self.residual else y

    class EfficientNet(nn.Module):
        """EfficientNet-B0's stages (Tan & Le) at width 0.5 and at most 2 blocks a stage: MBConv, SiLU, SE."""

        def __init__(self, width=0.5, classes=1000):
            super().__init__()
            stages = [(1, 3, 16, 1, 1), (6, 3, 24, 2, 2), (6, 5, 40, 2, 2), (6, 3, 80, 2, 2)]
            stages += [(6, 5, 112, 1, 2), (6, 5, 192, 2, 2), (6, 3, 320, 1, 1)]
            cin = divisible(32 * width)
            layers = [conv_bn(3, cin, 3, 2, act=nn.SiLU)]
            for t, k, c, s, n in stages:
                cout = divisible(c * width)
                for i in range(n):
                    layers.append(MBConv(cin, cout, k, s if i == 0 else 1, t))
                    cin = cout
            layers.append(conv_bn(cin, 640, 1, act=nn.SiLU))
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(640, classes))

        def forward(self, x):
            return self.classifier(self.features(x).mean((2, 3)))

    def double_conv(cin, cout):
        return nn.Sequential(conv_bn(cin, cout, 3, act=nn.ReLU), conv_bn(cout, cout, 3, act=nn.ReLU))

    class UNet(nn.Module):
        """A 4-level UNet (Ronneberger et al.): max-pool down; up by ConvTranspose2d on the two deep
        levels and bilinear Resize + conv on the shallow ones; Concat skips; 2-class logits."""

        def __init__(self, classes=2, base=16):
            super().__init__()
            c = [base, base * 2, base * 4, base * 8, base * 16]
            self.down = nn.ModuleList(
                [double_conv(3, c[0])] + [double_conv(c[i], c[i + 1]) for i in range(4)]
            )
            self.up = nn.ModuleList()
            self.dec = nn.ModuleList()
            for i in (3, 2, 1, 0):
                if i >= 2:
                    self.up.append(nn.ConvTranspose2d(c[i + 1], c[i], 2, stride=2))
                else:
                    self.up.append(
                        nn.Sequential(
                            nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                            nn.Conv2d(c[i + 1], c[i], 1),
                        )
                    )
                self.dec.append(double_conv(2 * c[i], c[i]))
            self.head = nn.Conv2d(c[0], classes, 1)

        def forward(self, x):
            skips = []
            for i, block in enumerate(self.down):
                x = block(x if i == 0 else nn.functional.max_pool2d(x, 2))
                skips.append(x)
            x = skips.pop()
            for up, dec in zip(self.up, self.dec):
                x = dec(torch.cat([up(x), skips.pop()], dim=1))
            return self.head(x)

    def cbs(cin, cout, k=3, s=1):
        return conv_bn(cin, cout, k, s, act=nn.SiLU)

    class C2(nn.Module):
        """A CSP block: split, a residual bottleneck on one half, concat, fuse."""

        def __init__(self, c):
            super().__init__()
            self.cv1, self.cv2 = cbs(c, c, 1), cbs(c, c, 1)
            self.m = nn.Sequential(cbs(c // 2, c // 2), cbs(c // 2, c // 2))

        def forward(self, x):
            a, b = self.cv1(x).chunk(2, 1)
            return self.cv2(torch.cat([a, b + self.m(b)], 1))

    class YoloFPN(nn.Module):
        """A YOLO-style detector: CSP backbone at strides 8/16/32, FPN top-down path (nearest
        Resize x2 + Concat), per-level heads with Sigmoid, flattened to [batch, boxes, 5 + classes]."""

        def __init__(self, classes=20, anchors=3):
            super().__init__()
            self.no, self.na = 5 + classes, anchors
            self.stem = nn.Sequential(cbs(3, 16, 3, 2), cbs(16, 32, 3, 2), C2(32))
            self.p3 = nn.Sequential(cbs(32, 64, 3, 2), C2(64))
            self.p4 = nn.Sequential(cbs(64, 128, 3, 2), C2(128))
            self.p5 = nn.Sequential(cbs(128, 256, 3, 2), C2(256))
            self.lat5, self.lat4 = cbs(256, 128, 1), cbs(128, 64, 1)
            self.fuse4, self.fuse3 = cbs(256, 128), cbs(128, 64)
            self.heads = nn.ModuleList(nn.Conv2d(c, self.no * anchors, 1) for c in (64, 128, 128))
            self.up = nn.Upsample(scale_factor=2, mode="nearest")

        def forward(self, x):
            c3 = self.p3(self.stem(x))
            c4 = self.p4(c3)
            c5 = self.p5(c4)
            p5 = self.lat5(c5)
            p4 = self.fuse4(torch.cat([self.up(p5), c4], 1))
            p3 = self.fuse3(torch.cat([self.up(self.lat4(p4)), c3], 1))
            outs = []
            for head, p in zip(self.heads, (p3, p4, p5)):
                y = head(p).sigmoid()
                b, _, h, w = y.shape
                outs.append(y.view(b, self.na, self.no, h * w).permute(0, 1, 3, 2).reshape(b, -1, self.no))
            return torch.cat(outs, 1)

    class AudioConv1d(nn.Module):
        """An M5-style raw-waveform classifier (Dai et al.): Conv1d + BatchNorm + ReLU + MaxPool."""

        def __init__(self, classes=35):
            super().__init__()
            layers, cin = [], 1
            for cout, k, s in ((32, 80, 4), (32, 3, 1), (64, 3, 1), (128, 3, 1)):
                layers += [
                    nn.Conv1d(cin, cout, k, s, k // 2),
                    nn.BatchNorm1d(cout),
                    nn.ReLU(),
                    nn.MaxPool1d(4),
                ]
                cin = cout
            self.features = nn.Sequential(*layers)
            self.head = nn.Linear(cin, classes)

        def forward(self, x):
            return self.head(self.features(x).mean(2)).log_softmax(-1)

    class LstmText(nn.Module):
        """A text classifier: Embedding, 2-layer bidirectional LSTM, masked mean pool, Linear."""

        def __init__(self, vocab=5000, dim=128, classes=5):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim, padding_idx=0)
            self.lstm = nn.LSTM(dim, dim, num_layers=2, batch_first=True, bidirectional=True)
            self.head = nn.Linear(2 * dim, classes)

        def forward(self, ids, mask):
            h, _ = self.lstm(self.embed(ids))
            m = mask.unsqueeze(-1).to(h.dtype)
            return self.head((h * m).sum(1) / m.sum(1).clamp(min=1))

    class GruFrames(nn.Module):
        """A frame tagger on 40 log-mel features: 2-layer GRU, per-frame Linear + softmax."""

        def __init__(self, features=40, hidden=96, classes=12):
            super().__init__()
            self.gru = nn.GRU(features, hidden, num_layers=2, batch_first=True)
            self.head = nn.Linear(hidden, classes)

        def forward(self, x):
            h, _ = self.gru(x)
            return self.head(h).softmax(-1)

    return {
        "mobilenet_v2": MobileNetV2,
        "mobilenet_v3": MobileNetV3Small,
        "efficientnet": EfficientNet,
        "unet": UNet,
        "yolo_fpn": YoloFPN,
        "conv1d_audio": AudioConv1d,
        "lstm_text": LstmText,
        "gru_frames": GruFrames,
    }


def _net(name: str, shape: tuple[int, ...] | None = None) -> Callable[[], object]:
    def factory():
        return _nets()[name]()

    return _bn_calibrated(factory, shape) if shape else factory


def _rand_example(*shapes: tuple[int, ...]) -> Callable[[], tuple]:
    def example():
        import torch

        gen = torch.Generator().manual_seed(SEED)
        return tuple(torch.rand(s, generator=gen) for s in shapes)

    return example


def _torch_image_net(name: str, size: int, notes: str, norm=_imagenet, classes_out="logits") -> Model:
    feeds = _image_feed("input", 1, size, size, norm)
    shape = (1, 3, size, size)
    return Model(
        name,
        f"torch=={_version('torch')} torch.nn (benchmarks/corpus.py), random init seed {SEED}",
        _torch_export(
            _net(name, shape),
            _rand_example(shape),
            ["input"],
            [classes_out],
            {"input": {0: "batch"}, classes_out: {0: "batch"}},
            feeds,
            name,
        ),
        feeds,
        notes,
        needs=("torch",),
    )


# -- transformers


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    return transformers


def _hf_wrapper(model, keys: list[str], outs: list[str]):
    import torch

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, *args):
            o = self.m(**dict(zip(keys, args)))
            return tuple(getattr(o, k) for k in outs)

    return Wrapper().eval()


def _hf_build(kind: str) -> Callable[[], object]:
    def build():
        t = _transformers()
        if kind == "bert":
            cfg = t.BertConfig(
                vocab_size=8000,
                hidden_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=512,
                max_position_embeddings=512,
                attn_implementation="eager",
            )
            return _hf_wrapper(
                t.BertModel(cfg), ["input_ids", "attention_mask", "token_type_ids"], HF_OUTS["bert"]
            )
        if kind == "gpt2":
            cfg = t.GPT2Config(
                vocab_size=8000,
                n_embd=128,
                n_layer=2,
                n_head=4,
                n_positions=512,
                use_cache=False,
                bos_token_id=1,
                eos_token_id=2,
                attn_implementation="eager",
            )
            return _hf_wrapper(t.GPT2LMHeadModel(cfg), ["input_ids", "attention_mask"], HF_OUTS["gpt2"])
        if kind == "t5":
            cfg = t.T5Config(
                vocab_size=8000,
                d_model=128,
                d_kv=32,
                d_ff=256,
                num_layers=2,
                num_heads=4,
                dropout_rate=0.0,
                attn_implementation="eager",
            )
            return _hf_wrapper(t.T5EncoderModel(cfg), ["input_ids", "attention_mask"], HF_OUTS["t5"])
        if kind == "vit":
            cfg = t.ViTConfig(
                hidden_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=256,
                image_size=224,
                patch_size=16,
                attn_implementation="eager",
            )
            return _hf_wrapper(t.ViTModel(cfg), ["pixel_values"], HF_OUTS["vit"])
        if kind == "whisper":
            from transformers.models.whisper.modeling_whisper import WhisperEncoder

            cfg = t.WhisperConfig(
                d_model=128,
                encoder_layers=2,
                encoder_attention_heads=4,
                encoder_ffn_dim=256,
                decoder_layers=1,
                decoder_attention_heads=4,
                decoder_ffn_dim=256,
                num_mel_bins=80,
                max_source_positions=500,
                vocab_size=1000,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                decoder_start_token_id=1,
                attn_implementation="eager",
            )
            return _hf_wrapper(WhisperEncoder(cfg), ["input_features"], HF_OUTS["whisper"])
        raise ValueError(kind)

    return build


HF_OUTS = {
    "bert": ["last_hidden_state", "pooler_output"],
    "gpt2": ["logits"],
    "t5": ["last_hidden_state"],
    "vit": ["last_hidden_state", "pooler_output"],
    "whisper": ["last_hidden_state"],
}


def _whisper_features(rng: np.random.Generator) -> Feeds:
    """Whisper-style log-mel features (log10, clamped to max - 8, then (x + 4) / 4): about [-1, 1.5]."""
    audio = _audio(rng, 1, 16000 * 10)
    frames = audio[0, : 1000 * 160].reshape(1000, 160)
    energy = np.log10(np.maximum(np.abs(np.fft.rfft(frames, n=158, axis=1))[:, :80] ** 2, 1e-10))
    energy = np.maximum(energy, energy.max() - 8.0)
    return {"input_features": ((energy + 4.0) / 4.0).T[None].astype(np.float32)}


def _hf_model(name: str, kind: str, inputs: list[str], feeds, notes: str, seq_axes: bool = True) -> Model:
    outs = HF_OUTS[kind]
    dyn = {i: ({0: "batch", 1: "seq"} if seq_axes else {0: "batch"}) for i in inputs}
    for o in outs:
        dyn[o] = {0: "batch", 1: "seq"} if seq_axes and o != "pooler_output" else {0: "batch"}

    def example():
        import torch

        return tuple(torch.from_numpy(v) for v in feeds(np.random.default_rng(SEED + 1)).values())

    return Model(
        name,
        f"transformers=={_version('transformers')} {kind} tiny config, random init seed {SEED}; "
        f"torch=={_version('torch')} torch.onnx.export(dynamo=False, opset {OPSET})",
        _torch_export(_hf_build(kind), example, inputs, outs, dyn, feeds, name),
        feeds,
        notes,
        needs=("torch", "transformers"),
    )


# -- quantised


class _Calibration:
    """onnxruntime.quantization's CalibrationDataReader protocol: a few realistic images."""

    def __init__(self, input_name: str, batches: list[np.ndarray]):
        self.items = iter([{input_name: b} for b in batches])

    def get_next(self):
        return next(self.items, None)


def _qdq(base: str) -> Callable[[Path, Path], None]:
    def make(dest: Path, dir: Path) -> None:
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
        from onnxruntime.quantization.shape_inference import quant_pre_process

        rng = np.random.default_rng(SEED + 7)
        reader = _Calibration("input", [_imagenet(_scene(rng, 1, 128, 128)) for _ in range(8)])
        tmp, pre = _tmp_path(dest), _tmp_path(dest.with_name(dest.stem + ".pre.onnx"))
        # onnxruntime's recommended first step, shape inference only: its optimiser would add a dozen
        # opset imports (com.microsoft, training, ...) to a graph that uses none of them
        quant_pre_process(str(dir / f"{base}.onnx"), str(pre), skip_optimization=True)
        quantize_static(
            str(pre),
            str(tmp),
            reader,
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
        pre.unlink()
        _replace(tmp, dest)

    return make


def _dynamic(base: str) -> Callable[[Path, Path], None]:
    def make(dest: Path, dir: Path) -> None:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        tmp = _tmp_path(dest)
        # (no quant_pre_process: its symbolic shape inference gives up on the dynamic batch/seq dims)
        logging.disable(logging.WARNING)  # its advice to pre-process, which fails here
        try:
            quantize_dynamic(
                str(dir / f"{base}.onnx"), str(tmp), weight_type=QuantType.QInt8, reduce_range=True
            )
        finally:
            logging.disable(logging.NOTSET)
        _replace(tmp, dest)

    return make


# -- pretrained, from PyPI wheels


def _from_wheel(package: str, version: str, member: str) -> Callable[[Path, Path], None]:
    def make(dest: Path, dir: Path) -> None:
        wheels = dir / "_wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        prefix = package.replace("-", "_").lower() + "-" + version + "-"
        found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(prefix)]
        if not found:
            with tempfile.TemporaryDirectory(dir=wheels) as tmpdir:
                cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", tmpdir]
                proc = subprocess.run(
                    [*cmd, f"{package}=={version}"], capture_output=True, text=True, timeout=600
                )
                got = list(Path(tmpdir).glob("*.whl"))
                if proc.returncode != 0 or not got:
                    raise RuntimeError(
                        f"pip download {package}=={version} failed: {proc.stderr.strip()[-400:]}"
                    )
                for w in got:
                    os.replace(w, wheels / w.name)
                found = [wheels / w.name for w in got]
        tmp = _tmp_path(dest)
        with zipfile.ZipFile(found[0]) as zf, zf.open(member) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out)
        _replace(tmp, dest)

    return make


def _wheel_model(name: str, package: str, version: str, member: str, feeds, notes: str) -> Model:
    return Model(
        name,
        f"{package}=={version} (PyPI wheel): {member}, pretrained",
        _from_wheel(package, version, member),
        feeds,
        notes,
    )


def _ocr_feed(h: int, w: int, norm) -> Callable[[np.random.Generator], Feeds]:
    return lambda rng: {"x": norm(_document(rng, h, w))}


def _silero_feeds(rng: np.random.Generator) -> Feeds:
    # The wrapper feeds 512 new samples after 64 of context at 16 kHz, with the state of the last call.
    return {
        "input": _audio(rng, 1, 576),
        "state": (rng.normal(0, 0.3, (2, 1, 128))).astype(np.float32),
        "sr": np.array(16000, np.int64),
    }


def _magika_feeds(rng: np.random.Generator) -> Feeds:
    # First and last 1024 bytes of a (text) file; files shorter than that are padded with 256.
    text = rng.choice(np.frombuffer(b"etaoin shrdlu\n{}()=;,.\"'0123456789", np.uint8), 1600)
    data = np.full(2048, 256, np.int32)
    data[:1024] = text[:1024]
    data[1024 : 1024 + 576] = text[1024:]
    return {"bytes": data[None]}


def _light_model(name: str, file: str, input_name: str, label: str) -> Model:
    return Model(
        name,
        f"onnx=={_version('onnx')} wheel: onnx/backend/test/data/light/{file}",
        _light(file),
        _image_feed(input_name, 1, 224, 224, _imagenet),
        f"{label}; opset 9, weights as ConstantOfShape (the 'light' variant of the ONNX model zoo model): "
        "the outputs are constant across classes, fine for latency, weak for parity",
    )


def _corpus() -> list[Model]:
    models = [
        _light_model("alexnet", "light_bvlc_alexnet.onnx", "data_0", "AlexNet (BVLC), LRN, 1x3x224x224"),
        _light_model("densenet121", "light_densenet121.onnx", "data_0", "DenseNet-121, 1x3x224x224"),
        _light_model("inception_v1", "light_inception_v1.onnx", "data_0", "Inception v1 (GoogLeNet), LRN"),
        _light_model("inception_v2", "light_inception_v2.onnx", "data_0", "Inception v2 (BN-Inception)"),
        _light_model("resnet50", "light_resnet50.onnx", "gpu_0/data_0", "ResNet-50 (Caffe2 export)"),
        _light_model("shufflenet", "light_shufflenet.onnx", "gpu_0/data_0", "ShuffleNet v1, channel shuffle"),
        _light_model("squeezenet", "light_squeezenet.onnx", "data_0", "SqueezeNet 1.0, fire modules"),
        _light_model("vgg19", "light_vgg19.onnx", "data_0", "VGG-19, about 20 GFLOP a frame"),
        _light_model("zfnet512", "light_zfnet512.onnx", "gpu_0/data_0", "ZFNet-512, LRN"),
        _hf_model(
            "bert_tiny",
            "bert",
            ["input_ids", "attention_mask", "token_type_ids"],
            lambda rng: _token_feeds(rng, 8000, 1, 128, 24, token_types=True),
            "BERT, hidden 128, 2 layers, 4 heads, vocab 8000; feed 1x128 with 24 padded tokens; "
            "dynamic batch and seq",
        ),
        _hf_model(
            "gpt2_tiny",
            "gpt2",
            ["input_ids", "attention_mask"],
            lambda rng: _token_feeds(rng, 8000, 1, 128, 0),
            "GPT-2 LM head, n_embd 128, 2 layers, 4 heads, vocab 8000, no past kv (use_cache=False); "
            "feed 1x128; dynamic batch and seq",
        ),
        _hf_model(
            "t5_encoder_tiny",
            "t5",
            ["input_ids", "attention_mask"],
            lambda rng: _token_feeds(rng, 8000, 1, 128, 16),
            "T5 encoder, d_model 128, 2 blocks, 4 heads, relative attention buckets; feed 1x128 with "
            "16 padded tokens; dynamic batch and seq",
        ),
        _hf_model(
            "vit_tiny",
            "vit",
            ["pixel_values"],
            _image_feed("pixel_values", 1, 224, 224, _half),
            "ViT, hidden 128, 2 layers, patch 16 at 224x224 (197 tokens), pixels (x - 0.5) / 0.5; "
            "dynamic batch",
            seq_axes=False,
        ),
        _hf_model(
            "whisper_encoder_tiny",
            "whisper",
            ["input_features"],
            _whisper_features,
            "Whisper encoder, d_model 128, 2 layers, 80 mel bins x 1000 frames (10 s; "
            "max_source_positions 500); dynamic batch",
            seq_axes=False,
        ),
        _torch_image_net(
            "mobilenet_v2",
            128,
            "MobileNetV2 width 0.5: depthwise conv, ReLU6 (Clip); 1x3x128x128, batch dynamic",
        ),
        _torch_image_net(
            "mobilenet_v3",
            128,
            "MobileNetV3-Small: HardSwish, HardSigmoid squeeze-excite, 5x5 depthwise; 1x3x128x128",
        ),
        _torch_image_net(
            "efficientnet", 128, "EfficientNet-B0 stages at width 0.5: MBConv, SiLU, sigmoid SE; 1x3x128x128"
        ),
        _torch_image_net(
            "unet",
            128,
            "UNet, 4 levels: ConvTranspose2d and bilinear Resize up, Concat skips; "
            "1x3x128x128 -> 1x2x128x128",
            classes_out="mask",
        ),
        _torch_image_net(
            "yolo_fpn",
            256,
            "YOLO-style CSP backbone + FPN (nearest Resize, Concat), Sigmoid heads, 3 anchors x 20 classes; "
            "1x3x256x256 -> 1x4032x25, pixels in [0, 1]",
            norm=None,
            classes_out="boxes",
        ),
        Model(
            "conv1d_audio",
            f"torch=={_version('torch')} torch.nn (benchmarks/corpus.py), random init seed {SEED}",
            _torch_export(
                _net("conv1d_audio", (1, 1, 16000)),
                _rand_example((1, 1, 16000)),
                ["audio"],
                ["log_probs"],
                {"audio": {0: "batch", 2: "samples"}, "log_probs": {0: "batch"}},
                lambda rng: {"audio": _audio(rng, 1, 16000)[:, None]},
                "conv1d_audio",
            ),
            lambda rng: {"audio": _audio(rng, 1, 16000)[:, None]},
            "M5-style raw-waveform classifier: Conv1d (k 80, stride 4) + BatchNorm + ReLU + MaxPool1d; "
            "1 s of 16 kHz audio in [-1, 1]",
            needs=("torch",),
        ),
        Model(
            "lstm_text",
            f"torch=={_version('torch')} torch.nn (benchmarks/corpus.py), random init seed {SEED}",
            _torch_export(
                _net("lstm_text"),
                lambda: _torch_tensors(_token_feeds(np.random.default_rng(SEED), 5000, 2, 32, 4)),
                ["input_ids", "attention_mask"],
                ["logits"],
                {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
                lambda rng: _token_feeds(rng, 5000, 1, 64, 8),
                "lstm_text",
            ),
            lambda rng: _token_feeds(rng, 5000, 1, 64, 8),
            "Embedding + 2-layer bidirectional LSTM (ONNX LSTM op) + masked mean pool; "
            "feed 1x64 with 8 padded",
            needs=("torch",),
        ),
        Model(
            "gru_frames",
            f"torch=={_version('torch')} torch.nn (benchmarks/corpus.py), random init seed {SEED}",
            _torch_export(
                _net("gru_frames"),
                _rand_example((2, 50, 40)),
                ["features"],
                ["probs"],
                {"features": {0: "batch", 1: "frames"}, "probs": {0: "batch", 1: "frames"}},
                lambda rng: _whisper_like(rng, 100, 40),
                "gru_frames",
            ),
            lambda rng: _whisper_like(rng, 100, 40),
            "2-layer GRU (ONNX GRU op) on 40 log-mel features, per-frame softmax; feed 1x100x40",
            needs=("torch",),
        ),
        Model(
            "mobilenet_v2_int8_qdq",
            f"onnxruntime=={_version('onnxruntime')} quantize_static(QDQ, per-channel QInt8 weights, QUInt8 "
            "activations, 8 calibration images) of corpus model mobilenet_v2",
            _qdq("mobilenet_v2"),
            _image_feed("input", 1, 128, 128, _imagenet),
            "static int8 QDQ (QuantizeLinear/DequantizeLinear around every Conv/Gemm)",
            needs=("torch",),
            after=("mobilenet_v2",),
        ),
        Model(
            "bert_tiny_int8_dynamic",
            f"onnxruntime=={_version('onnxruntime')} quantize_dynamic(QInt8 weights, reduce_range=True) "
            "of corpus model bert_tiny",
            _dynamic("bert_tiny"),
            lambda rng: _token_feeds(rng, 8000, 1, 128, 24, token_types=True),
            "dynamic int8: DynamicQuantizeLinear + MatMulInteger; 7-bit weights (reduce_range) keep "
            "onnxruntime exact on CPUs without AVX-512 VNNI",
            needs=("torch", "transformers"),
            after=("bert_tiny",),
        ),
        _wheel_model(
            "ppocr_det_v4",
            "rapidocr-onnxruntime",
            "1.4.4",
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
            _ocr_feed(480, 480, _imagenet),
            "PP-OCRv4 text detection (DB, Paddle export, opset 12); document image 1x3x480x480, "
            "ImageNet-normalised",
        ),
        _wheel_model(
            "ppocr_rec_v4",
            "rapidocr-onnxruntime",
            "1.4.4",
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
            _ocr_feed(48, 320, _half),
            "PP-OCRv4 text recognition (SVTR-LCNet, CTC over 6625 chars); text line 1x3x48x320, (x-0.5)/0.5",
        ),
        _wheel_model(
            "ppocr_cls_v2",
            "rapidocr-onnxruntime",
            "1.4.4",
            "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
            _ocr_feed(48, 192, _half),
            "PP-OCR mobile v2.0 text-direction classifier (opset 11); text line 1x3x48x192, (x-0.5)/0.5",
        ),
        _wheel_model(
            "silero_vad",
            "silero-vad",
            "6.2.3",
            "silero_vad/data/silero_vad.onnx",
            _silero_feeds,
            "Silero VAD v6: an If on the sample rate, STFT as Conv, LSTM cell; 64 + 512 samples at 16 kHz",
        ),
        _wheel_model(
            "silero_vad_16k_op15",
            "silero-vad",
            "6.2.3",
            "silero_vad/data/silero_vad_16k_op15.onnx",
            _silero_feeds,
            "Silero VAD v6, 16 kHz-only opset-15 export (no If); 64 + 512 samples",
        ),
        _wheel_model(
            "silero_vad_openvino_16k",
            "silero-vad",
            "6.2.3",
            "silero_vad/data/silero_vad_openvino_16k.onnx",
            lambda rng: {k: v for k, v in _silero_feeds(rng).items() if k != "sr"},
            "Silero VAD v6, the static-shape 16 kHz export it ships for OpenVINO (which fails to convert "
            "the other two: rank-dynamic Conv input); 1x576",
        ),
        _wheel_model(
            "magika_v3_3",
            "magika",
            "1.0.3",
            "magika/models/standard_v3_3/model.onnx",
            _magika_feeds,
            "Magika file-type classifier (keras2onnx-style export): int32 bytes 1x2048, 256 = padding",
        ),
        _wheel_model(
            "nudenet_yolov8n_320",
            "nudenet",
            "3.4.2",
            "nudenet/320n.onnx",
            _image_feed("images", 1, 320, 320),
            "YOLOv8n detector (Ultralytics export, opset 17): SiLU, C2f, Resize, DFL head; "
            "1x3x320x320 in [0, 1]",
        ),
    ]
    names = [m.name for m in models]
    assert len(names) == len(set(names)), "corpus names must be unique"
    return models


def _torch_tensors(feeds: Feeds) -> tuple:
    import torch

    return tuple(torch.from_numpy(v) for v in feeds.values())


def _whisper_like(rng: np.random.Generator, frames: int, bins: int) -> Feeds:
    """Log-mel-like features: log energies of the frames of speech-like audio, standardised per bin."""
    audio = _audio(rng, 1, frames * 160)[0].reshape(frames, 160)
    spec = np.log(np.abs(np.fft.rfft(audio, n=2 * bins - 2, axis=1)) ** 2 + 1e-6)
    spec = (spec - spec.mean(0)) / (spec.std(0) + 1e-6)
    return {"features": spec[None].astype(np.float32)}


CORPUS = _corpus()


# ------------------------------------------------------------------ building


def _input_meta(feeds: Feeds) -> dict[str, dict]:
    return {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feeds.items()}


def _check_ort(path: Path, feeds: Feeds) -> list[list[int]]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3  # the exporters' unused initializers are not worth a warning each
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    if names != set(feeds):
        raise RuntimeError(f"the feeds name {sorted(feeds)}, the model takes {sorted(names)}")
    outs = sess.run(None, feeds)
    for o, arr in zip(sess.get_outputs(), outs):
        if np.issubdtype(arr.dtype, np.floating) and not np.all(np.isfinite(arr)):
            raise RuntimeError(f"output {o.name} has non-finite values")
    return [list(a.shape) for a in outs]


def _write_json(path: Path, data) -> None:
    tmp = _tmp_path(path)
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _write_npz(path: Path, feeds: Feeds) -> None:
    tmp = _tmp_path(path)
    with open(tmp, "wb") as f:
        np.savez(f, **feeds)
    os.replace(tmp, path)


def build(dir: Path, only: list[str] | None = None) -> dict:
    """Make the missing models of the corpus (or of `only`) in `dir`; returns the manifest."""
    dir.mkdir(parents=True, exist_ok=True)
    if _has("onnxruntime"):
        import onnxruntime as ort

        ort.set_default_logger_severity(3)  # the quantisers' sessions
    by_name = {m.name: m for m in CORPUS}
    unknown = [n for n in only or () if n not in by_name]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; --list shows the corpus")
    manifest_path = dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": []}
    entries = {e["name"]: e for e in manifest.get("models", [])}
    wanted = [m for m in CORPUS if only is None or m.name in only]
    failed: dict[str, str] = {}
    for model in wanted:
        onnx_path, feeds_path = dir / f"{model.name}.onnx", dir / f"{model.name}.feeds.npz"
        missing = [n for n in model.needs if not _has(n)]
        if missing:
            print(f"{model.name}: skipped, {', '.join(missing)} not installed")
            continue
        bad_base = [b for b in model.after if not (dir / f"{b}.onnx").exists()]
        if bad_base:
            print(f"{model.name}: skipped, made from {bad_base}, which could not be made")
            continue
        if onnx_path.exists() and feeds_path.exists() and model.name in entries:
            entries[model.name]["notes"] = model.notes  # (its source stays: the versions it was made with)
            print(f"{model.name}: present")
            continue
        started = time.perf_counter()
        try:
            if not onnx_path.exists():
                model.make(onnx_path, dir)
            feeds = model.feeds(_rng(model.after[0] if model.after else model.name))
            out_shapes = _check_ort(onnx_path, feeds)
        except Exception as exc:  # any failure drops the model, said
            failed[model.name] = f"{type(exc).__name__}: {exc}"
            print(f"{model.name}: DROPPED ({failed[model.name]})")
            for path in [onnx_path, feeds_path, *dir.glob(f".{model.name}*.tmp-{os.getpid()}")]:
                path.unlink(missing_ok=True)
            entries.pop(model.name, None)
            continue
        _write_npz(feeds_path, feeds)
        entries[model.name] = {
            "name": model.name,
            "file": onnx_path.name,
            "source": model.source,
            "feeds": feeds_path.name,
            "notes": model.notes,
            "inputs": _input_meta(feeds),
            "output_shapes": out_shapes,
            "bytes": onnx_path.stat().st_size,
        }
        print(
            f"{model.name}: made in {time.perf_counter() - started:.1f} s "
            f"({onnx_path.stat().st_size:,} bytes)"
        )
        _write_json(manifest_path, {"models": [entries[m.name] for m in CORPUS if m.name in entries]})
    manifest = {"models": [entries[m.name] for m in CORPUS if m.name in entries]}
    _write_json(manifest_path, manifest)
    total = sum(e["bytes"] for e in manifest["models"])
    print(f"{len(manifest['models'])} models in {dir} ({total / 1e6:.1f} MB); manifest: {manifest_path}")
    if failed:
        print("dropped: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="cache folder (default: $NXRT_CORPUS or ~/.cache)"
    )
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument(
        "--list", action="store_true", help="print the corpus (name, source, notes); make nothing"
    )
    args = parser.parse_args(argv)
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    if args.list:
        print("| name | source | notes |")
        print("|---|---|---|")
        for m in CORPUS:
            if only is None or m.name in only:
                print(f"| {m.name} | {m.source} | {m.notes} |")
        return 0
    build(args.dir or default_dir(), only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
