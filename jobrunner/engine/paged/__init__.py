"""The paged engine (`engine.kind: paged`): continuous batching over a paged KV cache."""

from jobrunner.engine.paged.engine import PagedEngine

__all__ = ["PagedEngine"]
