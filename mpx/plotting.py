"""Headless matplotlib figures (Agg backend).

Every figure of a run reads alike: a scheme has one colour in all of them
(`scheme_colors`) and the paper's numbers are black, a colour no scheme has; a metric has
the unit the summary's tables give it (accuracies in %); a line is one scheme and group
(`report.cell_key`), named by the values that tell the scheme's groups apart, dashed per
group and marked with hollow markers of its own shape, so lines that coincide stay
visible; heatmaps name their tokens (`token_labels`). The `*_figure` functions return the
figure, the `plot_*` functions write PNG files. A figure of a metric says in its title what
the metric measures, in the words of the summary's legend (`report.metric_description`).
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from mpx import report


def _pyplot():
  try:
    import matplotlib
  except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("plotting needs matplotlib, a dependency of mpx: reinstall mpx "
                      "(pip install -e .) or pip install matplotlib") from e
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def subplots(rows: int, cols: int, figsize: tuple[float, float], *, left: float = 0.9,
             right: float = 0.25, bottom: float = 0.6, top: float = 0.45,
             wspace: float = 0.75, hspace: float = 0.8, **kwargs):
  """`plt.subplots(rows, cols, squeeze=False)` with the margins and the gaps between
  panels fixed in inches. A layout engine ("constrained", "tight") draws every figure
  twice when it is saved, once to measure its text: most of a run's plotting time."""
  plt = _pyplot()
  width, height = figsize
  panel_w = (width - left - right - (cols - 1) * wspace) / cols
  panel_h = (height - bottom - top - (rows - 1) * hspace) / rows
  fig, axes = plt.subplots(rows, cols, figsize=figsize, squeeze=False, **kwargs)
  fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                      top=1 - top / height, wspace=wspace / panel_w, hspace=hspace / panel_h)
  return fig, axes


def _save(fig, path, dpi: int = 110) -> str:
  """Writes `fig` to the PNG file `path` (making its folder) and frees it; returns the path."""
  pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=dpi)
  _pyplot().close(fig)
  return str(path)


# ----------------------------------------------------------------------------- styles

# mpx's schemes keep their colour across runs and families.
SCHEME_COLORS = {"default": "C0", "qk_svd": "C1", "qk_opt": "C2", "mask": "C3",
                 "mimetic": "C4", "impulse_svd": "C5", "impulse_opt": "C6", "alibi": "C8",
                 "mask_nopos": "C9"}
SPARE_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02",
                "#a6761d", "C7")  # Dark2, then grey: other schemes, e.g. "mask:impulse".
PAPER_COLOR = "black"
MARKERS = "osD^vP<>Xh"
LINE_STYLES = ("-", "--", ":", "-.")


def scheme_colors(schemes: Iterable[str]) -> dict[str, str]:
  """The colour of each scheme, for every figure of a run: mpx's own from
  `SCHEME_COLORS`, the others the spare colours in name order (so the same set of schemes
  always gets the same colours, whatever order a figure meets them in)."""
  schemes = set(schemes)
  others = sorted(schemes - set(SCHEME_COLORS))
  spare = {s: SPARE_COLORS[i % len(SPARE_COLORS)] for i, s in enumerate(others)}
  return {s: SCHEME_COLORS.get(s) or spare[s] for s in schemes}


def _unit(metric: str) -> tuple[float, str]:
  """(scale, axis label): the unit `report.format_table` prints the metric in."""
  if report.is_percent_metric(metric):
    return 100.0, f"{metric} (%)"
  return 1.0, metric


TITLE_WIDTH = 72  # Characters per line of a metric's description in a title.
TITLE_LINE = 0.17  # Inches a line of a "small" title takes.


def described(head: str, metric: str) -> str:
  """A title: `head`, then what `metric` measures (`report.metric_description`, wrapped),
  so a figure means what the summary's legend says; `head` alone where nothing describes
  the metric."""
  text = report.metric_description(metric)
  return head if text is None else head + "\n" + textwrap.fill(text, TITLE_WIDTH)


def _title_height(title: str) -> float:
  """Inches above a panel for `title` in the "small" font."""
  return 0.15 + TITLE_LINE * (title.count("\n") + 1)


PERCENT_LIMITS = (-3.0, 103.0)  # The whole scale in every figure, a marker's room beyond.


def _draw_lines(ax, bands: Mapping[tuple, tuple], varying: Sequence[str],
                colors: Mapping[str, str]) -> None:
  """One line per cell of `bands` {cell: (x, mean, low, high, n)}: the mean, a min–max
  band (a bar where there is one x), the scheme's colour, a dash per group of the scheme
  and a hollow marker of the line's own shape, about 15 per line and staggered, which
  shows through any line drawn over it."""
  drawn = []
  for i, (cell, (x, mean, low, high, n)) in enumerate(bands.items()):
    color, every = colors[cell[1]], max(1, math.ceil(len(x) / 15))
    ax.plot(x, mean, color=color, linestyle=LINE_STYLES[drawn.count(cell[1]) % len(LINE_STYLES)],
            marker=MARKERS[i % len(MARKERS)], markevery=(i % every, every),
            markerfacecolor="none", markersize=6,
            label=f"{report.cell_label(cell, varying)} (n={n})")
    drawn.append(cell[1])
    ax.fill_between(x, low, high, color=color, alpha=0.15)
    if len(x) == 1:
      ax.vlines(x, low, high, color=color, alpha=0.5)
  ax.legend(fontsize="small")


def _band(x, values_S_, scale: float = 1.0) -> tuple:
  """(x, mean, min, max, seeds) over the leading (seed) axis of `values_S_`."""
  values = scale * np.asarray(values_S_, np.float64)
  return x, values.mean(0), values.min(0), values.max(0), len(values)


# ----------------------------------------------------------------------------- tokens


def boolean_tokens(n_bits: int) -> list[str]:
  """The GOTU model's tokens: CLS, then one per input bit."""
  return ["CLS", *(f"x{i}" for i in range(n_bits))]


def arithmetic_tokens(layout, operator: str) -> list[str]:
  """A `priors.ArithmeticLayout`'s tokens: BOS, the operand digits a<p>, b<p> and answer
  digits c<p> by place value p (a reversed answer reads c0 c1 ...), the operator and "="."""
  names = [str(i) for i in range(layout.n_tokens)]
  for letter, positions in (("a", layout.a), ("b", layout.b), ("c", layout.answer)):
    for place, position in enumerate(positions):
      names[position] = f"{letter}{place}"
  names[max(layout.a) + 1], names[max(layout.b) + 1] = operator, "="
  if min(layout.a) > 0:
    names[0] = "BOS"
  return names


def grid_tokens(grid_h: int, grid_w: int, cls_token: bool) -> list[str]:
  """A ViT's tokens: CLS (when it has one), then the patches "row,col" in row-major order."""
  patches = [f"{r},{c}" for r in range(grid_h) for c in range(grid_w)]
  return ["CLS", *patches] if cls_token else patches


def token_labels(run_config: Mapping, task: str, n_tokens: int) -> list[str]:
  """Names of a run's N attention tokens, from its config.json (`run_config`): its
  experiment names the family (Boolean: CLS and bits; arithmetic: digits by place value;
  vision: CLS and patch positions). Any other experiment (language, whose tokens are
  positions), or a layout of another length, gets the positions 0..N-1."""
  config, experiment = run_config.get("config", {}), run_config.get("experiment")
  names: list[str] = []
  if experiment in ("boolean_gotu", "boolean_coverage", "discover_boolean", "discover_prior"):
    names = boolean_tokens(n_tokens - 1)
  elif experiment in ("arithmetic", "discover_arithmetic"):
    from mpx.tasks import arithmetic
    spec = arithmetic.get_task(task, config["digits"], reverse_answer=config["reverse_answer"])
    names = arithmetic_tokens(spec.layout, arithmetic.OPERATORS[task])
  elif experiment == "vision":
    grid = config["image_size"] // config["patch_size"]
    names = grid_tokens(grid, grid, config["pool"] == "cls")
  return names if len(names) == n_tokens else [str(i) for i in range(n_tokens)]


def _token_ticks(ax, tokens: Sequence[str]) -> None:
  """Integer ticks on both axes of a heatmap, named by token; every k-th of many tokens,
  so the names stay legible."""
  every = max(1, math.ceil(len(tokens) / 24))
  ticks = list(range(0, len(tokens), every))
  ax.set_xticks(ticks, [tokens[i] for i in ticks], rotation=90, fontsize="x-small")
  ax.set_yticks(ticks, [tokens[i] for i in ticks], fontsize="x-small")


def _run_config(run_dir: pathlib.Path) -> dict:
  path = run_dir / "config.json"
  return json.loads(path.read_text()) if path.is_file() else {}


# ----------------------------------------------------------------------------- priors


def prior_figure(mask_logits, title: str = "", *, tokens: Sequence[str] | None = None,
                 head_titles: Sequence[str] | None = None):
  """Heatmaps of the bias `log σ(M)` a prior adds to the logits, one panel per head,
  ticks named by `tokens` (default: positions) and panels by `head_titles`."""
  from mpx.attention import mask_bias
  bias = np.asarray(mask_bias(mask_logits))
  heads = bias[None] if bias.ndim == 2 else bias
  tokens = tokens or [str(i) for i in range(heads.shape[-1])]
  head_titles = head_titles or ([f"head {h}" for h in range(len(heads))] if len(heads) > 1
                                else ["shared by heads"])
  cols = min(len(heads), 3)
  rows = math.ceil(len(heads) / cols)
  fig, axes = subplots(rows, cols, (4.2 * cols, 4.4 * rows), left=0.9, right=1.0,
                       bottom=0.9, top=0.75, wspace=0.9, hspace=1.2)
  low = min(float(bias.min()), -1e-3)
  for h, ax in enumerate(axes.flat):
    if h >= len(heads):
      ax.axis("off")
      continue
    image = ax.imshow(heads[h], vmin=low, vmax=0.0, cmap="viridis", interpolation="nearest")
    _token_ticks(ax, tokens)
    ax.set_xlabel("key token j")
    ax.set_ylabel("query token i")
    ax.set_title(head_titles[h])
  fig.colorbar(image, ax=axes, shrink=0.8, label="log σ(M)  (additive logit bias, ≤ 0)")
  fig.suptitle(title or "mask prior")
  return fig


def plot_prior(mask_logits, path: str, title: str = "", *,
               tokens: Sequence[str] | None = None,
               head_titles: Sequence[str] | None = None) -> None:
  """`prior_figure` into the PNG file `path`."""
  _save(prior_figure(mask_logits, title, tokens=tokens, head_titles=head_titles), path)


# ----------------------------------------------------------------------------- curves

CURVE_METRICS = ("accuracy", "accuracy_seen", "accuracy_unseen", "sequence_accuracy",
                 "digit_accuracy", "perplexity", "bits_per_byte", "loss", "loss_seen",
                 "loss_unseen", "train_loss", "unseen_mean_output", "mean_output")
LAYER_METRICS = ("fidelity", "drift_mask", "drift_query", "drift_key", "grad_norm_mask",
                 "grad_norm_query", "grad_norm_key")


def _seed_curves(histories: Mapping[tuple, Mapping[int, object]]) -> dict:
  """{cell: (steps_T, values_S_T...)} from {`report.member_key`: {step: value}}: each
  cell's seeds at the steps every one of them was evaluated."""
  by_cell: dict = {}
  for key, history in histories.items():
    by_cell.setdefault(key[:-1], []).append(history)
  out = {}
  for cell, seeds in by_cell.items():
    steps_T = sorted(set.intersection(*(set(h) for h in seeds)))
    out[cell] = (np.array(steps_T), np.array([[h[t] for t in steps_T] for h in seeds],
                                             np.float64))
  return out


def _curves(records, value_fn) -> dict:
  """`_seed_curves` of one value per record (`value_fn(record)`, None where absent)."""
  histories: dict = {}
  for r in records:
    value = value_fn(r)
    if value is not None:
      histories.setdefault(report.member_key(r), {})[r["step"]] = value
  return _seed_curves(histories)


def _over_training(curves, task: str) -> bool:
  """Whether a cell of `task` has two evaluations or more: a run evaluated only at its end
  has no curve to draw (its final values are in the overview)."""
  return any(cell[0] == task and len(steps) > 1 for cell, (steps, *_) in curves.items())


def curve_figure(curves, task: str, metric: str, varying: Sequence[str],
                 colors: Mapping[str, str], title: str):
  """One metric of one task over training: a line per cell of `curves` (`_curves`),
  `title` above the metric's description."""
  scale, label = _unit(metric)
  title = described(title, metric)
  fig, ((ax,),) = subplots(1, 1, (6.4, 4.2), right=0.2, bottom=0.55, top=_title_height(title))
  _draw_lines(ax, {cell: _band(steps, values, scale)
                   for cell, (steps, values) in curves.items() if cell[0] == task},
              varying, colors)
  if scale == 100.0:
    ax.set_ylim(*PERCENT_LIMITS)
  ax.set_xlabel("training step")
  ax.set_ylabel(label)
  ax.set_title(title, fontsize="small")
  return fig


def _has_map(record, layer) -> bool:
  return "attention_map" in (record.get("layers") or {}).get(layer, {})


def _map_history(records, cell, layer):
  """The lowest seed's records of `cell` holding an attention map of `layer`, in step
  order."""
  mine = [r for r in records if report.cell_key(r) == cell and _has_map(r, layer)]
  seed = min(r["seed"] for r in mine)
  return sorted((r for r in mine if r["seed"] == seed), key=lambda r: r["step"])


def attention_figure(records, task: str, layer: str, varying: Sequence[str],
                     colors: Mapping[str, str], tokens: Sequence[str]):
  """Rows: one member per scheme and group. Columns: the prior's pattern as the attention
  it asks for (uniform over each query's allowed keys), then the member's attention at
  its first, middle and last evaluation, averaged over the probe batch and heads; ticks
  named by `tokens` (`token_labels`)."""
  cells = list(dict.fromkeys(report.cell_key(r) for r in records
                             if r["task"] == task and _has_map(r, layer)))
  fig, axes = subplots(len(cells), 4, (13, 3.4 * len(cells)), left=1.2, right=1.0, bottom=0.85,
                       top=0.75, wspace=0.5, hspace=0.95)
  for row, cell in zip(axes, cells):
    history = _map_history(records, cell, layer)
    pattern = np.asarray(history[-1]["prior_pattern"], np.float64)
    snapshots = {"init" if history[0]["step"] == 0 else "first": history[0],
                 "mid": history[len(history) // 2], "end": history[-1]}
    panels = [("prior pattern", pattern / np.maximum(pattern.sum(-1, keepdims=True), 1))]
    panels += [(f"{name}: step {r['step']}, fidelity {r['layers'][layer]['fidelity']:.2f}",
                np.asarray(r["layers"][layer]["attention_map"]))
               for name, r in snapshots.items()]
    for ax, (title, image) in zip(row, panels):
      shown = ax.imshow(image, vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest")
      _token_ticks(ax, tokens)
      ax.set_title(title, fontsize="small")
      ax.set_xlabel("key token j", fontsize="small")
    name = report.cell_label(cell, varying, "\n")
    row[0].set_ylabel(f"{name} (seed {history[0]['seed']})\nquery token i",
                      color=colors[cell[1]])
  fig.colorbar(shown, ax=axes, shrink=0.6, label="attention probability")
  fig.suptitle(f"{task}, {layer}: attention, mean over probe inputs and heads")
  return fig


# Mathtext, so the sub- and superscripts render (as plain text they print as TeX).
DEGREE_LABEL = (r"share of Fourier weight  "
                r"$\Sigma_{|S|=d}\ \hat{c}_S^{\,2}\ /\ \mathrm{E}[f^{\,2}]$")


def degree_figure(records, task: str, varying: Sequence[str], colors: Mapping[str, str]):
  """Per scheme and group: the share of the learned function's Fourier weight at each
  degree over training, mean over seeds; degrees that never reach 1% are left out."""
  plt = _pyplot()
  curves = _curves([r for r in records if r["task"] == task],
                   lambda r: r.get("degree_profile"))
  means = {cell: (profiles / np.maximum(profiles.sum(-1, keepdims=True), 1e-12)).mean(0)
           for cell, (_, profiles) in curves.items()}  # [steps, degrees] over seeds.
  shown = sorted(set().union(*(np.flatnonzero(m.max(0) >= 0.01) for m in means.values())))
  fig, axes = subplots(1, len(curves), (4.2 * len(curves), 3.8), left=1.0, right=0.2, top=0.7,
                       wspace=0.3, sharey=True)
  for ax, (cell, (steps, profiles)) in zip(axes[0], curves.items()):
    for i, degree in enumerate(shown):  # Sequential colours, no scheme's; alike in panels.
      ax.plot(steps, means[cell][:, degree], label=f"degree {degree}",
              color=plt.cm.viridis(0.85 * i / max(1, len(shown) - 1)))
    ax.set_title(f"{report.cell_label(cell, varying)} (n={len(profiles)})",
                 color=colors[cell[1]])
    ax.set_xlabel("training step")
    ax.legend(fontsize="small")
  axes[0, 0].set_ylabel(DEGREE_LABEL)
  fig.suptitle(f"{task}: degree profile of the learned function")
  return fig


# ----------------------------------------------------------------------------- overview

OVERVIEW_FILE = "overview.png"


def _load_summary(run_dir: pathlib.Path) -> dict:
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
  """The metric the overview and the sensitivity figures lead with: the first one the paper
  gives a number for (what a run is compared on), else the first in summary.json (where
  keys are sorted)."""
  names = list(dict.fromkeys(k for m in summary["members"] for k in m["metrics"]))
  in_paper = {k for schemes in summary["paper"].values() for metrics in schemes.values()
              for k in metrics}
  for name in names:
    if name in in_paper:
      return name
  if not names:
    raise ValueError("the summary's members record no metrics; nothing to plot.")
  return names[0]


def _varying(entries) -> dict[str, list[str]]:
  """Per task, `report.distinguishing_hparams` of its entries (records or members)."""
  tasks = dict.fromkeys(e["task"] for e in entries)
  return {t: report.distinguishing_hparams([e for e in entries if e["task"] == t])
          for t in tasks}


def _number(x) -> float | None:
  """A finite float, or None (JSON null, a non-number, NaN)."""
  if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
    return None
  return float(x)


def _jitter(n: int, width: float = 0.3) -> np.ndarray:
  """Evenly spread x offsets for the n points of a strip: deterministic, unlike noise."""
  return np.linspace(-width / 2, width / 2, n) if n > 1 else np.zeros(n)


def _tick_label(cell: tuple[str, str, str], keys: Sequence[str]) -> str:
  """A strip's label: its scheme and its values of `keys` (3 digits), one per line; the
  axis names the keys once, so 8 values of a learning rate side by side stay legible."""
  hparams = json.loads(cell[2])
  short = lambda v: (f"{v:.3g}" if isinstance(v, float) else
                     report.MISSING if v is None else str(v))
  return "\n".join([cell[1], *(short(hparams.get(k)) for k in keys)])


def _strip_panel(ax, members, varying, task, metric, paper, colors) -> None:
  """Every seed as a point, the mean over the non-diverged seeds as a bar, the paper's
  number as a black tick across it."""
  scale, label = _unit(metric)
  mine = [m for m in members if m["task"] == task]
  cells = list(dict.fromkeys(report.cell_key(m) for m in mine))
  ticks, with_paper = [], False
  for x, cell in enumerate(cells):
    seeds = [m for m in mine if report.cell_key(m) == cell]
    values_S = np.array([v for m in seeds if not m["diverged"]
                         and (v := _number(m["metrics"].get(metric))) is not None])
    if len(values_S):
      ax.bar(x, scale * values_S.mean(), width=0.6, color=colors[cell[1]], alpha=0.35)
      ax.scatter(x + _jitter(len(values_S)), scale * values_S, color=colors[cell[1]], s=18,
                 zorder=3)
    value = _number(paper.get(task, {}).get(cell[1], {}).get(metric))
    if value is not None:  # Across the bar, so a mean reads off against it.
      ax.hlines(scale * value, x - 0.3, x + 0.3, color=PAPER_COLOR, linewidth=2.5, zorder=4)
      with_paper = True
    n_diverged = sum(bool(m["diverged"]) for m in seeds)
    name = _tick_label(cell, varying)
    ticks.append(f"{name}\nn={len(seeds)}" + (f"\n{n_diverged} diverged" if n_diverged
                                                else ""))
  ax.set_xticks(range(len(cells)), ticks, fontsize="small")
  ax.set_xlabel(" / ".join(["scheme", *varying, "seeds"]), fontsize="small")
  if scale == 100.0:
    ax.set_ylim(*PERCENT_LIMITS)
  else:
    ax.use_sticky_edges = False  # A margin beyond the bars, so a paper value 0 shows.
    ax.autoscale_view()
  ax.set_ylabel(label)
  ax.set_title(described(f"{task}: final {metric}: seeds (points), mean (bar)"
                         + (", paper (black)" if with_paper else ""), metric),
               fontsize="small")


def _fidelity_curves(records, members, task) -> dict:
  """`_seed_curves` of the fidelity of one task over its non-diverged members; a member
  without a step-0 record starts at its `fidelity_init`."""
  diverged = {report.member_key(m) for m in members if m["diverged"]}
  histories: dict = {}
  for r in records:
    key = report.member_key(r)
    if r["task"] != task or key in diverged or _number(r.get("fidelity")) is None:
      continue
    history = histories.setdefault(key, {})
    if _number(r.get("fidelity_init")) is not None:
      history.setdefault(0, r["fidelity_init"])
    history[r["step"]] = r["fidelity"]
  return _seed_curves(histories)


def _fidelity_panel(ax, curves, varying, task, colors) -> None:
  _draw_lines(ax, {cell: _band(*curve) for cell, curve in curves.items()}, varying, colors)
  ax.set_ylim(0.0, 1.02)
  ax.set_xlabel("training step")
  ax.set_ylabel(_unit("fidelity")[1])
  ax.set_title(described(f"{task}: prior fidelity, mean over seeds, min–max band", "fidelity"),
               fontsize="small")


STRIP_INCHES = 0.9  # Per scheme and group of an overview strip: its tick label's width.


def overview_figure(summary, records, metric: str, colors: Mapping[str, str]):
  """One row per task: the final `metric` per scheme and group beside the paper's, and,
  where the run recorded it, the prior's fidelity over training."""
  members, paper = summary["members"], summary["paper"]
  tasks = list(dict.fromkeys(m["task"] for m in members))
  varying = _varying(members)
  curves = {t: _fidelity_curves(records, members, t) for t in tasks}
  cols = 2 if any(curves.values()) else 1
  lines = 4 + max(len(keys) for keys in varying.values())  # A strip's ticks and x label.
  ticks = 0.2 + 0.17 * lines
  titles = max(_title_height(described("", m)) for m in (metric, "fidelity"))
  cells = max(len({report.cell_key(m) for m in members if m["task"] == t}) for t in tasks)
  width = max(6.4, STRIP_INCHES * cells)  # Room for each strip's tick labels side by side.
  fig, axes = subplots(len(tasks), cols, (width * cols, 3.8 * len(tasks)), bottom=0.3 + ticks,
                       top=0.3 + titles, wspace=0.9, hspace=0.2 + titles + ticks)
  for row, task in zip(axes, tasks):
    _strip_panel(row[0], members, varying[task], task, metric, paper, colors)
    if cols == 2 and curves[task]:
      _fidelity_panel(row[1], curves[task], varying[task], task, colors)
    elif cols == 2:
      row[1].axis("off")
  fig.suptitle(f"{summary['experiment']} (preset {summary['preset']}): overview")
  return fig


def plot_overview(run_dir, metric: str | None = None, *, records=None,
                  colors: Mapping[str, str] | None = None) -> str:
  """The figure to look at first, RUN_DIR/plots/overview.png; returns its path.

  One row per task. Left: the final `metric` (default `headline_metric`) of every seed per
  scheme, their mean, and the paper's number. Right, when the run recorded persistence
  diagnostics: the prior's fidelity over training per scheme. Reads summary.json and
  metrics.jsonl (`records`, when the caller has read it already); `colors` default to
  `scheme_colors` of the summary's schemes.
  """
  run_dir = pathlib.Path(run_dir)
  summary = _load_summary(run_dir)
  members = summary["members"]
  metric = metric or headline_metric(summary)
  if not any(metric in m["metrics"] for m in members):
    recorded = sorted({k for m in members for k in m["metrics"]})
    raise ValueError(f"no member of {run_dir / report.SUMMARY_JSON} records {metric!r}; "
                     f"it records {recorded}.")
  if records is None:
    records = report.read_metrics(run_dir) if (run_dir / report.METRICS_FILE).exists() else []
  colors = colors or scheme_colors(m["scheme"] for m in members)
  out_dir = run_dir / "plots"
  out_dir.mkdir(exist_ok=True)
  return _save(overview_figure(summary, records, metric, colors), out_dir / OVERVIEW_FILE)


# ----------------------------------------------------------------------------- sensitivity

AXIS_LABELS = {"data_fraction": "fraction of the training data"}


def sensitivity_figure(summary, hparam: str, metric: str, colors: Mapping[str, str]):
  """The final `metric` against one swept hyperparameter (a learning rate, a data
  fraction, a width), one panel per task, one line per scheme (and values of the other
  swept hparams): the mean over the non-diverged seeds with a min–max band and every seed
  as a point; log-x where the values span a decade or more. Reads summary.json's members."""
  members = [m for m in summary["members"] if _number(m["hparams"].get(hparam)) is not None
             and not m["diverged"] and _number(m["metrics"].get(metric)) is not None]
  if not members:
    raise ValueError(f"no member that did not diverge has a number hparams[{hparam!r}] and "
                     f"a finite {metric}; nothing to plot (pass another metric).")
  scale, label = _unit(metric)
  tasks = list(dict.fromkeys(m["task"] for m in members))
  fig, axes = subplots(1, len(tasks), (5.6 * len(tasks), 4.2), right=0.2, bottom=0.65,
                       top=_title_height(described("", metric)), wspace=0.9)
  for ax, task in zip(axes[0], tasks):
    mine = [m for m in members if m["task"] == task]
    varying = [k for k in report.distinguishing_hparams(mine) if k != hparam]
    lines: dict = {}  # scheme and other hparams → (a cell of the line, {value: metrics})
    for m in mine:
      line = (m["scheme"], *(json.dumps(m["hparams"].get(k)) for k in varying))
      _, by_value = lines.setdefault(line, (report.cell_key(m), {}))
      by_value.setdefault(m["hparams"][hparam], []).append(scale * m["metrics"][metric])
    bands = {}
    for cell, by_value in lines.values():
      xs = sorted(by_value)
      values = [np.array(by_value[x]) for x in xs]
      bands[cell] = (np.array(xs), np.array([v.mean() for v in values]),
                     np.array([v.min() for v in values]), np.array([v.max() for v in values]),
                     min(len(v) for v in values))
      ax.scatter([x for x in xs for _ in by_value[x]], np.concatenate(values), s=12,
                 color=colors[cell[1]], alpha=0.6, zorder=3)
    _draw_lines(ax, bands, varying, colors)
    xs = sorted({m["hparams"][hparam] for m in mine})
    if xs[0] > 0 and xs[-1] >= 10 * xs[0]:
      ax.set_xscale("log")
    ax.set_xticks(xs, [f"{x:.3g}" for x in xs])  # The values trained with.
    ax.minorticks_off()
    if scale == 100.0:
      ax.set_ylim(*PERCENT_LIMITS)
    ax.set_xlabel(AXIS_LABELS.get(hparam, hparam))
    ax.set_ylabel(label)
    ax.set_title(described(f"{task}: final {metric}", metric), fontsize="small")
  return fig


def swept_hparams(summary) -> list[str]:
  """The numeric hparams whose value differs between members of one task and scheme, and
  the data fraction wherever members record one (a family's low-data axis, drawn even at
  one fraction)."""
  members = summary["members"]
  swept = [k for k in report.distinguishing_hparams(members)
           if all(_number(m["hparams"].get(k)) is not None for m in members)]
  fraction = any("data_fraction" in m["hparams"] for m in members)
  return (["data_fraction"] if fraction else []) + [k for k in swept if k != "data_fraction"]


def plot_sensitivity(summary, path, hparam: str, metric: str | None = None,
                     colors: Mapping[str, str] | None = None) -> str:
  """`sensitivity_figure` of `metric` (default `headline_metric`) into the PNG `path`."""
  colors = colors or scheme_colors(m["scheme"] for m in summary["members"])
  return _save(sensitivity_figure(summary, hparam, metric or headline_metric(summary),
                                  colors), path)


# ----------------------------------------------------------------------------- a run


def _layer_order(name: str) -> tuple:
  """Layers in model order: "block_10" after "block_9", "Encoder_0/layers_3/attn" by
  each of its numbers."""
  return tuple(int(n) for n in re.findall(r"\d+", name))


def _file_name(name: str) -> str:
  """A layer path such as "Encoder_0/layers_3/attn" as one file name."""
  return name.replace("/", "-")


def plot_run(run_dir) -> list[str]:
  """Figures of a run into RUN_DIR/plots/; returns the files written. Once summary.json is
  there: first `plot_overview`, and the headline metric against the data fraction when
  the members record one. From metrics.jsonl per task: one figure per metric (a line per
  scheme and group, mean over seeds with a min–max band); per-layer persistence metrics
  and attention heatmaps (init, mid, end beside the prior) for the first and last layer,
  and the degree profile over training, when the run recorded them; curves only where a
  metric was evaluated twice or more. All figures share one `scheme_colors`."""
  run_dir = pathlib.Path(run_dir)
  summary = run_dir / report.SUMMARY_JSON
  recorded = (json.loads(summary.read_text()).get("metric_descriptions", {})
              if summary.exists() else {})
  with report.described(recorded):  # What the run's own metrics meant.
    return _plot_run(run_dir)


def _plot_run(run_dir: pathlib.Path) -> list[str]:
  _pyplot()  # A missing matplotlib fails here, before anything is written.
  records = report.read_metrics(run_dir)
  if not records:
    raise ValueError(f"{run_dir}/metrics.jsonl has no records; nothing to plot.")
  out_dir = run_dir / "plots"
  out_dir.mkdir(exist_ok=True)
  colors = scheme_colors(r["scheme"] for r in records)
  varying = _varying(records)
  tasks = list(varying)
  written = []
  if (run_dir / report.SUMMARY_JSON).exists():  # A run still training has none yet.
    written.append(plot_overview(run_dir, records=records, colors=colors))
    summary = _load_summary(run_dir)
    for hparam in swept_hparams(summary):  # The headline metric against each.
      name = "fraction_curve" if hparam == "data_fraction" else f"sensitivity_{hparam}"
      written.append(plot_sensitivity(summary, out_dir / f"{name}.png", hparam,
                                      colors=colors))
  for metric in CURVE_METRICS:
    curves = _curves(records, lambda r: r.get(metric))
    for task in tasks:
      if _over_training(curves, task):
        fig = curve_figure(curves, task, metric, varying[task], colors, f"{task}: {metric}")
        written.append(_save(fig, out_dir / f"{task}_{metric}.png"))
  layers = sorted({layer for r in records for layer in r.get("layers") or {}},
                  key=_layer_order)
  run_config = _run_config(run_dir)
  for layer in dict.fromkeys(layers[:1] + layers[-1:]):
    for metric in LAYER_METRICS:
      curves = _curves(records, lambda r: (r.get("layers") or {}).get(layer, {}).get(metric))
      for task in tasks:
        if _over_training(curves, task):
          fig = curve_figure(curves, task, metric, varying[task], colors,
                             f"{task}, {layer}: {metric}")
          written.append(_save(fig, out_dir / _file_name(f"{task}_{layer}_{metric}.png")))
    for task in tasks:
      maps = [r for r in records if r["task"] == task and _has_map(r, layer)]
      if maps:
        tokens = token_labels(run_config, task, len(maps[0]["prior_pattern"]))
        fig = attention_figure(records, task, layer, varying[task], colors, tokens)
        written.append(_save(fig, out_dir / _file_name(f"{task}_{layer}_attention.png"), dpi=90))
  degree_curves = _curves(records, lambda r: r.get("degree_profile"))
  for task in tasks:
    if _over_training(degree_curves, task):
      fig = degree_figure(records, task, varying[task], colors)
      written.append(_save(fig, out_dir / f"{task}_degree_profile.png", dpi=100))
  return written
