"""DistilBERT question answering in the Neural Engine layout: the standard CoreML wrapper's weights
(pipeline/export/coreml.py's CoreMLQuestionAnswering), rearranged after the principles Apple published for running
transformers on its Neural Engine ("Deploying Transformers on the Apple Neural Engine", 2022, and
apple/ml-ane-transformers), in code of our own:

- Activations are (batch, channels, 1, sequence) tensors from the embeddings on. The Neural Engine's buffers are
  4-D, channels-first, with the last axis contiguous and padded to 64 bytes: the long sequence axis goes last, the
  singleton on axis 2, so no row is mostly padding.
- Every nn.Linear is an nn.Conv2d with a 1x1 kernel (the same weight as [out, in, 1, 1], the same bias): on that
  layout a projection is a pointwise convolution, which the Neural Engine runs natively, where a Linear on a 3-D
  tensor gets reshapes and transposes around it.
- Layer norm is taken over the channel axis (axis 1) of the 4-D tensor, by a module of our own: the converter
  fuses its normalization into one layer_norm op on axis 1; its scale and shift are a per-channel 1x1 conv.
- Attention is split per head explicitly: q, k and v are cut into n_heads chunks of channels, each head's scores and
  weighted sum are an einsum on 4-D chunks, and the heads are concatenated back along the channels. No tensor gets
  the 5-D reshape and transpose of the usual multi-head code, and each head's scores are a small tensor of their own.
- Padding is masked by adding coreml.MASKED_SCORE (-1e4, finite in float16) to its keys' scores.

The twin computes what the standard wrapper computes, to float32 rounding, and plugs into coreml.py as it is:
convert, read_package, stand_in_from_package (its parameter names are the converter's weight names with "." for "_"),
package_dev_report, proxy_logits. Its projections are nn.Conv2d modules, which coremltools.optimize.torch compresses
as it does nn.Linear ones; the layer norms' scale and shift, plain parameters, stay in float.

What the layout is for, the latency on the Neural Engine, cannot be measured here: CoreML runs only on macOS, and
which ops run on the Neural Engine is decided when the model is loaded on the device.
"""

from __future__ import annotations

import copy

import torch
from transformers.activations import get_activation

from pipeline.export.coreml import MASKED_SCORE, CoreMLQuestionAnswering, compress
from pipeline.plan.config import CoreMLConfig


def conv_1x1(linear: torch.nn.Linear) -> torch.nn.Conv2d:
    """A 1x1 convolution computing on (B, C, 1, S) tensors what `linear` computes on (B, S, C) ones."""
    conv = torch.nn.Conv2d(linear.in_features, linear.out_features, kernel_size=1, bias=linear.bias is not None)
    with torch.no_grad():
        conv.weight.copy_(linear.weight.reshape(linear.out_features, linear.in_features, 1, 1))
        if linear.bias is not None:
            conv.bias.copy_(linear.bias)
    return conv


class ChannelLayerNorm(torch.nn.Module):
    """Layer norm over the channels (axis 1) of a (B, C, 1, S) tensor: what nn.LayerNorm computes over the last
    axis of a (B, S, C) one.

    The normalization is written as the converter's channel-axis layer-norm pattern (mean, x - mean, its square as
    a product, mean, + eps, rsqrt, product), which it fuses into one layer_norm op on axis 1. The scale and shift
    are applied as a per-channel 1x1 convolution (weight [C, 1, 1, 1], bias [C]) rather than an elementwise
    multiply and add: the converter removes a multiply by ones and an add of zeros (an untrained layer norm) and
    renames a reshaped [C] tensor, and either way the package would hold no tensor the stand-in could read back
    into this module (coreml.parameters_from_package). A conv keeps both, under their own names, whatever they hold.
    """

    def __init__(self, layer_norm: torch.nn.LayerNorm):
        super().__init__()
        self.eps = layer_norm.eps
        self.weight = torch.nn.Parameter(layer_norm.weight.detach().clone().reshape(-1, 1, 1, 1))
        self.bias = torch.nn.Parameter(layer_norm.bias.detach().clone())

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        centered = x - x.mean(dim=1, keepdim=True)
        variance = (centered * centered).mean(dim=1, keepdim=True)  # biased, as nn.LayerNorm's
        return centered * torch.rsqrt(variance + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In float16 (proxy_logits) the statistics are taken in float32, as nn.LayerNorm's kernel takes them: a
        # square overflows float16 past 256. The converter traces in float32, where this is the plain path.
        normalized = self.normalize(x.float()).to(x.dtype) if x.dtype == torch.float16 else self.normalize(x)
        return torch.nn.functional.conv2d(normalized, self.weight, self.bias, groups=self.weight.shape[0])


class HeadSplitAttention(torch.nn.Module):
    """DistilBERT's multi-head self-attention on (B, C, 1, S) tensors, one explicit chunk of channels per head."""

    def __init__(self, attention):
        super().__init__()
        self.n_heads, self.head_dim = attention.n_heads, attention.dim // attention.n_heads
        self.q_lin, self.k_lin = conv_1x1(attention.q_lin), conv_1x1(attention.k_lin)
        self.v_lin, self.out_lin = conv_1x1(attention.v_lin), conv_1x1(attention.out_lin)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        # x: (B, C, 1, S); additive_mask: (B, S_keys, 1, 1), 0 on tokens and MASKED_SCORE on padding.
        scale = self.head_dim ** -0.5
        # Each query chunk is scaled after the split, as DistilBERT scales q before the product: a constant
        # multiplying a convolution's output directly would be folded into its weights by the converter, and the
        # package would hold no tensor equal to q_lin's.
        queries = [query * scale for query in self.q_lin(x).split(self.head_dim, dim=1)]  # (B, head_dim, 1, S)
        # The keys transposed once per layer, to (B, S, 1, C): both products below are then the one einsum form
        # the converter keeps as an einsum op ("nchw,nwhu->nchu"), not a matmul between transposes.
        keys = self.k_lin(x).transpose(1, 3).split(self.head_dim, dim=3)  # (B, S_keys, 1, head_dim)
        values = self.v_lin(x).split(self.head_dim, dim=1)  # (B, head_dim, 1, S_keys)
        heads = []
        for query, key, value in zip(queries, keys, values):
            scores = torch.einsum("bchq,bkhc->bkhq", query, key) + additive_mask  # (B, S_keys, 1, S_queries)
            weights = scores.softmax(dim=1)  # over the keys
            heads.append(torch.einsum("bkhq,bchk->bchq", weights, value))  # (B, head_dim, 1, S_queries)
        return self.out_lin(torch.cat(heads, dim=1))


class FeedForward(torch.nn.Module):
    def __init__(self, ffn, activation: str):
        super().__init__()
        self.lin1, self.lin2 = conv_1x1(ffn.lin1), conv_1x1(ffn.lin2)
        self.activation = get_activation(activation)  # the function DistilBERT's own FFN applies (erf for gelu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin2(self.activation(self.lin1(x)))


class TransformerBlock(torch.nn.Module):
    """One DistilBERT block (post-norm: attention, add, norm, FFN, add, norm) on (B, C, 1, S) tensors."""

    def __init__(self, block, activation: str):
        super().__init__()
        self.attention = HeadSplitAttention(block.attention)
        self.sa_layer_norm = ChannelLayerNorm(block.sa_layer_norm)
        self.ffn = FeedForward(block.ffn, activation)
        self.output_layer_norm = ChannelLayerNorm(block.output_layer_norm)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        x = self.sa_layer_norm(x + self.attention(x, additive_mask))
        return self.output_layer_norm(x + self.ffn(x))


class Embeddings(torch.nn.Module):
    """Word plus position embeddings (a learned or sinusoidal table, read as it is), normalized, as (B, C, 1, S)."""

    def __init__(self, embeddings):
        super().__init__()
        # Copies: the twin's tables change (proxy_logits halves the model) without the standard wrapper's changing.
        self.word_embeddings = copy.deepcopy(embeddings.word_embeddings)
        self.position_embeddings = copy.deepcopy(embeddings.position_embeddings)
        self.layer_norm = ChannelLayerNorm(embeddings.LayerNorm)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        embedded = self.word_embeddings(input_ids) + self.position_embeddings(positions)  # (B, S, C)
        # A table lookup gives a row per token; the layout wants the channels second.
        return self.layer_norm(embedded.transpose(1, 2).unsqueeze(2))


class NeuralEngineQuestionAnswering(torch.nn.Module):
    """A DistilBERT QA model in the Neural Engine layout with the standard wrapper's interface: forward(input_ids,
    attention_mask=None) -> (start_logits, end_logits), each (B, S); the mask is derived from the padding where
    `mask_input` is False."""

    def __init__(self, wrapped: CoreMLQuestionAnswering):
        super().__init__()
        if wrapped.model_type != "distilbert" or wrapped.token_types:
            raise ValueError(f"the Neural Engine layout is built for DistilBERT (no token types); "
                             f"this model is a {wrapped.model_type!r} ({type(wrapped.model).__name__})")
        config, distilbert = wrapped.model.config, wrapped.model.distilbert
        self.mask_input, self.pad_token_id = wrapped.mask_input, wrapped.pad_token_id
        self.embeddings = Embeddings(distilbert.embeddings)
        self.layers = torch.nn.ModuleList(TransformerBlock(block, config.activation)
                                          for block in distilbert.transformer.layer)
        self.qa_outputs = conv_1x1(wrapped.model.qa_outputs)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        if not self.mask_input:
            attention_mask = (input_ids != self.pad_token_id).to(torch.int32)
        x = self.embeddings(input_ids)  # (B, C, 1, S)
        # One score per key, broadcast over the queries: keys are axis 1 of a head's (B, S_keys, 1, S_queries) scores.
        additive_mask = (1.0 - attention_mask.to(x.dtype))[:, :, None, None] * MASKED_SCORE
        for layer in self.layers:
            x = layer(x, additive_mask)
        logits = self.qa_outputs(x)  # (B, 2, 1, S)
        return logits[:, 0, 0, :], logits[:, 1, 0, :]


def neural_engine_twin(wrapped: CoreMLQuestionAnswering) -> NeuralEngineQuestionAnswering:
    """The Neural Engine layout of `wrapped` (a DistilBERT), in eval mode, with copies of its weights (changing one
    model's leaves the other's); ValueError naming the model type for any other model."""
    return NeuralEngineQuestionAnswering(wrapped).eval()


def converted_module(wrapped: CoreMLQuestionAnswering, variant: str, cfg: CoreMLConfig) -> torch.nn.Module:
    """What a CoreML variant's package is converted from: the Neural Engine layout for ane, else the wrapper
    compressed on the PyTorch side (coreml.compress)."""
    return neural_engine_twin(wrapped) if variant == "ane" else compress(wrapped, variant, cfg)


def gated_architecture(wrapped: CoreMLQuestionAnswering, variant: str) -> torch.nn.Module:
    """The module a variant's package was converted from, whose parameters its weights are read back into."""
    return neural_engine_twin(wrapped) if variant == "ane" else wrapped
