"""Headless matplotlib figures (Agg backend); matplotlib is the `plots` extra."""

from __future__ import annotations

import math
import pathlib

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


CURVE_METRICS = ("accuracy", "accuracy_unseen", "loss", "loss_unseen", "train_loss",
                 "unseen_mean_output", "mean_output")
LAYER_METRICS = ("fidelity", "drift_mask", "drift_query", "drift_key", "grad_norm_mask",
                 "grad_norm_query", "grad_norm_key")


def _curves(records, key_fn):
  """{(task, scheme): (steps, values[seeds, steps])} for one scalar per record."""
  by_cell: dict = {}
  for r in records:
    value = key_fn(r)
    if value is None:
      continue
    cell = by_cell.setdefault((r["task"], r["scheme"]), {})
    cell.setdefault(r["seed"], {})[r["step"]] = value
  out = {}
  for cell, seeds in by_cell.items():
    steps = sorted(set.intersection(*(set(s) for s in seeds.values())))
    out[cell] = (np.array(steps), np.array([[s[t] for t in steps] for s in seeds.values()],
                                           np.float64))
  return out


def _plot_curves(curves, task, ylabel, title, path):
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
  for (cell_task, scheme), (steps, values) in sorted(curves.items()):
    if cell_task != task:
      continue
    line, = ax.plot(steps, values.mean(0), marker="o" if len(steps) < 20 else None,
                    label=f"{scheme} (n={len(values)})")
    ax.fill_between(steps, values.min(0), values.max(0), color=line.get_color(), alpha=0.2)
  ax.set_xlabel("training step")
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.legend(fontsize="small")
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_run(run_dir) -> list[str]:
  """Curves of a run's metrics.jsonl into RUN_DIR/plots/: per task, one figure per metric,
  mean over seeds with a min–max band per scheme; per-layer persistence metrics for the
  first and last layer when the run recorded them. Returns the files written."""
  from mpx import report
  run_dir = pathlib.Path(run_dir)
  records = report.read_metrics(run_dir)
  if not records:
    raise ValueError(f"{run_dir}/metrics.jsonl has no records; nothing to plot.")
  out_dir = run_dir / "plots"
  out_dir.mkdir(exist_ok=True)
  tasks = sorted({r["task"] for r in records})
  written = []
  for metric in CURVE_METRICS:
    curves = _curves(records, lambda r: r.get(metric))
    for task in tasks:
      if any(t == task for t, _ in curves):
        path = out_dir / f"{task}_{metric}.png"
        unit = " (fraction)" if metric.startswith("accuracy") else ""
        _plot_curves(curves, task, metric + unit, f"{task}: {metric}", path)
        written.append(str(path))
  layers = sorted({layer for r in records for layer in r.get("layers") or {}},
                  key=lambda name: int(name.rsplit("_", 1)[-1]) if name[-1].isdigit() else 0)
  for layer in dict.fromkeys(layers[:1] + layers[-1:]):
    for metric in LAYER_METRICS:
      curves = _curves(records, lambda r: (r.get("layers") or {}).get(layer, {}).get(metric))
      for task in tasks:
        if any(t == task for t, _ in curves):
          path = out_dir / f"{task}_{layer}_{metric}.png"
          _plot_curves(curves, task, metric, f"{task}, {layer}: {metric}", path)
          written.append(str(path))
  return written
