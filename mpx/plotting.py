"""Headless matplotlib figures (Agg backend)."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np


def _pyplot():
  try:
    import matplotlib
  except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("plotting needs matplotlib, a dependency of mpx: reinstall mpx "
                      "(pip install -e .) or pip install matplotlib") from e
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


CURVE_METRICS = ("accuracy", "accuracy_seen", "accuracy_unseen", "loss", "loss_seen",
                 "loss_unseen", "train_loss", "unseen_mean_output", "mean_output")
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


def _has_map(record, layer) -> bool:
  return "attention_map" in (record.get("layers") or {}).get(layer, {})


def _map_history(records, task, scheme, layer):
  """The lowest seed's records of (task, scheme) holding an attention map of `layer`, in
  step order."""
  mine = [r for r in records
          if r["task"] == task and r["scheme"] == scheme and _has_map(r, layer)]
  seed = min(r["seed"] for r in mine)
  return sorted((r for r in mine if r["seed"] == seed), key=lambda r: r["step"])


def _plot_attention(records, task, layer, path):
  """Rows: one member per scheme. Columns: the prior's pattern as the attention it asks
  for (uniform over each query's allowed keys), then the member's attention at init,
  mid-training and end (its first, middle and last evaluation), averaged over the probe
  batch and heads."""
  plt = _pyplot()
  schemes = sorted({r["scheme"] for r in records if r["task"] == task and _has_map(r, layer)})
  fig, axes = plt.subplots(len(schemes), 4, figsize=(13, 3.2 * len(schemes)),
                           squeeze=False, layout="constrained")
  for row, scheme in zip(axes, schemes):
    history = _map_history(records, task, scheme, layer)
    pattern = np.asarray(history[-1]["prior_pattern"], np.float64)
    snapshots = {"init": history[0], "mid": history[len(history) // 2], "end": history[-1]}
    panels = [("prior pattern", pattern / np.maximum(pattern.sum(-1, keepdims=True), 1))]
    panels += [(f"{name}: step {r['step']}, fidelity {r['layers'][layer]['fidelity']:.2f}",
                np.asarray(r["layers"][layer]["attention_map"]))
               for name, r in snapshots.items()]
    for ax, (title, image) in zip(row, panels):
      shown = ax.imshow(image, vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest")
      ax.set_title(title, fontsize="small")
      ax.set_xlabel("key token j")
    row[0].set_ylabel(f"{scheme} (seed {history[0]['seed']})\nquery token i")
  fig.colorbar(shown, ax=axes, shrink=0.6, label="attention probability")
  fig.suptitle(f"{task}, {layer}: attention, mean over probe inputs and heads")
  fig.savefig(path, dpi=90)
  plt.close(fig)


def _plot_degree_profiles(records, task, path):
  """Per scheme: the share of the learned function's Fourier weight at each degree over
  training, mean over seeds; degrees that never reach 1% are left out."""
  plt = _pyplot()
  curves = _curves([r for r in records if r["task"] == task],
                   lambda r: r.get("degree_profile"))
  fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.8), sharey=True,
                           squeeze=False, layout="constrained")
  for ax, ((_, scheme), (steps, profiles)) in zip(axes[0], sorted(curves.items())):
    share = profiles / np.maximum(profiles.sum(-1, keepdims=True), 1e-12)  # [seeds, steps, d]
    mean = share.mean(0)
    for degree in np.flatnonzero(mean.max(0) >= 0.01):
      ax.plot(steps, mean[:, degree], label=f"degree {degree}")
    ax.set_title(f"{scheme} (n={len(profiles)})")
    ax.set_xlabel("training step")
    ax.legend(fontsize="small")
  axes[0, 0].set_ylabel("share of Fourier weight Σ_{|S|=d} ĉ_S² / E[f²]")
  fig.suptitle(f"{task}: degree profile of the learned function")
  fig.savefig(path, dpi=100)
  plt.close(fig)


OVERVIEW_FILE = "overview.png"


def _load_summary(run_dir: pathlib.Path) -> dict:
  from mpx import report
  path = run_dir / report.SUMMARY_JSON
  if not path.is_file():
    raise ValueError(f"{path} is missing: the overview plots a finished run's summary "
                     "(mpx run writes it at the end); the curves need only metrics.jsonl.")
  with open(path, encoding="utf-8") as f:
    summary = json.load(f)
  if not summary.get("members"):
    raise ValueError(f"{path} lists no members; nothing to plot.")
  return summary


def headline_metric(summary) -> str:
  """The metric the overview leads with: the first one the paper gives a number for (what
  a run is compared on), else the first in summary.json (where keys are sorted)."""
  names = list(dict.fromkeys(k for m in summary["members"] for k in m["metrics"]))
  in_paper = {k for schemes in summary["paper"].values() for metrics in schemes.values()
              for k in metrics}
  for name in names:
    if name in in_paper:
      return name
  if not names:
    raise ValueError("the summary's members record no metrics; nothing to plot.")
  return names[0]


def _varying_hparams(members) -> dict[str, list[str]]:
  """Per task, the hparams (not the seed) whose value differs between members of one
  scheme, e.g. a data fraction; one set per scheme (a mask-only learning rate) does not
  split the scheme's box."""
  values: dict = {}
  for m in members:
    task = values.setdefault(m["task"], {})
    for k, v in m["hparams"].items():
      if k != "seed":
        task.setdefault((m["scheme"], k), set()).add(json.dumps(v))
  return {task: sorted({k for (_, k), vs in hp.items() if len(vs) > 1})
          for task, hp in values.items()}


def _cell(entry, varying: list[str]) -> tuple:
  """The x-axis box of a member or record: its scheme and the values of `varying`."""
  return (entry["scheme"], *(json.dumps((entry.get("hparams") or {}).get(k)) for k in varying))


def _cell_name(cell: tuple, varying: list[str], sep: str = "\n") -> str:
  values = [json.loads(v) for v in cell[1:]]
  return sep.join([cell[0], *(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in zip(varying, values))])


def _number(x) -> float | None:
  """A finite float, or None (JSON null, a non-number, NaN)."""
  if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
    return None
  return float(x)


def _jitter(n: int, width: float = 0.3) -> np.ndarray:
  """Evenly spread x offsets for the n points of a strip: deterministic, unlike noise."""
  return np.linspace(-width / 2, width / 2, n) if n > 1 else np.zeros(n)


def _strip_panel(ax, members, varying, task, metric, paper, colors) -> None:
  """Every seed as a point, the mean over the non-diverged seeds as a bar, the paper's
  number as a red tick."""
  from mpx import report
  scale = 100.0 if report.is_percent_metric(metric) else 1.0
  mine = [m for m in members if m["task"] == task]
  cells = list(dict.fromkeys(_cell(m, varying) for m in mine))
  ticks = []
  for x, cell in enumerate(cells):
    seeds = [m for m in mine if _cell(m, varying) == cell]
    values_S = np.array([v for m in seeds if not m["diverged"]
                         and (v := _number(m["metrics"].get(metric))) is not None])
    if len(values_S):
      ax.bar(x, scale * values_S.mean(), width=0.6, color=colors[cell[0]], alpha=0.35)
      ax.scatter(x + _jitter(len(values_S)), scale * values_S, color=colors[cell[0]], s=18,
                 zorder=3)
    value = _number(paper.get(task, {}).get(cell[0], {}).get(metric))
    if value is not None:  # Across the bar, so a mean reads off against it.
      ax.hlines(scale * value, x - 0.3, x + 0.3, color="red", linewidth=2.5, zorder=4)
    n_diverged = sum(bool(m["diverged"]) for m in seeds)
    ticks.append(f"{_cell_name(cell, varying)}\nn={len(seeds)}"
                 + (f" ({n_diverged} diverged)" if n_diverged else ""))
  ax.set_xticks(range(len(cells)), ticks, fontsize="small")
  if scale == 100.0:
    ax.set_ylim(0.0, 105.0)
  else:
    ax.use_sticky_edges = False  # A margin beyond the bars, so a paper value 0 shows.
    ax.autoscale_view()
  ax.set_ylabel(f"{metric} (%)" if scale == 100.0 else metric)
  ax.set_title(f"{task}: final {metric}: seeds (points), mean (bar), paper (red)",
               fontsize="medium")


def _fidelity_curves(records, members, varying, task) -> dict:
  """{cell: (steps_T, fidelity_ST)} of one task over its non-diverged seeds, at the steps
  every seed was evaluated; a seed without a step-0 record starts at its `fidelity_init`."""
  diverged = {(_cell(m, varying), m["seed"]) for m in members
              if m["task"] == task and m["diverged"]}
  by_cell: dict = {}
  for r in records:
    if r["task"] != task or _number(r.get("fidelity")) is None:
      continue
    cell = _cell(r, varying)
    if (cell, r["seed"]) in diverged:
      continue
    history = by_cell.setdefault(cell, {}).setdefault(r["seed"], {})
    if _number(r.get("fidelity_init")) is not None:
      history.setdefault(0, r["fidelity_init"])
    history[r["step"]] = r["fidelity"]
  out = {}
  for cell, seeds in by_cell.items():
    steps_T = sorted(set.intersection(*(set(h) for h in seeds.values())))
    out[cell] = (np.array(steps_T),
                 np.array([[h[t] for t in steps_T] for h in seeds.values()], np.float64))
  return out


def _fidelity_panel(ax, curves, varying, task, colors) -> None:
  styles, drawn = ("-", "--", ":", "-."), []  # A scheme's colour, a style per hparam value.
  for cell, (steps_T, fidelity_ST) in curves.items():
    color, style = colors[cell[0]], styles[drawn.count(cell[0]) % len(styles)]
    drawn.append(cell[0])
    ax.plot(steps_T, fidelity_ST.mean(0), color=color, linestyle=style,
            marker="o" if len(steps_T) < 20 else None, markersize=3,
            label=f"{_cell_name(cell, varying, ', ')} (n={len(fidelity_ST)})")
    ax.fill_between(steps_T, fidelity_ST.min(0), fidelity_ST.max(0), color=color, alpha=0.15)
  ax.set_ylim(0.0, 1.02)
  ax.set_xlabel("training step")
  ax.set_ylabel("fidelity (attention mass on the prior)")
  ax.set_title(f"{task}: prior fidelity, mean over seeds, min–max band", fontsize="medium")
  ax.legend(fontsize="small")


def plot_overview(run_dir, metric: str | None = None, *, records=None) -> str:
  """The figure to look at first, RUN_DIR/plots/overview.png; returns its path.

  One row per task. Left: the final `metric` (default `headline_metric`) of every seed per
  scheme, their mean, and the paper's number. Right, when the run recorded persistence
  diagnostics: the prior's fidelity over training per scheme. Reads summary.json and
  metrics.jsonl (`records`, when the caller has read it already).
  """
  from mpx import report
  run_dir = pathlib.Path(run_dir)
  summary = _load_summary(run_dir)
  members, paper = summary["members"], summary["paper"]
  metric = metric or headline_metric(summary)
  if not any(metric in m["metrics"] for m in members):
    recorded = sorted({k for m in members for k in m["metrics"]})
    raise ValueError(f"no member of {run_dir / report.SUMMARY_JSON} records {metric!r}; "
                     f"it records {recorded}.")
  if records is None:
    records = report.read_metrics(run_dir) if (run_dir / report.METRICS_FILE).exists() else []
  tasks = list(dict.fromkeys(m["task"] for m in members))
  varying = _varying_hparams(members)
  colors = {s: f"C{i % 10}" for i, s in enumerate(dict.fromkeys(m["scheme"] for m in members))}
  curves = {t: _fidelity_curves(records, members, varying[t], t) for t in tasks}
  cols = 2 if any(curves.values()) else 1
  plt = _pyplot()
  fig, axes = plt.subplots(len(tasks), cols, figsize=(6.4 * cols, 3.8 * len(tasks)),
                           squeeze=False, layout="constrained")
  for row, task in zip(axes, tasks):
    _strip_panel(row[0], members, varying[task], task, metric, paper, colors)
    if cols == 2 and curves[task]:
      _fidelity_panel(row[1], curves[task], varying[task], task, colors)
    elif cols == 2:
      row[1].axis("off")
  fig.suptitle(f"{summary['experiment']} (preset {summary['preset']}): overview")
  out_dir = run_dir / "plots"
  out_dir.mkdir(exist_ok=True)
  path = out_dir / OVERVIEW_FILE
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return str(path)


def plot_run(run_dir) -> list[str]:
  """Figures of a run into RUN_DIR/plots/: first `plot_overview` (once summary.json is
  there), then from metrics.jsonl per task one figure per metric,
  mean over seeds with a min–max band per scheme; per-layer persistence metrics and
  attention heatmaps (init, mid, end beside the prior) for the first and last layer, and
  the degree profile over training, when the run recorded them. Returns the files written."""
  from mpx import report
  run_dir = pathlib.Path(run_dir)
  records = report.read_metrics(run_dir)
  if not records:
    raise ValueError(f"{run_dir}/metrics.jsonl has no records; nothing to plot.")
  out_dir = run_dir / "plots"
  out_dir.mkdir(exist_ok=True)
  tasks = sorted({r["task"] for r in records})
  written = []
  if (run_dir / report.SUMMARY_JSON).exists():  # A run still training has none yet.
    written.append(plot_overview(run_dir, records=records))
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
    for task in tasks:
      if any(_has_map(r, layer) for r in records if r["task"] == task):
        path = out_dir / f"{task}_{layer}_attention.png"
        _plot_attention(records, task, layer, path)
        written.append(str(path))
  for task in tasks:
    if any("degree_profile" in r for r in records if r["task"] == task):
      path = out_dir / f"{task}_degree_profile.png"
      _plot_degree_profiles(records, task, path)
      written.append(str(path))
  if any("data_fraction" in (r.get("hparams") or {}) for r in records):
    path = out_dir / "fraction_curve.png"
    plot_fraction_curve(records, path)
    written.append(str(path))
  return written


def plot_fraction_curve(records, path) -> None:
  """Final `sequence_accuracy` against the training-data fraction, one panel per task
  and one line per scheme: mean over seeds with a min–max band, log-x (the fractions of
  a low-data sweep span decades). Uses each member's last evaluation; records need
  `hparams["data_fraction"]`."""
  plt = _pyplot()
  final: dict = {}  # (task, scheme, fraction, seed) → (step, value)
  for r in records:
    fraction = (r.get("hparams") or {}).get("data_fraction")
    value = r.get("sequence_accuracy")
    if fraction is None or value is None:
      continue
    key = (r["task"], r["scheme"], float(fraction), r["seed"])
    if key not in final or r["step"] >= final[key][0]:
      final[key] = (r["step"], float(value))
  if not final:
    raise ValueError("no record has hparams['data_fraction'] and a sequence_accuracy; "
                     "nothing to plot.")
  tasks = sorted({k[0] for k in final})
  fig, axes = plt.subplots(1, len(tasks), figsize=(5.6 * len(tasks), 4.2), squeeze=False,
                           layout="constrained")
  for ax, task in zip(axes[0], tasks):
    for scheme in sorted({k[1] for k in final if k[0] == task}):
      by_fraction: dict = {}
      for (t, s, fraction, _), (_, value) in final.items():
        if (t, s) == (task, scheme):
          by_fraction.setdefault(fraction, []).append(value)
      fractions = np.array(sorted(by_fraction))
      values = [np.array(by_fraction[f]) for f in fractions]
      mean = np.array([v.mean() for v in values])
      n = min(len(v) for v in values)
      line, = ax.plot(fractions, mean, marker="o", label=f"{scheme} (n={n})")
      low, high = [v.min() for v in values], [v.max() for v in values]
      ax.fill_between(fractions, low, high, color=line.get_color(), alpha=0.2)
      ax.vlines(fractions, low, high, color=line.get_color(), alpha=0.5)  # One fraction too.
    ax.set_xscale("log")
    ax.set_xlabel("fraction of the problem space trained on")
    ax.set_ylabel("sequence accuracy (fraction)")
    ax.set_title(f"{task}: final sequence accuracy")
    ax.legend(fontsize="small")
  fig.savefig(path, dpi=110)
  plt.close(fig)
