"""Flax Linen modules with a mask prior as a param leaf named `mask_logits`."""

from mpx.nn.attention import MaskedSelfAttention
from mpx.nn.decoder import CausalDecoder, greedy_decode
from mpx.nn.transformer import Block, Mlp, TokenTransformer, boolean_tokens

__all__ = ["MaskedSelfAttention", "Block", "CausalDecoder", "Mlp", "TokenTransformer",
           "boolean_tokens", "greedy_decode"]
