"""The bundled int8 graph in the Hugging Face folder layout, so the libraries that read a hub model folder load
it offline as it is: transformers.js (`pipeline("question-answering", folder)`, npm @huggingface/transformers)
and optimum (`ORTModelForQuestionAnswering.from_pretrained(folder, subfolder="onnx",
file_name="model_quantized.onnx")`).

  <folder>/config.json             the model's config, with transformers.js_config.dtype = "q8"
  <folder>/tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab.txt
  <folder>/onnx/model_quantized.onnx   the int8 graph (onnx/model.onnx, the fp32 graph, with no "q8" dtype, when
                                       the bundle ships no int8 graph)

The names are the ones transformers.js looks for: it reads onnx/model{suffix}.onnx, and the suffix of its "q8"
dtype is "_quantized" (the name ORTQuantizer gives its output too).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.outputs.artifacts import atomic_write_json, read_json

ONNX_SUBFOLDER, QUANTIZED_ONNX_NAME, FP32_ONNX_NAME = "onnx", "model_quantized.onnx", "model.onnx"
# config.json and tokenizer.json are required: without them neither library can build the model or the tokenizer.
REQUIRED_FILES = ("config.json", "tokenizer.json")
# The rest is copied where the export has it: tokenizer_config.json carries do_lower_case and model_max_length
# (transformers.js truncates to it), vocab.txt lets transformers' slow BertTokenizer load too.
OPTIONAL_FILES = ("tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


class HfLayoutError(PipelineError, ValueError):
    """The export folder lacks a file the Hugging Face layout needs; the message names it."""


def write_hf_layout(export_dir: Path, onnx_path: Path, out_dir: Path, quantized: bool = True) -> Path:
    """Write `out_dir` in the Hugging Face layout from an ONNX export folder (config.json and tokenizer files, as
    optimum's exporter writes them) and the int8 graph `onnx_path`; returns `out_dir`."""
    missing = [name for name in REQUIRED_FILES if not (export_dir / name).is_file()]
    if missing:
        raise HfLayoutError(f"{export_dir}: no {', '.join(missing)}; the Hugging Face layout needs the model's config "
                            "and tokenizer")
    (out_dir / ONNX_SUBFOLDER).mkdir(parents=True, exist_ok=True)
    shutil.copy(onnx_path, out_dir / ONNX_SUBFOLDER / (QUANTIZED_ONNX_NAME if quantized else FP32_ONNX_NAME))
    config = read_json(export_dir / "config.json")
    # transformers.js loads onnx/model.onnx (fp32) by default on CPU; this makes its default the int8 graph, the
    # only one shipped, so `pipeline("question-answering", folder)` needs no dtype option.
    if quantized:
        config["transformers.js_config"] = {**config.get("transformers.js_config", {}), "dtype": "q8"}
    atomic_write_json(out_dir / "config.json", config)
    for name in ("tokenizer.json", *OPTIONAL_FILES):
        if (export_dir / name).is_file():
            shutil.copy(export_dir / name, out_dir / name)
    return out_dir
