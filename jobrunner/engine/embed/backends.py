"""The backend a model embeds through: packed BERT, padded HF encoder, or the paged prefill."""

from __future__ import annotations

from typing import Any

from jobrunner.errors import ConfigError


def make_backend(loaded: Any, cfg: Any, decoder: bool):
    from jobrunner.engine.embed.encoder import PackedBert, PaddedEncoder, packed_supported

    if decoder:
        from jobrunner.engine.embed.decoder import PagedPrefill
        from jobrunner.engine.paged.model import unsupported_reason

        why = unsupported_reason(loaded.model, cfg.model.max_model_len)
        if why:
            raise ConfigError(f"model.source: cannot embed with this decoder: {why}")
        return PagedPrefill(
            loaded.model,
            cfg.engine.batch_tokens(loaded.device.type),
            embed_max_len(loaded, cfg),
            cfg.engine.block_size,
        )
    if packed_supported(loaded.model):
        return PackedBert(loaded.model)
    pad = loaded.tokenizer.pad_token_id
    return PaddedEncoder(loaded.model, 0 if pad is None else pad)


def embed_max_len(loaded: Any, cfg: Any) -> int:
    from jobrunner.prep.embed import max_input_tokens

    return max_input_tokens(cfg, loaded.tokenizer)
