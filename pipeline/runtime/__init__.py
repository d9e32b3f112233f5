"""The runtime an app or a server imports to answer questions on a bundle: the answerer, windows, n-best,
the official metric (onnxruntime, tokenizers and numpy; OpenVINO for the x86 target). Torch-free:
tests/test_import_layers.py."""
