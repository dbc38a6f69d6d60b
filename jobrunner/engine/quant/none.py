"""`quantization: none`: the model as loaded."""

from jobrunner.engine.quant.base import Quantizer


class NoQuantizer(Quantizer):
    name = "none"
