"""End-to-end on-device deployment pipeline for distilled BERT question answering."""

__version__ = "0.1.0"
