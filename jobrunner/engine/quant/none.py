"""`quantization: none`: the model as loaded."""

from jobrunner.engine.quant.base import Quantizer, register


@register("none")
class NoQuantizer(Quantizer):
    pass
