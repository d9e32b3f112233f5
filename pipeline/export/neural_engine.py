"""DistilBERT in the layout Apple's Neural Engine runs fast, for the CoreML package `ane.mlpackage`: the same weights
as the standard package, arranged the way Apple's published Neural Engine guidance for transformers asks
("Deploying Transformers on the Apple Neural Engine", 2022), in code of our own:

  - activations as (batch, channels, 1, sequence) tensors from the embeddings on: the Neural Engine's native 4-D
    layout, with the sequence on the last axis so a memory row holds one channel of many tokens;
  - every nn.Linear as a 1x1 nn.Conv2d (the same weight, as [out, in, 1, 1]), which the Neural Engine maps
    directly, where a Linear on a 3-D tensor costs transposes and reshapes around it;
  - layer norm over the channel axis (axis 1) of that tensor;
  - attention split per head explicitly (a chunk of channels each, einsum for the scores and the weighted sum),
    so no tensor gets the 5-D reshape and transpose of the usual multi-head code;
  - the additive mask at -1e4 (coreml.MASKED_SCORE), finite in float16.

The package is converted and gated like the others (pipeline/export/coreml.py): fp16, the enumerated lengths, its own
weights read back out of it into this module and run at float16 on the gated dev questions. What cannot be measured
on Linux is the point of the layout: its Neural Engine latency (CoreML runs only on macOS).
"""

from __future__ import annotations

import math

import torch

from pipeline.export.coreml import MASKED_SCORE, CoreMLQuestionAnswering


def conv_from_linear(linear: torch.nn.Linear) -> torch.nn.Conv2d:
    """A 1x1 convolution computing what `linear` computes, on (batch, channels, 1, sequence) tensors."""
    conv = torch.nn.Conv2d(linear.in_features, linear.out_features, kernel_size=1, bias=linear.bias is not None)
    with torch.no_grad():
        conv.weight.copy_(linear.weight[:, :, None, None])
        if linear.bias is not None:
            conv.bias.copy_(linear.bias)
    return conv


class ChannelLayerNorm(torch.nn.Module):
    """Layer norm over axis 1 of a (batch, channels, 1, sequence) tensor. The scale and shift are stored as
    (1, channels, 1, 1), so the converted package holds them as they are used (no reshape for the converter to
    fold into a tensor of another name)."""

    # An all-ones scale or all-zeros shift is removed by the converter as a no-op, so the package does not store it
    # (coreml.parameters_from_package reads it as its own value).
    elided_when_identity = True

    def __init__(self, layer_norm: torch.nn.LayerNorm):
        super().__init__()
        self.eps = layer_norm.eps
        self.weight = torch.nn.Parameter(layer_norm.weight.detach().clone().view(1, -1, 1, 1))
        self.bias = torch.nn.Parameter(layer_norm.bias.detach().clone().view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centered = x - x.mean(dim=1, keepdim=True)
        variance = (centered * centered).mean(dim=1, keepdim=True)
        return centered * torch.rsqrt(variance + self.eps) * self.weight + self.bias


class HeadSplitAttention(torch.nn.Module):
    """DistilBERT's self-attention with 1x1 convolutions and one explicit chunk of channels per head."""

    def __init__(self, attention):
        super().__init__()
        self.n_heads = attention.n_heads
        self.head_dim = attention.dim // attention.n_heads
        self.q, self.k = conv_from_linear(attention.q_lin), conv_from_linear(attention.k_lin)
        self.v, self.out = conv_from_linear(attention.v_lin), conv_from_linear(attention.out_lin)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        # x: (B, C, 1, S); additive_mask: (B, S_keys, 1, 1), 0 on real tokens, MASKED_SCORE on padding
        # The scale goes on the scores: on the query, the converter would fold it into q's weights, and the package
        # would hold a tensor no parameter has (its gate reads the weights back by name).
        scale = 1.0 / math.sqrt(self.head_dim)
        queries = self.q(x).split(self.head_dim, dim=1)
        keys, values = self.k(x).split(self.head_dim, dim=1), self.v(x).split(self.head_dim, dim=1)
        heads = []
        for query, key, value in zip(queries, keys, values):
            scores = torch.einsum("bchq,bchk->bkhq", query, key) * scale + additive_mask  # (B, S_keys, 1, S_queries)
            weights = torch.softmax(scores, dim=1)
            heads.append(torch.einsum("bkhq,bchk->bchq", weights, value))  # (B, head_dim, 1, S_queries)
        return self.out(torch.cat(heads, dim=1))


class NeuralEngineBlock(torch.nn.Module):
    """One DistilBERT transformer block (post-norm) in the Neural Engine layout."""

    def __init__(self, block):
        super().__init__()
        self.attention = HeadSplitAttention(block.attention)
        self.attention_norm = ChannelLayerNorm(block.sa_layer_norm)
        self.ffn_in, self.ffn_out = conv_from_linear(block.ffn.lin1), conv_from_linear(block.ffn.lin2)
        self.output_norm = ChannelLayerNorm(block.output_layer_norm)
        activation = block.ffn.activation
        self.activation = activation if isinstance(activation, torch.nn.Module) else torch.nn.GELU()

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.attention(x, additive_mask))
        return self.output_norm(x + self.ffn_out(self.activation(self.ffn_in(x))))


class NeuralEngineQuestionAnswering(torch.nn.Module):
    """A DistilBERT QA model in the Neural Engine layout, with the CoreML wrapper's interface (input_ids, and
    attention_mask where mask_input; start and end logits [batch, sequence])."""

    def __init__(self, wrapped: CoreMLQuestionAnswering):
        super().__init__()
        if wrapped.model_type != "distilbert":
            raise ValueError(f"the Neural Engine layout is built for DistilBERT; this model is {wrapped.model_type!r}")
        distilbert = wrapped.model.distilbert
        self.mask_input, self.pad_token_id = wrapped.mask_input, wrapped.pad_token_id
        self.word_embeddings = distilbert.embeddings.word_embeddings
        self.position_embeddings = distilbert.embeddings.position_embeddings
        self.embedding_norm = ChannelLayerNorm(distilbert.embeddings.LayerNorm)
        self.layers = torch.nn.ModuleList(NeuralEngineBlock(block) for block in distilbert.transformer.layer)
        self.qa_outputs = conv_from_linear(wrapped.model.qa_outputs)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        if not self.mask_input:
            attention_mask = (input_ids != self.pad_token_id).to(torch.int32)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        embedded = self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]  # (B, S, C)
        x = self.embedding_norm(embedded.transpose(1, 2).unsqueeze(2))  # (B, C, 1, S) from here on
        additive_mask = ((1.0 - attention_mask.to(x.dtype)) * MASKED_SCORE)[:, :, None, None]  # (B, S, 1, 1)
        for layer in self.layers:
            x = layer(x, additive_mask)
        logits = self.qa_outputs(x)  # (B, 2, 1, S)
        return logits[:, 0, 0, :], logits[:, 1, 0, :]


def neural_engine_twin(wrapped: CoreMLQuestionAnswering) -> NeuralEngineQuestionAnswering:
    """The Neural Engine layout of `wrapped` (a DistilBERT), from the same weight values; ValueError for another
    model type, naming it."""
    return NeuralEngineQuestionAnswering(wrapped).eval()
