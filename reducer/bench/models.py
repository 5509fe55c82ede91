"""Parameter lists of real architectures, generated from their definitions (no downloads).

Each list is ``[(name, shape), ...]`` in ``model.named_parameters()`` order, as PyTorch would
register them:

* ``resnet50``: torchvision's ``resnet50()`` (Bottleneck blocks [3, 4, 6, 3], 1000 classes):
  161 tensors, 25,557,032 parameters (BatchNorm running statistics are buffers, not parameters).
* ``bert-base``: Hugging Face's ``BertModel`` for bert-base-uncased (hidden 768, 12 layers,
  intermediate 3072, vocabulary 30522, 512 positions, pooler): 199 tensors, 109,482,240.
* ``gpt2-medium``: Hugging Face's ``GPT2LMHeadModel`` for gpt2-medium (n_embd 1024, 24 layers,
  vocabulary 50257, 1024 positions; the LM head is tied to ``wte``, so it is no extra
  parameter): 292 tensors, 354,823,168.

``scale`` (tests) shrinks every tensor to ``max(1, round(numel * scale))`` elements, flattened.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

Shapes = list[tuple[str, tuple[int, ...]]]


# ------------------------------------------------------------------------ building blocks
def _bn(prefix: str, channels: int) -> Shapes:
    return [(f"{prefix}.weight", (channels,)), (f"{prefix}.bias", (channels,))]


def _linear(prefix: str, n_in: int, n_out: int) -> Shapes:
    """torch.nn.Linear: weight (out, in), bias (out)."""
    return [(f"{prefix}.weight", (n_out, n_in)), (f"{prefix}.bias", (n_out,))]


def _conv1d(prefix: str, n_in: int, n_out: int) -> Shapes:
    """GPT-2's transformers.Conv1D: weight (in, out), bias (out)."""
    return [(f"{prefix}.weight", (n_in, n_out)), (f"{prefix}.bias", (n_out,))]


# ------------------------------------------------------------------------ architectures
def resnet(blocks: tuple[int, ...] = (3, 4, 6, 3), num_classes: int = 1000) -> Shapes:
    """torchvision ResNet with Bottleneck blocks (expansion 4, stride on conv2, no bias on convs)."""
    expansion = 4
    out: Shapes = [("conv1.weight", (64, 3, 7, 7))] + _bn("bn1", 64)
    inplanes = 64
    for stage, (n, width) in enumerate(zip(blocks, (64, 128, 256, 512)), start=1):
        for b in range(n):
            p = f"layer{stage}.{b}"
            out += [(f"{p}.conv1.weight", (width, inplanes, 1, 1))] + _bn(f"{p}.bn1", width)
            out += [(f"{p}.conv2.weight", (width, width, 3, 3))] + _bn(f"{p}.bn2", width)
            out += [(f"{p}.conv3.weight", (width * expansion, width, 1, 1))] + _bn(f"{p}.bn3", width * expansion)
            if b == 0:  # the first block of a stage changes the channel count (and stride): a projection
                out += [(f"{p}.downsample.0.weight", (width * expansion, inplanes, 1, 1))]
                out += _bn(f"{p}.downsample.1", width * expansion)
            inplanes = width * expansion
    out += _linear("fc", inplanes, num_classes)
    return out


def bert(
    hidden: int = 768,
    layers: int = 12,
    intermediate: int = 3072,
    vocab: int = 30522,
    positions: int = 512,
    type_vocab: int = 2,
) -> Shapes:
    """Hugging Face BertModel (embeddings, encoder layers, pooler)."""
    out: Shapes = [
        ("embeddings.word_embeddings.weight", (vocab, hidden)),
        ("embeddings.position_embeddings.weight", (positions, hidden)),
        ("embeddings.token_type_embeddings.weight", (type_vocab, hidden)),
    ]
    out += _bn("embeddings.LayerNorm", hidden)
    for i in range(layers):
        p = f"encoder.layer.{i}"
        for proj in ("query", "key", "value"):
            out += _linear(f"{p}.attention.self.{proj}", hidden, hidden)
        out += _linear(f"{p}.attention.output.dense", hidden, hidden)
        out += _bn(f"{p}.attention.output.LayerNorm", hidden)
        out += _linear(f"{p}.intermediate.dense", hidden, intermediate)
        out += _linear(f"{p}.output.dense", intermediate, hidden)
        out += _bn(f"{p}.output.LayerNorm", hidden)
    out += _linear("pooler.dense", hidden, hidden)
    return out


def gpt2(n_embd: int = 1024, layers: int = 24, vocab: int = 50257, positions: int = 1024) -> Shapes:
    """Hugging Face GPT2LMHeadModel (transformer.*; lm_head.weight is tied to wte.weight)."""
    out: Shapes = [("transformer.wte.weight", (vocab, n_embd)), ("transformer.wpe.weight", (positions, n_embd))]
    for i in range(layers):
        p = f"transformer.h.{i}"
        out += _bn(f"{p}.ln_1", n_embd)
        out += _conv1d(f"{p}.attn.c_attn", n_embd, 3 * n_embd)
        out += _conv1d(f"{p}.attn.c_proj", n_embd, n_embd)
        out += _bn(f"{p}.ln_2", n_embd)
        out += _conv1d(f"{p}.mlp.c_fc", n_embd, 4 * n_embd)
        out += _conv1d(f"{p}.mlp.c_proj", 4 * n_embd, n_embd)
    out += _bn("transformer.ln_f", n_embd)
    return out


@dataclass(frozen=True)
class ModelInfo:
    build: Callable[[], Shapes]
    tensors: int  # the published architecture's counts: a generated list must match them
    parameters: int
    description: str


MODELS: dict[str, ModelInfo] = {
    "resnet50": ModelInfo(resnet, 161, 25_557_032, "torchvision resnet50 (25.6M parameters)"),
    "bert-base": ModelInfo(bert, 199, 109_482_240, "Hugging Face BertModel, bert-base-uncased (110M)"),
    "gpt2-medium": ModelInfo(gpt2, 292, 354_823_168, "Hugging Face GPT2LMHeadModel, gpt2-medium (355M)"),
}


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def total_parameters(shapes: Shapes) -> int:
    return sum(numel(s) for _, s in shapes)


def parameters(model: str, scale: float = 1.0) -> Shapes:
    """The parameter list of `model` (a key of MODELS), checked against its published counts.

    scale < 1 shrinks every tensor to max(1, round(numel * scale)) elements (a flat shape), for tests."""
    try:
        info = MODELS[model]
    except KeyError:
        raise KeyError(f"unknown model {model!r}: choose from {', '.join(MODELS)}") from None
    shapes = info.build()
    if len(shapes) != info.tensors or total_parameters(shapes) != info.parameters:
        raise AssertionError(
            f"{model}: generated {len(shapes)} tensors / {total_parameters(shapes):,} parameters, "
            f"expected {info.tensors} / {info.parameters:,}"
        )
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    if scale != 1:
        shapes = [(name, (max(1, round(numel(s) * scale)),)) for name, s in shapes]
    return shapes
