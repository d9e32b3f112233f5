"""Unpadded ("packed") forward of the BERT teacher and the DistilBERT student.

A micro-batch's sequences are laid end to end as one flat sequence of real tokens, described by cumulative
sequence lengths (cu_seqlens, the layout of flash attention's variable-length kernels): embeddings, linear layers,
layer norms and the losses touch only real tokens, and attention stays inside each sequence (no token attends to
another document). Which sequences share a micro-batch does not change: the batch plan is the padded path's.

Each layer projects queries, keys and values in one matmul, over weights concatenated from the Hugging Face
module's own query/key/value Linear layers at every forward. The concatenation is part of the autograd graph, so
gradients reach the HF parameters, which stay THE parameters: the trained student is saved and loaded as a plain
`DistilBertForMaskedLM`. Every dropout of the HF modules is applied where they apply it, attention dropout
included (a kernel without it would change the student's objective).

Attention, by device:
- CUDA: jagged nested tensors (`torch.nested.nested_tensor_from_jagged`) through
  `F.scaled_dot_product_attention`, which dispatches to flash attention's variable-length kernel in bf16/fp16 and to
  memory-efficient attention in fp32, both with dropout. The longest sequence is handed over from the host, so
  nothing is read back from the device. `torch.nn.attention.varlen.varlen_attn` (torch 2.13) is not used: its
  dropout is fixed at 0. The `flash_attn` package is not needed.
- CPU: each sequence's queries, keys and values are scattered into a [sequences, longest, heads, head size] grid,
  attended by SDPA under a key-padding mask, and gathered back: a per-sequence loop as one batched call, with the
  attention cost of the padded batch and every other operation on real tokens only.

Static shapes: `pipeline.data.mlm_batches.pack_masked_batch` pads the flat token count up to a multiple of
`tokens_multiple_of`, so torch.compile and CUDA graphs see few token counts. The padding tokens form sequences of
their own (they attend only to each other), none longer than the batch's longest, and no loss reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import BertModel, DistilBertModel
from transformers.modeling_outputs import BaseModelOutput

# ---------------------------------------------------------------------------------------------------------------
# Inputs (a packed batch is built by pipeline.data.mlm_batches.pack_masked_batch)
# ---------------------------------------------------------------------------------------------------------------


def encoder_inputs(batch: dict) -> dict:
    """The keyword arguments of an encoder's forward: the packed layout's, or the padded batch's."""
    if "cu_seqlens" in batch:
        return {key: batch[key] for key in ("input_ids", "position_ids", "cu_seqlens", "max_seqlen")}
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


# ---------------------------------------------------------------------------------------------------------------
# Variable-length attention
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SequenceLayout:
    """Where the sequences of a packed batch lie, computed once per forward and shared by every layer."""

    cu_seqlens: Tensor  # int32 [sequences + 1], on the device
    max_seqlen: int  # from the host: nothing is read back from the device
    grid_rows: Tensor | None = None  # CPU: each token's row in the [sequences x max_seqlen] grid
    key_is_real: Tensor | None = None  # CPU: [sequences, max_seqlen], False past a sequence's end


def sequence_layout(cu_seqlens: Tensor, max_seqlen: int, n_tokens: int) -> SequenceLayout:
    if cu_seqlens.is_cuda:
        return SequenceLayout(cu_seqlens, max_seqlen)
    lengths = cu_seqlens.diff().long()
    n_sequences = lengths.shape[0]
    sequence_of_token = torch.repeat_interleave(torch.arange(n_sequences), lengths, output_size=n_tokens)
    position_in_sequence = torch.arange(n_tokens) - cu_seqlens[sequence_of_token].long()
    grid_rows = sequence_of_token * max_seqlen + position_in_sequence
    key_is_real = torch.arange(max_seqlen) < lengths[:, None]
    return SequenceLayout(cu_seqlens, max_seqlen, grid_rows, key_is_real)


def fused_qkv_projection(query: nn.Linear, key: nn.Linear, value: nn.Linear, hidden: Tensor) -> Tensor:
    """[T, H] -> [T, 3H]: one matmul over the three layers' weights, concatenated (their gradients flow back)."""
    weight = torch.cat([query.weight, key.weight, value.weight])
    bias = torch.cat([query.bias, key.bias, value.bias])
    return F.linear(hidden, weight, bias)


def varlen_self_attention(qkv: Tensor, n_heads: int, layout: SequenceLayout, dropout_p: float) -> Tensor:
    """Fused projections [T, 3H] -> attention output [T, H], each token attending only within its sequence.
    Scaled by 1/sqrt(head size), as BERT and DistilBERT scale."""
    n_tokens = qkv.shape[0]
    # [T, 3, heads, head size] -> three contiguous [T, heads, head size] tensors, in one copy.
    query, key, value = qkv.view(n_tokens, 3, n_heads, -1).permute(1, 0, 2, 3).contiguous().unbind(0)
    if layout.grid_rows is None:
        context = _jagged_attention(query, key, value, layout, dropout_p)
    else:
        context = _grid_attention(query, key, value, layout, dropout_p)
    return context.reshape(n_tokens, -1)


def _jagged_attention(query: Tensor, key: Tensor, value: Tensor, layout: SequenceLayout, dropout_p: float) -> Tensor:
    """SDPA over jagged nested tensors: flash attention's varlen kernel on CUDA (see the module docstring)."""
    offsets = layout.cu_seqlens.long()

    def nested(x: Tensor) -> Tensor:  # [T, heads, d] -> [sequences, heads, {length}, d]
        # min_seqlen 1, a lower bound: it only tells SDPA that no sequence is empty.
        return torch.nested.nested_tensor_from_jagged(x, offsets, min_seqlen=1,
                                                      max_seqlen=layout.max_seqlen).transpose(1, 2)

    context = F.scaled_dot_product_attention(nested(query), nested(key), nested(value), dropout_p=dropout_p)
    return context.transpose(1, 2).values()


def _grid_attention(query: Tensor, key: Tensor, value: Tensor, layout: SequenceLayout, dropout_p: float) -> Tensor:
    """SDPA over the sequences scattered into a padded grid, under a key-padding mask (the CPU path)."""
    n_sequences, max_seqlen = layout.key_is_real.shape
    _, n_heads, head_size = query.shape

    def to_grid(x: Tensor) -> Tensor:  # [T, heads, d] -> [sequences, heads, max_seqlen, d]
        grid = x.new_zeros(n_sequences * max_seqlen, n_heads, head_size).index_copy(0, layout.grid_rows, x)
        return grid.view(n_sequences, max_seqlen, n_heads, head_size).transpose(1, 2)

    context = F.scaled_dot_product_attention(to_grid(query), to_grid(key), to_grid(value),
                                             attn_mask=layout.key_is_real[:, None, None, :], dropout_p=dropout_p)
    context = context.transpose(1, 2).reshape(n_sequences * max_seqlen, n_heads, head_size)
    return context.index_select(0, layout.grid_rows)


def _attention_dropout(module: nn.Module, probability: float) -> float:
    return probability if module.training else 0.0


def _packed_output(hidden: Tensor, states: list[Tensor] | None) -> BaseModelOutput:
    # [1, T, H]: one packed row, so pipeline.data.mlm_batches.rows selects flat token indices as it does on a padded
    # batch.
    return BaseModelOutput(last_hidden_state=hidden.unsqueeze(0),
                           hidden_states=None if states is None else tuple(s.unsqueeze(0) for s in states))


# ---------------------------------------------------------------------------------------------------------------
# The two encoders
# ---------------------------------------------------------------------------------------------------------------


class PackedBertEncoder(nn.Module):
    """A BertModel's embeddings and layers on a packed batch (its pooler is not run). Wraps the model: its
    parameters are the BertModel's."""

    def __init__(self, bert: BertModel):
        super().__init__()
        config = bert.config
        if getattr(config, "position_embedding_type", "absolute") != "absolute" or config.is_decoder:
            raise ValueError("the packed BERT encoder runs encoders with absolute positions only")
        self.bert = bert

    def forward(self, input_ids: Tensor, position_ids: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                output_hidden_states: bool = False) -> BaseModelOutput:
        embeddings, config = self.bert.embeddings, self.bert.config
        # Token type 0 for every token, as the padded path's default token_type_ids.
        hidden = embeddings.word_embeddings(input_ids) + embeddings.token_type_embeddings.weight[0]
        hidden = hidden + embeddings.position_embeddings(position_ids)
        hidden = embeddings.dropout(embeddings.LayerNorm(hidden))
        layout = sequence_layout(cu_seqlens, max_seqlen, input_ids.shape[0])
        states = [hidden] if output_hidden_states else None
        for layer in self.bert.encoder.layer:
            attention = layer.attention
            qkv = fused_qkv_projection(attention.self.query, attention.self.key, attention.self.value, hidden)
            context = varlen_self_attention(qkv, config.num_attention_heads, layout,
                                            _attention_dropout(attention.self, config.attention_probs_dropout_prob))
            projected = attention.output.dropout(attention.output.dense(context))
            hidden = attention.output.LayerNorm(projected + hidden)
            intermediate = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(hidden))
            hidden = layer.output.LayerNorm(layer.output.dropout(layer.output.dense(intermediate)) + hidden)
            if states is not None:
                states.append(hidden)
        return _packed_output(hidden, states)


class PackedDistilBertEncoder(nn.Module):
    """A DistilBertModel's embeddings and transformer on a packed batch. Wraps the model: its parameters are the
    DistilBertModel's, so `DistilBertForMaskedLM.save_pretrained` saves what this trained."""

    def __init__(self, distilbert: DistilBertModel):
        super().__init__()
        self.distilbert = distilbert

    def forward(self, input_ids: Tensor, position_ids: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                output_hidden_states: bool = False) -> BaseModelOutput:
        embeddings, config = self.distilbert.embeddings, self.distilbert.config
        hidden = embeddings.word_embeddings(input_ids) + embeddings.position_embeddings(position_ids)
        hidden = embeddings.dropout(embeddings.LayerNorm(hidden))
        layout = sequence_layout(cu_seqlens, max_seqlen, input_ids.shape[0])
        states = [hidden] if output_hidden_states else None
        for block in self.distilbert.transformer.layer:
            attention = block.attention
            qkv = fused_qkv_projection(attention.q_lin, attention.k_lin, attention.v_lin, hidden)
            context = varlen_self_attention(qkv, config.n_heads, layout,
                                            _attention_dropout(attention, config.attention_dropout))
            attended = block.sa_layer_norm(attention.out_lin(context) + hidden)
            ffn = block.ffn
            hidden = block.output_layer_norm(ffn.dropout(ffn.lin2(ffn.activation(ffn.lin1(attended)))) + attended)
            if states is not None:
                states.append(hidden)
        return _packed_output(hidden, states)
