"""`task: embed` (engine.py): prefill-only forwards that pool one vector per input.

Backends (backends.py): BERT-family encoders on packed tokens (encoder.PackedBert), other
encoders as padded HF modules (encoder.PaddedEncoder), decoders through the paged model's
prefill (decoder.PagedPrefill). st_files.py reads the model's sentence-transformers files.
"""
