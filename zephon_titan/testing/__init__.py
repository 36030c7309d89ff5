"""Helpers for tests and the demo: offline corpora and tokenizers. Not used by the loader."""
