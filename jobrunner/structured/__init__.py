"""Structured outputs: what a row's output must match (spec.py, no torch) and the grammars
that make the sampler keep to it (grammar.py, xgrammar)."""
