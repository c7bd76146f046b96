"""The benchmark's models, written here in the shapes people train.

Each model runs its blocks through `self.run_block`, so one flag (`model.checkpointed = True`)
wraps every block in non-reentrant `torch.utils.checkpoint` — per-block checkpointing, the
baseline actpack is measured against — and `model.checkpointed = "selective"` checkpoints each
block selectively (`create_selective_checkpoint_contexts`, the policy of PyTorch's docs: the
outputs of compute-intensive ops, matrix products, convolutions and attention, are saved, the
rest is recomputed). `SIZES[name]` holds the CPU-sized configuration (the
default) and the GPU-sized one (`--full`); `Task` pairs a model with its data and loss.
"""
import glob
import os

import actpack
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)

# Selective checkpointing's saved ops: what is expensive to recompute.
_aten = torch.ops.aten
COMPUTE_INTENSIVE = {
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.convolution.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
}


def _save_compute_intensive(ctx, op, *args, **kwargs):
    return (CheckpointPolicy.MUST_SAVE if op in COMPUTE_INTENSIVE
            else CheckpointPolicy.PREFER_RECOMPUTE)


def selective_context():
    return create_selective_checkpoint_contexts(_save_compute_intensive)



class Blocks(nn.Module):
    """Base: `run_block` checkpoints a block when `checkpointed` is set, and marks it as a
    region actpack may recompute (`actpack.recompute`, which runs it plainly unless the budget
    recomputes: recompute=True, or "auto" once codecs alone cannot hold the step). `micro_batch`: the samples a recomputed block runs at a time, for
    models whose blocks treat samples independently (no batch norm)."""
    checkpointed = False
    micro_batch = None

    def run_block(self, block, *args):
        if self.checkpointed == "selective" and torch.is_grad_enabled():
            return checkpoint(block, *args, use_reentrant=False, context_fn=selective_context)
        if self.checkpointed and torch.is_grad_enabled():
            return checkpoint(block, *args, use_reentrant=False)
        return actpack.recompute(block, *args, micro_batch=self.micro_batch)


# ---- ResNet-50 (torchvision's layout: bottlenecks [3, 4, 6, 3], stride on the 3x3) ----

class Bottleneck(nn.Module):
    def __init__(self, inplanes, planes, stride):
        super().__init__()
        out = planes * 4
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        h = self.relu(self.bn1(self.conv1(x)))
        h = self.relu(self.bn2(self.conv2(h)))
        return self.relu(self.bn3(self.conv3(h)) + identity)


class ResNet50(Blocks):
    def __init__(self, classes=1000, width=64):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        blocks, inplanes = [], width
        for i, count in enumerate([3, 4, 6, 3]):
            planes = width * 2 ** i
            for j in range(count):
                blocks.append(Bottleneck(inplanes, planes, 2 if (j == 0 and i > 0) else 1))
                inplanes = planes * 4
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = self.run_block(block, h)
        return self.fc(h.mean((2, 3)))


# ---- ViT-B/16-like encoder and GPT-2-like decoder: pre-norm blocks, SDPA ----

class TransformerBlock(nn.Module):
    def __init__(self, dim, heads, causal):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attend(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def attend(self, h):
        """Self-attention with its projection, in a function of its own as nanoGPT's and
        Hugging Face's GPT-2 have it: q, k, v and the heads' output die when it returns,
        instead of staying alive (as locals of forward) through the MLP."""
        b, t, d = h.shape
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(a.transpose(1, 2).reshape(b, t, d))


class ViT(Blocks):
    micro_batch = 8
    def __init__(self, image=224, patch=16, dim=768, depth=12, heads=12, classes=1000):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        tokens = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, False) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        h = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], 1) + self.position
        for block in self.blocks:
            h = self.run_block(block, h)
        return self.head(self.norm(h[:, 0]))


class GPT(Blocks):
    """Byte-level (vocabulary 256), so it trains on real text without a tokenizer."""
    micro_batch = 8

    def __init__(self, context=1024, dim=768, depth=12, heads=12, vocab=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's: the head shares it
        self.position = nn.Parameter(torch.randn(context, dim) * 0.02)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, True) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied, as GPT-2

    def forward(self, tokens):
        h = self.embed(tokens) + self.position[:tokens.shape[1]]
        for block in self.blocks:
            h = self.run_block(block, h)
        return self.head(self.norm(h))


# ---- UNet: two conv-BN-ReLU per level, skips held from the encoder to the decoder ----

def _double_conv(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Up(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cout, 2, 2)
        self.conv = _double_conv(2 * cout, cout)

    def forward(self, x, skip):
        return self.conv(torch.cat([self.up(x), skip], 1))


class UNet(Blocks):
    def __init__(self, width=64, levels=4, classes=2):
        super().__init__()
        channels = [width * 2 ** i for i in range(levels + 1)]
        self.down = nn.ModuleList([_double_conv(3, channels[0])] +
                                  [_double_conv(channels[i], channels[i + 1])
                                   for i in range(levels)])
        self.up = nn.ModuleList(Up(channels[i + 1], channels[i]) for i in reversed(range(levels)))
        self.head = nn.Conv2d(channels[0], classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = self.run_block(block, x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        skips.pop()
        for block in self.up:
            x = self.run_block(block, x, skips.pop())
        return self.head(x)


# ---- tasks: model, data and loss ----

def load_corpus(max_bytes=4 << 20):
    """The bytes of the Python standard library's .py files, in a fixed order: real text
    that every machine with Python has."""
    stdlib = os.path.dirname(os.__file__)
    chunks, total = [], 0
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        with open(path, "rb") as f:
            data = f.read()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    # Bytes, widened per batch: the corpus is data, not part of a training step's memory.
    return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8)



class Task:
    """A model with its data (`batch(size, index)`, deterministic) and its loss."""

    def __init__(self, name, kind, model_args, optimizer, image=None, context=None,
                 classes=None):
        self.name, self.kind, self.model_args = name, kind, model_args
        self.optimizer, self.image, self.context, self.classes = optimizer, image, context, classes
        self._corpus = load_corpus() if kind == "gpt" else None

    def model(self, device, seed=0):
        torch.manual_seed(seed)
        cls = {"resnet50": ResNet50, "vit": ViT, "gpt": GPT, "unet": UNet}[self.kind]
        return cls(**self.model_args).to(device)

    def make_optimizer(self, model):
        if self.optimizer == "sgd":
            return torch.optim.SGD(model.parameters(), lr=0.002, momentum=0.9, weight_decay=1e-4)
        return torch.optim.AdamW(model.parameters(), lr=3e-4)

    def batch(self, size, index, device):
        """Batch `index` of `size` samples: real text windows for the decoder; for the image
        models a fixed synthetic set (images from a seeded generator, labels a function of the
        image, so the loss can fall)."""
        g = torch.Generator().manual_seed(1000 + index)
        if self.kind == "gpt":
            starts = torch.randint(0, self._corpus.numel() - self.context - 1, (size,),
                                   generator=g)
            window = torch.stack([self._corpus[s:s + self.context + 1] for s in starts.tolist()])
            window = window.long().to(device)
            return window[:, :-1], window[:, 1:]
        x = torch.randn(size, 3, self.image, self.image, generator=g)
        if self.kind == "unet":
            # Per-pixel: which of the red and blue channels is brighter (after a blur).
            smooth = F.avg_pool2d(x, 5, 1, 2)
            return x.to(device), (smooth[:, 0] > smooth[:, 2]).long().to(device)
        # Which quadrant of the image is brightest, plus the brightest channel: 12 classes
        # folded into `classes`.
        half = self.image // 2
        quadrants = torch.stack([x[:, :, :half, :half].mean((1, 2, 3)),
                                 x[:, :, :half, half:].mean((1, 2, 3)),
                                 x[:, :, half:, :half].mean((1, 2, 3)),
                                 x[:, :, half:, half:].mean((1, 2, 3))], 1)
        label = quadrants.argmax(1) * 3 + x.mean((2, 3)).argmax(1)
        return x.to(device), (label % self.classes).to(device)

    @staticmethod
    def loss(out, target):
        if out.dim() == 3:  # [b, t, vocab]
            return F.cross_entropy(out.flatten(0, 1), target.flatten())
        return F.cross_entropy(out, target)


def tasks(size):
    """The suite's tasks at `size`: "cpu" (the default), "full" (GPU sizes) or "smoke" (tiny,
    for the test command)."""
    if size == "full":
        return [
            Task("resnet50", "resnet50", {"classes": 1000}, "sgd", image=224, classes=1000),
            Task("vit-b16", "vit", {}, "adamw", image=224, classes=1000),
            Task("gpt2-small", "gpt", {}, "adamw", context=1024),
            Task("unet", "unet", {}, "sgd", image=256),
        ]
    if size == "smoke":
        return [
            Task("resnet50", "resnet50", {"classes": 10, "width": 8}, "sgd", image=32,
                 classes=10),
            Task("vit-b16", "vit", {"image": 32, "patch": 8, "dim": 32, "depth": 2, "heads": 2,
                                    "classes": 10}, "adamw", image=32, classes=10),
            Task("gpt2-small", "gpt", {"context": 64, "dim": 32, "depth": 2, "heads": 2},
                 "adamw", context=64),
            Task("unet", "unet", {"width": 8, "levels": 2}, "sgd", image=32),
        ]
    return [
        # torchvision's ResNet-50 at 64 x 64 (the 224 x 224 model's layers, 1/12 of its pixels).
        Task("resnet50", "resnet50", {"classes": 100}, "sgd", image=64, classes=100),
        # ViT-B/16's depth and blocks at a third of its width, 64 x 64 images in 8 x 8 patches.
        Task("vit-b16", "vit", {"image": 64, "patch": 8, "dim": 256, "depth": 12, "heads": 4,
                                "classes": 100}, "adamw", image=64, classes=100),
        # GPT-2 small's 12 causal blocks at a quarter of its width (64 per head), context 128.
        Task("gpt2-small", "gpt", {"context": 128, "dim": 192, "depth": 12, "heads": 3},
             "adamw", context=128),
        Task("unet", "unet", {"width": 32, "levels": 4}, "sgd", image=64),
    ]


def parameter_groups(model):
    """Parameter name -> its group for the gradient figures: the block it sits in
    ("blocks.3", "down.1") or the top-level module ("stem", "head")."""
    groups = {}
    for name, _ in model.named_parameters():
        parts = name.split(".")
        groups[name] = ".".join(parts[:2]) if parts[0] in ("blocks", "down", "up") else parts[0]
    return groups


def param_count(model):
    return sum(p.numel() for p in model.parameters())

