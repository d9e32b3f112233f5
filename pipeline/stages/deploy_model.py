"""Stage deploy_model: an existing question-answering model (deploy.model), taken as it is and evaluated here.

The export stages compare every export with the PyTorch model's own answers: this stage writes them. Output: the
model as a save_pretrained folder (safetensors, with its tokenizer), predictions.json (its answer to every dev
question), metrics.json (SQuAD v1.1 exact match / F1 on the configured dev set) and a model card. A model the
exporters cannot take (pipeline/plan/deploy.py) is refused with the reason, and nothing is written.

  python -m pipeline deploy-model --config-json '{...}' --data-dir artifacts/deploy/NAME/data \
      --out-dir artifacts/deploy/NAME/deployed_model
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.data import qa_windows
from pipeline.data.squad_loading import load_squad
from pipeline.export.model_card import deployed_model_card, write_model_card
from pipeline.outputs.artifacts import atomic_write_json
from pipeline.outputs.manifests import atomic_output_dir, verify_input_dirs
from pipeline.plan.config import PipelineConfig
from pipeline.plan.deploy import load_deployable

logger = logging.getLogger(__name__)


def run(cfg: PipelineConfig, data_dir: Path, out_dir: Path) -> dict:
    import torch

    verify_input_dirs(data_dir)
    source = cfg.deploy.model
    model, tokenizer = load_deployable(cfg)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # evaluation only
    dev, _ = load_squad(str(data_dir / "dev.jsonl"))
    dev_metrics, predictions = qa_windows.evaluate_qa(model.to(device), tokenizer, dev, cfg.squad, device)
    metrics = {**dev_metrics, "source": source, "revision": cfg.deploy.revision, "model_type": model.config.model_type,
               "architecture": type(model).__name__, "n_parameters": model.num_parameters(), "fine_tuned_here": False, "evaluated_on": str(device)}
    with atomic_output_dir(out_dir, cfg) as tmp:
        model.cpu().save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / "predictions.json", predictions)
        atomic_write_json(tmp / "metrics.json", metrics)
        write_model_card(deployed_model_card(cfg, metrics, data_dir, str(out_dir)), tmp)
    logger.info("deploy_model %s: %s", source, json.dumps(metrics))
    return metrics


# `python -m pipeline deploy-model`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "data_dir": "output of prepare_data (dev.jsonl)",
}
