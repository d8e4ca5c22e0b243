"""Integrations with Hugging Face transformers and sentence-transformers (imported lazily)."""
