"""mpx: mask-based attention priors for JAX/Flax.

Attention logits get a learnable additive bias `log σ(M)`, with `M` initialised from the
task's interaction structure (Ma, Saratchandran, Gordon, Lucey, 2026).
"""

from mpx import priors
from mpx.attention import attention_weights, mask_bias, masked_attention, not_masks
from mpx.params import merge_params

__version__ = "0.1.0"

__all__ = ["attention_weights", "mask_bias", "masked_attention", "merge_params", "not_masks",
           "priors", "__version__"]
