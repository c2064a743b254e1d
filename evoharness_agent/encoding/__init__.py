"""Texts to vectors: the sentence-transformer behind a cache, THE state layout, transitions as tensors."""
