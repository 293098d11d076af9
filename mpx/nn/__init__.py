"""Flax Linen modules with a mask prior as a param leaf named `mask_logits`."""

from mpx.nn.attention import MaskedSelfAttention
from mpx.nn.decoder import causal_decoder, greedy_decode
from mpx.nn.mha import MultiHeadDotProductAttention
from mpx.nn.transformer import Block, Mlp, TokenTransformer
from mpx.nn.vit import ViT, grid_size, n_tokens, vit_tiny_32, vit_tiny_224

__all__ = ["MaskedSelfAttention", "Block", "causal_decoder", "Mlp", "TokenTransformer",
           "greedy_decode", "MultiHeadDotProductAttention", "ViT", "grid_size", "n_tokens",
           "vit_tiny_224", "vit_tiny_32"]
