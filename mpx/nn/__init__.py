"""Flax Linen modules with a mask prior as a param leaf named `mask_logits`."""

from mpx.nn.attention import MaskedSelfAttention
from mpx.nn.transformer import Block, Mlp, TokenTransformer, boolean_tokens

__all__ = ["MaskedSelfAttention", "Block", "Mlp", "TokenTransformer", "boolean_tokens"]
