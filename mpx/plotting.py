"""Headless matplotlib figures (Agg backend); matplotlib is the `plots` extra."""

from __future__ import annotations

import math

import numpy as np


def _pyplot():
  try:
    import matplotlib
  except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("plotting needs matplotlib: pip install 'mpx[plots]'") from e
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def plot_prior(mask_logits, path: str, title: str = "") -> None:
  """Heatmaps of the bias `log σ(M)` a prior adds to the logits, one panel per head."""
  from mpx.attention import mask_bias
  plt = _pyplot()
  bias = np.asarray(mask_bias(mask_logits))
  heads = bias[None] if bias.ndim == 2 else bias
  cols = min(len(heads), 3)
  rows = math.ceil(len(heads) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 4 * rows), squeeze=False,
                           layout="constrained")
  low = min(float(bias.min()), -1e-3)
  for h, ax in enumerate(axes.flat):
    if h >= len(heads):
      ax.axis("off")
      continue
    image = ax.imshow(heads[h], vmin=low, vmax=0.0, cmap="viridis", interpolation="nearest")
    ax.set_xlabel("key token j")
    ax.set_ylabel("query token i")
    ax.set_title(f"head {h}" if len(heads) > 1 else "shared by heads")
  fig.colorbar(image, ax=axes, shrink=0.8, label="log σ(M)  (additive logit bias, ≤ 0)")
  fig.suptitle(title or "mask prior")
  fig.savefig(path, dpi=110)
  plt.close(fig)
