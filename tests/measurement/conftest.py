"""The tiny graphs the timing tests run: a 2-layer DistilBERT QA model, its fp32 ONNX export and a naive int8 graph
of it (built once per test process, read only)."""

import pytest


@pytest.fixture(scope="session")
def tiny_int8(tmp_path_factory):
    from transformers import DistilBertConfig, DistilBertForQuestionAnswering

    from pipeline.export import int8, onnx_graph

    root = tmp_path_factory.mktemp("tiny_int8")
    model = DistilBertForQuestionAnswering(DistilBertConfig(vocab_size=200, dim=32, n_layers=2, n_heads=2,
                                                            hidden_dim=64, max_position_embeddings=128))
    model.save_pretrained(root / "pytorch")
    onnx_graph.export_fp32(root / "pytorch", root / "fp32", None)
    naive = int8.Int8Recipe("plain", "qoperator", per_channel=False, attention_int8=False)
    int8.quantize_int8(root / "fp32" / "model.onnx", root / "int8.onnx", naive, reduce_range=False)
    return root
