"""Flax Linen modules with a mask prior as a param leaf named `mask_logits`."""

from mpx.nn.attention import MaskedSelfAttention
from mpx.nn.decoder import causal_decoder, greedy_decode
from mpx.nn.transformer import Block, Mlp, TokenTransformer

__all__ = ["MaskedSelfAttention", "Block", "causal_decoder", "Mlp", "TokenTransformer",
           "greedy_decode"]
