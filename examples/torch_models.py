#!/usr/bin/env python3
"""PyTorch models served as TorchScript by the rust backend's torch engine.

Our own implementations of the real architectures, random weights from a fixed seed:
  * ResNet50 v1.5 (torchvision's layout: stride on the 3x3 conv of the bottleneck);
  * BERT QA (BERT-large: 24 layers, hidden 1024, 16 heads; ``bert_small_pt``: 2 layers,
    hidden 256, 4 heads — the same graph);
  * FastPitch (Łańcucki 2021): symbol embedding 384, encoder and decoder of 6 FFT blocks
    (1 head, conv feed-forward 1536 kernel 3), duration and pitch predictors (2 conv
    layers, 256 filters), pitch embedding added to the encoder output, length regulator,
    linear to 80 mel bins.

FastPitch's Triton interface (as the DeepLearningExamples deployment): INPUT__0 int64
symbol ids padded with 0 to 128 → OUTPUT__0 mel [80, frames] (zero past the item's
length), OUTPUT__1 mel length [1], OUTPUT__2 durations [128], OUTPUT__3 pitch [128].
Every layer masks padding (attention keys, conv inputs), so an item's result does not
depend on what it is batched with.

    python examples/torch_models.py --repo models [--models fastpitch,resnet50_pt,bert_small_pt]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_files import finish, placed, tmp_path  # noqa: E402

# ------------------------------------------------------------------ ResNet50 v1.5


class Bottleneck(nn.Module):
    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        out = width * 4
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = nn.Sequential()
        if stride != 1 or c_in != out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + self.downsample(x))


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers: List[nn.Module] = []
        c = 64
        for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
            for i in range(blocks):
                layers.append(Bottleneck(c, width, stride if i == 0 else 1))
                c = width * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(2048, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.normal_(m.running_mean, std=0.05)
                nn.init.uniform_(m.running_var, 0.8, 1.2)
        for b in self.layers:
            nn.init.constant_(b.bn3.weight, 0.2)  # keep the residual stream's scale steady

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, stride=2, padding=1)
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ------------------------------------------------------------------ BERT QA


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, inner: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.ff1 = nn.Linear(hidden, inner)
        self.ff2 = nn.Linear(inner, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x, bias):
        b, t, h = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(h // self.heads) + bias, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, h)
        x = self.ln1(x + self.out(y))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class BertQA(nn.Module):
    def __init__(self, layers: int = 24, hidden: int = 1024, heads: int = 16, inner: int = 4096,
                 vocab: int = 30522, max_pos: int = 512):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_pos, hidden)
        self.segment = nn.Embedding(2, hidden)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, inner) for _ in range(layers))
        self.qa = nn.Linear(hidden, 2)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids, segments, mask) -> Tuple[torch.Tensor, torch.Tensor]:
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device).unsqueeze(0)
        x = self.ln(self.word(ids.long()) + self.pos(pos) + self.segment(segments.long()))
        bias = ((1.0 - mask.to(x.dtype)) * -10000.0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, bias)
        logits = self.qa(x)
        return logits[..., 0], logits[..., 1]


# ------------------------------------------------------------------ FastPitch


def sinusoid(positions: int, dim: int) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0.0, dim, 2.0) / dim))
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


class FFTBlock(nn.Module):
    """Self-attention (one head) and a convolutional feed-forward, post-LayerNorm."""

    def __init__(self, d_model: int = 384, d_head: int = 64, d_inner: int = 1536, kernel: int = 3):
        super().__init__()
        self.d_head = d_head
        self.qkv = nn.Linear(d_model, 3 * d_head)
        self.o = nn.Linear(d_head, d_model, bias=False)
        self.ln1 = nn.LayerNorm(d_model)
        self.conv1 = nn.Conv1d(d_model, d_inner, kernel, padding=kernel // 2)
        self.conv2 = nn.Conv1d(d_inner, d_model, kernel, padding=kernel // 2)
        self.ln2 = nn.LayerNorm(d_model)

    def forward(self, x, mask):
        # x [B, T, C]; mask [B, T, 1] (1 = real position)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / math.sqrt(self.d_head)
        scores = scores.masked_fill(mask.transpose(1, 2) == 0, -1e4)  # fits fp16
        x = self.ln1(x + self.o(torch.softmax(scores, dim=-1) @ v)) * mask
        y = F.relu(self.conv1(x.transpose(1, 2))) * mask.transpose(1, 2)
        y = self.conv2(y).transpose(1, 2)
        return self.ln2(x + y) * mask


class Predictor(nn.Module):
    """Two conv layers (ReLU, LayerNorm) and a projection to one value per position."""

    def __init__(self, d_in: int = 384, filters: int = 256, kernel: int = 3, bias: float = 0.0):
        super().__init__()
        self.conv1 = nn.Conv1d(d_in, filters, kernel, padding=kernel // 2)
        self.ln1 = nn.LayerNorm(filters)
        self.conv2 = nn.Conv1d(filters, filters, kernel, padding=kernel // 2)
        self.ln2 = nn.LayerNorm(filters)
        self.proj = nn.Linear(filters, 1)
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.constant_(self.proj.bias, bias)

    def forward(self, x, mask):
        y = self.ln1(F.relu(self.conv1((x * mask).transpose(1, 2))).transpose(1, 2)) * mask
        y = self.ln2(F.relu(self.conv2(y.transpose(1, 2))).transpose(1, 2)) * mask
        return self.proj(y).squeeze(-1) * mask.squeeze(-1)


class FastPitch(nn.Module):
    def __init__(self, n_symbols: int = 148, d_model: int = 384, layers: int = 6, n_mel: int = 80,
                 max_duration: int = 20):
        super().__init__()
        self.max_duration = max_duration
        self.embed = nn.Embedding(n_symbols, d_model, padding_idx=0)
        self.encoder = nn.ModuleList(FFTBlock(d_model) for _ in range(layers))
        # biases put the untrained model's durations around 4 frames per symbol
        self.duration = Predictor(d_model, bias=math.log(5.0))
        self.pitch = Predictor(d_model)
        self.pitch_embed = nn.Conv1d(1, d_model, 3, padding=1)
        self.decoder = nn.ModuleList(FFTBlock(d_model) for _ in range(layers))
        self.proj = nn.Linear(d_model, n_mel)
        self.register_buffer("pe", sinusoid(4096, d_model), persistent=False)

    def encode(self, ids) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Encoder, durations and pitch: (frames of the symbols, repeats per symbol, mel lengths,
        durations, pitch)."""
        ids = ids.long()
        b, t = ids.shape
        mask = (ids != 0).unsqueeze(-1).to(self.embed.weight.dtype)
        x = (self.embed(ids) + self.pe[:t].unsqueeze(0)) * mask
        for blk in self.encoder:
            x = blk(x, mask)
        log_dur = self.duration(x, mask)
        dur = torch.clamp(torch.exp(log_dur) - 1.0, 0.0, float(self.max_duration)) * mask.squeeze(-1)
        pitch = self.pitch(x, mask)
        x = x + self.pitch_embed(pitch.unsqueeze(1)).transpose(1, 2) * mask
        reps = torch.round(dur).long()
        return x, reps, reps.sum(dim=1), dur, pitch

    def decode(self, y, mel_len, frames: int) -> torch.Tensor:
        """The mel spectrogram of `frames` regulated frames `y` (past each item's length: masked)."""
        mel_mask = (torch.arange(frames, device=y.device)[None, :] < mel_len[:, None]).unsqueeze(-1).to(y.dtype)
        y = (y + self.pe[:frames].unsqueeze(0)) * mel_mask
        for blk in self.decoder:
            y = blk(y, mel_mask)
        return (self.proj(y) * mel_mask).transpose(1, 2)

    def forward(self, ids) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        x, reps, mel_len, dur, pitch = self.encode(ids)
        b = x.shape[0]
        # length regulator: repeat each encoder frame by its rounded duration
        frames = int(mel_len.max().item()) if b > 0 else 0
        y = torch.zeros(b, frames, x.shape[2], dtype=x.dtype, device=x.device)
        for i in range(b):
            expanded = torch.repeat_interleave(x[i], reps[i], dim=0)
            y[i, : expanded.shape[0]] = expanded
        return self.decode(y, mel_len, frames), mel_len.unsqueeze(1), dur, pitch


# ------------------------------------------------------------------ export

MODELS = {
    "resnet50_pt": (lambda: ResNet50(), 50),
    "bert_small_pt": (lambda: BertQA(layers=2, hidden=256, heads=4, inner=1024), 384),
    "bert_large_pt": (lambda: BertQA(), 384),
    "fastpitch": (lambda: FastPitch(), 2021),
}


def make(name: str) -> nn.Module:
    factory, seed = MODELS[name]
    torch.manual_seed(seed)
    return factory().eval()


def export(repo: str, name: str) -> str:
    model = make(name)
    path = os.path.join(repo, name, "1", "model.pt")
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    where = placed(path, size, name)
    torch.jit.script(model).save(tmp_path(where))
    finish(path, where)
    return path


def fastpitch_inputs(batch: int, seed: int = 0, min_len: int = 20, max_len: int = 128) -> torch.Tensor:
    """Symbol ids padded with 0 to 128; each item a different length."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(batch, 128, dtype=torch.int64)
    for i in range(batch):
        n = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        ids[i, :n] = torch.randint(1, 148, (n,), generator=g)
    return ids


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", default="models")
    p.add_argument("--models", default="fastpitch,resnet50_pt,bert_small_pt")
    p.add_argument("--force", action="store_true")
    a = p.parse_args(argv)
    for name in a.models.split(","):
        path = os.path.join(a.repo, name, "1", "model.pt")
        if os.path.exists(path) and not a.force:
            print(f"{name}: {path} exists, skipping (use --force to rebuild)")
            continue
        print(f"{name}: TorchScript -> {export(a.repo, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
