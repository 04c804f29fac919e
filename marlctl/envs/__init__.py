"""Environments: the registry of ids (pure) and the batched backends (torch)."""
