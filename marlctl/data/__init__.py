"""Datasets of multi-agent experience for offline training: written from a run's episodes
(`writer.py`), on disk as chunks and a manifest (`format.py`), read back as transitions
(`reader.py`), and described, split by quality and merged (`ops.py`)."""
