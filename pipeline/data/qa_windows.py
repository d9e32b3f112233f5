"""Question-answering glue shared by every QA stage: SQuAD examples -> window tensors, and dev evaluation.

The windowing, n-best postprocessing and metric themselves live in pipeline/runtime/squad.py.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import datasets
import numpy as np
import torch

from pipeline.plan.config import SquadConfig
from pipeline.runtime import squad

logger = logging.getLogger(__name__)

MODEL_INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def train_window_tensors(examples: datasets.Dataset, tokenizer: Any, cfg: SquadConfig) -> dict[str, torch.Tensor]:
    """All training windows of `examples` as tensors (input ids, masks, start/end labels)."""
    features = _windows(examples, squad.prepare_train_features, tokenizer, cfg, "windowing training examples")
    return _columns_as_tensors(features, features.column_names)


def _columns_as_tensors(windows: datasets.Dataset, columns: list[str]) -> dict[str, torch.Tensor]:
    # Through numpy: torch.tensor on the columns' Python lists takes ~30x longer (14 s on the default's train set).
    arrays = windows.select_columns(columns).with_format("numpy")[:]
    return {name: torch.from_numpy(np.asarray(array)) for name, array in arrays.items()}


def prepare_for_qa_training(model: torch.nn.Module, cfg: SquadConfig) -> torch.nn.Module:
    """Applies the QA-stage options to a model about to be trained (see SquadConfig.freeze_word_embeddings)."""
    if cfg.freeze_word_embeddings:
        # QA updates the embeddings of words it sees; words it never sees would keep their pretrained
        # vectors and drift out of step with the rest, which costs most on held-out entity names.
        model.get_input_embeddings().weight.requires_grad_(False)
    return model


def window_lengths(windows: dict[str, torch.Tensor]) -> list[int]:
    """Real (unpadded) tokens of each window, for length-grouped batching."""
    return windows["attention_mask"].sum(dim=1).tolist()


def window_collate(windows: dict[str, torch.Tensor]):
    """Collate window indices into a batch trimmed to its longest window (windows are right-padded)."""
    # Every per-position tensor is trimmed: model inputs and cached teacher logits alike.
    full_length = windows["input_ids"].shape[1]
    sequence_names = [n for n, t in windows.items() if t.dim() == 2 and t.shape[1] == full_length]

    def collate(indices: list[int], generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        # `generator`: the training loop's per-batch random source; window batches draw nothing from it.
        batch = {name: tensor[indices] for name, tensor in windows.items()}
        length = int(batch["attention_mask"].sum(dim=1).max())
        for name in sequence_names:
            batch[name] = batch[name][:, :length]
        return batch

    return collate


def validation_windows(examples: datasets.Dataset, tokenizer: Any, cfg: SquadConfig) -> datasets.Dataset:
    return _windows(examples, squad.prepare_validation_features, tokenizer, cfg, "windowing dev examples")


def _windows(examples: datasets.Dataset, prepare, tokenizer: Any, cfg: SquadConfig, description: str):
    """Map examples to windows (one example may give several, so the example columns are dropped)."""
    return examples.map(
        prepare,
        batched=True,
        remove_columns=examples.column_names,
        fn_kwargs={"tokenizer": tokenizer, "max_seq_length": cfg.max_seq_length, "doc_stride": cfg.doc_stride},
        desc=description,
        load_from_cache_file=False,
    )


def model_inputs(batch: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors the model's forward accepts (DistilBERT has no token_type_ids)."""
    accepted = inspect.signature(model.forward).parameters
    return {name: batch[name] for name in MODEL_INPUT_NAMES if name in batch and name in accepted}


@torch.no_grad()
def predict_window_logits(
    model: torch.nn.Module, windows: datasets.Dataset, batch_size: int, device: torch.device
) -> tuple[np.ndarray, np.ndarray]:
    """Start and end logits for every window, as float32 numpy arrays; positions past the longest window of a
    window's batch (squad.batches_by_length) get a score no answer can win with."""
    was_training = model.training
    model.eval()
    columns = [c for c in MODEL_INPUT_NAMES if c in windows.column_names]
    tensors = _columns_as_tensors(windows, columns)
    starts = np.full(tuple(tensors["input_ids"].shape), -1e4, dtype=np.float32)
    ends = np.full(tuple(tensors["input_ids"].shape), -1e4, dtype=np.float32)
    for rows, length in squad.batches_by_length(tensors["attention_mask"].sum(dim=1).numpy(), batch_size):
        index = torch.from_numpy(rows)
        batch = {c: t[index, :length].to(device) for c, t in tensors.items()}
        output = model(**model_inputs(batch, model))
        starts[rows, :length] = output.start_logits.float().cpu().numpy()
        ends[rows, :length] = output.end_logits.float().cpu().numpy()
    model.train(was_training)
    return starts, ends


def evaluate_qa(
    model: torch.nn.Module, tokenizer: Any, dev_examples: datasets.Dataset, cfg: SquadConfig, device: torch.device
) -> tuple[dict[str, float], dict[str, str]]:
    """SQuAD v1.1 exact match / F1 of `model` on `dev_examples`; returns (metrics, predictions by question id)."""
    windows = validation_windows(dev_examples, tokenizer, cfg)
    start_logits, end_logits = predict_window_logits(model, windows, cfg.eval_batch_size, device)
    predictions = squad.postprocess_predictions(
        dev_examples, windows, start_logits, end_logits,
        n_best_size=cfg.n_best_size, max_answer_length=cfg.max_answer_length,
    )
    gold = squad.gold_answers(dev_examples)
    scores = squad.squad_v1_scores(gold, predictions)
    metrics = {
        "exact_match": round(scores["exact_match"], 3),
        "f1": round(scores["f1"], 3),
        "n_examples": scores["total"],
        "n_windows": len(windows),
    }
    return metrics, predictions
