"""Stage 3's cases, as the child process runs them: fused attention against the reference.

Each case runs the program the sweep engine compiles, `jit(vmap(value_and_grad))` over 2
members, with fused attention (cuDNN on a GPU) and with the reference attention, and
compares the two; the form cases hand cuDNN the engine's case in one form each
(`mpx.attention.CUDNN_FORMS`), and without cuDNN check the form on the XLA path and read
"not available". They run in a process of their own (`--cudnn-probes`) that logs each
case's start and end, so a crash in cuDNN ends that process, not the check, and the log
names the case it ended.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from accelerator_check import context, report, sweep
import mpx
from mpx import attention as attention_lib
from mpx.nn import ViT
from mpx.sweep import engine

# The forms (`mpx.attention.CUDNN_FORMS`) each tried on the engine's case: which of the
# conditions jax's and cuDNN's trackers name makes cuDNN match the reference under vmap.
FORM_PROBES = {
    "form_bf16_bias": ("bf16_bias", "prior_vmap with the bias in bf16 (q's dtype), not "
                                    "float32"),
    "form_finite_causal": ("finite", "prior_vmap and a causal mask, folded into the bias as "
                                     "a finite negative: no boolean mask, no −inf"),
    "form_broadcast_bias": ("broadcast_bias", "prior_vmap with the bias [1, H, N, N], not "
                                              "materialised per example (expected to fail)"),
    "form_seq_lengths": ("seq_lengths", "prior_vmap with full-length query and key-value "
                                        "sequence lengths passed"),
    "form_all": ("all", "prior_vmap with a bf16 bias, no −inf, materialised [B, H, N, N], "
                        "full-length sequence lengths"),
    "form_all_odd_tokens": ("all", "form_all at 197 tokens (mpx pads to 198; the padding "
                                   "key folded into the bias)"),
}
PROBES = {
    "prior_vmap": "a prior per member (the engine's case), 16 tokens",
    **{case: what for case, (_, what) in FORM_PROBES.items()},
    "engine_chunk_form_all": "engine_chunk with attention=cudnn in the form 'all'",
    "prior_map": "prior_vmap with the members in lax.map (no vmap): the kernel or its "
                 "batching rule",
    "odd_tokens_padded": "197 tokens (ViT-Tiny at 224 px) with a prior: mpx pads to 198",
    "odd_tokens_jax_alone": "197 tokens, a bias, jax.nn.dot_product_attention alone "
                            "(no mpx padding): jax's even-count rule",
    "causal_no_prior": "a causal mask and no prior: the mask is the only bias and carries "
                       "no member axis",
    "unbatched_cotangent": "loss = sum of the output: its cotangent carries no member axis",
    "vit_model": "a ViT at 224 px (197 tokens), bf16, 2 members, value_and_grad of the "
                 "loss, every param's gradient",
    "engine_chunk": "one engine chunk (jit(scan(vmap))) of the Boolean model in bf16, "
                    "2 members: the training loss",
}


def relative_error(got, want) -> float:
  """‖got − want‖ / ‖want‖ over every leaf of two trees (float32)."""
  pairs = zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))
  num = den = 0.0
  for a, b in pairs:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    num += float(np.sum((a - b) ** 2))
    den += float(np.sum(b ** 2))
  return (num ** 0.5) / max(den ** 0.5, 1e-30)


def _attention_probe(name: str, p: dict, gpu: bool, backend: str | None = None) -> dict:
  """jit(vmap(value_and_grad)) over 2 members of an attention-level loss, fused against
  the reference attention on the same bf16 values in float32. A form case runs its form
  on `backend` (default: cuDNN on a GPU, the XLA path elsewhere)."""
  k_members, b, h, d = 2, p["batch"], p["heads"], p["head_dim"]
  n = p["odd_tokens"] if "odd" in name else p["tokens"]
  keys = jax.random.split(jax.random.key(0), 5)
  q, k, v = (jax.random.normal(key, (k_members, b, n, h, d), jnp.bfloat16)
             for key in keys[:3])
  m_KHNN = 3 * jax.random.normal(keys[3], (k_members, h, n, n))
  w_KBNHD = jax.random.normal(keys[4], (k_members, b, n, h, d))
  causal = name in ("causal_no_prior", "form_finite_causal")
  form = attention_lib.CUDNN_FORMS[FORM_PROBES[name][0]] if name in FORM_PROBES else None
  form_backend = backend or ("cudnn" if gpu else "xla")

  def attend(q, k, v, m_HNN, fused: bool):
    if form is not None:
      if not fused:
        return mpx.masked_attention(q, k, v, m_HNN, causal=causal)
      return attention_lib._masked_attention_fused(q, k, v, m_HNN, None, None, causal, None,
                                                   None, form_backend, pad_odd=True,
                                                   form=form)
    if name == "odd_tokens_jax_alone":
      bias_BHNN = jnp.broadcast_to(mpx.mask_bias(m_HNN), (b, h, n, n))
      backend = ("cudnn" if gpu else "xla") if fused else "xla"
      return jax.nn.dot_product_attention(q, k, v, bias=bias_BHNN, implementation=backend)
    prior = None if causal else m_HNN
    if not fused:
      return mpx.masked_attention(q, k, v, prior, causal=causal)
    if gpu:
      return mpx.masked_attention(q, k, v, prior, causal=causal, implementation="cudnn")
    # No cuDNN here: the XLA path with the padding the cuDNN path applies.
    return attention_lib._masked_attention_fused(q, k, v, prior, None, None, causal, None,
                                                 None, "xla", pad_odd=True)

  def loss(fused: bool):
    def f(m_HNN, q, k, v, w_BNHD):
      out = attend(q, k, v, m_HNN, fused).astype(jnp.float32)
      return jnp.sum(out) if name == "unbatched_cotangent" else jnp.sum(out * w_BNHD)
    member = jax.value_and_grad(f, argnums=(0, 1))
    if name == "prior_map":
      return jax.jit(lambda *xs: jax.lax.map(lambda x: member(*x), xs))
    return jax.jit(jax.vmap(member))

  got = jax.block_until_ready(loss(True)(m_KHNN, q, k, v, w_KBNHD))
  up = lambda x: x.astype(jnp.float32)
  want = loss(False)(m_KHNN, up(q), up(k), up(v), w_KBNHD)
  error = relative_error(got, want)
  return {"status": "ok" if error <= 2e-2 else "mismatch",
          "detail": f"relative error {error:.2g} (tolerance 2e-2)"}


def _vit_probe(p: dict, gpu: bool) -> dict:
  """The ViT's loss and every gradient, 2 members vmapped, fused attention vs reference."""
  import optax
  config = dict(image_size=224, patch_size=16, num_classes=10, pool="cls",
                pos_embed="learned", dtype=jnp.bfloat16, **p["vit"])
  images = jax.random.normal(jax.random.key(1), (p["vit_batch"], 224, 224, 3))
  labels = jnp.arange(p["vit_batch"]) % 10
  model = ViT(**config)
  init = jax.jit(lambda key: model.init(key, images[:1])["params"])  # One compile.
  inits = [init(jax.random.key(s)) for s in (0, 1)]
  params = engine.stack(inits)
  # A prior that is not neutral, so the bias matters.
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: 3 * jax.random.normal(jax.random.key(2), x.shape)
      if attention_lib.is_mask_path(path) else x, params)

  def run(implementation):
    m = ViT(implementation=implementation, **config)
    loss = lambda params: optax.softmax_cross_entropy_with_integer_labels(
        m.apply({"params": params}, images).astype(jnp.float32), labels).mean()
    return jax.block_until_ready(jax.jit(jax.vmap(jax.value_and_grad(loss)))(params))

  error = relative_error(run("cudnn" if gpu else "jax"), run("reference"))
  return {"status": "ok" if error <= 5e-2 else "mismatch",
          "detail": f"relative error {error:.2g} (tolerance 5e-2)"}


def _form_probe(name: str, p: dict, gpu: bool) -> dict:
  """A form case: on a GPU through cuDNN; elsewhere the form on the XLA path (its
  operands compute the attention), then cuDNN tried: "not available", with both."""
  if gpu:
    return _attention_probe(name, p, gpu)
  xla = _attention_probe(name, p, gpu, backend="xla")
  try:
    result = _attention_probe(name, p, gpu, backend="cudnn")
  except Exception as e:  # noqa: BLE001 (no cuDNN here: jax says so)
    return {"status": "not available",
            "detail": f"{report.one_line(e)}; on the XLA path ({xla['status']}): "
                      f"{xla['detail']}"}
  return result


def _engine_probe(ctx: context.Context, p: dict, gpu: bool, form: str | None = None) -> dict:
  """One chunk of the Boolean model in bf16, fused vs reference attention: the loss. With
  `form`, cuDNN in that form: `mpx.attention.CUDNN_FORM` set for this chunk's trace."""
  if form is not None:
    if not gpu:
      return {"status": "not available",
              "detail": 'attention="cudnn" needs an NVIDIA GPU; the form itself is '
                        "checked on the XLA path by the form cases"}
    saved, attention_lib.CUDNN_FORM = attention_lib.CUDNN_FORM, attention_lib.CUDNN_FORMS[form]
    ctx.groups.clear()  # Fresh groups, so the chunk is traced again, with this form.
    try:
      return _engine_probe(ctx, p, gpu)
    finally:
      attention_lib.CUDNN_FORM = saved
      ctx.groups.clear()
  losses = []
  for attention in ("cudnn" if gpu else "jax", "reference"):
    preset = ctx.sizes.presets[p["engine_slot"]]
    group, _ = sweep.boolean_group(ctx, preset, compute_dtype="bfloat16",
                                   attention=attention)
    chunk, state, hparams, data, _ = sweep.compile_tiled(ctx, preset, group, 2,
                                                         p["engine_steps"])
    _, out = chunk(state, hparams, data)
    losses.append(np.asarray(out["train_loss"]))
  error = relative_error(*losses)
  ok = np.all(np.isfinite(losses[0])) and error <= 5e-2
  text = lambda loss_K: "[" + ", ".join(f"{x:.4g}" for x in loss_K) + "]"
  return {"status": "ok" if ok else "mismatch",
          "detail": f"train loss {text(losses[0])} vs {text(losses[1])}, relative error "
                    f"{error:.2g} (tolerance 5e-2)"}


def run_probes(path: pathlib.Path, cases: list[str], sizes: context.Sizes) -> None:
  """The child process: each case's start, then its result, one JSON line each (flushed),
  so the parent knows which case a crash ended."""
  gpu = jax.default_backend() == "gpu"
  ctx = context.new_context(sizes, report.Budget(1e9), None, None)
  with path.open("a") as log:
    def emit(record):
      log.write(json.dumps(record) + "\n")
      log.flush()
      os.fsync(log.fileno())
    for case in cases:
      emit({"case": case, "event": "start"})
      start = time.perf_counter()
      try:
        if case == "vit_model":
          result = _vit_probe(sizes.probe, gpu)
        elif case == "engine_chunk":
          result = _engine_probe(ctx, sizes.probe, gpu)
        elif case == "engine_chunk_form_all":
          result = _engine_probe(ctx, sizes.probe, gpu, form="all")
        elif case in FORM_PROBES:
          result = _form_probe(case, sizes.probe, gpu)
        else:
          result = _attention_probe(case, sizes.probe, gpu)
      except Exception as e:  # noqa: BLE001 (an error is a finding)
        result = {"status": "error", "detail": report.one_line(e)}
        if case == "odd_tokens_jax_alone" and "Unsupported sequence length" in str(e):
          result["status"] = "refused by jax (why mpx pads)"
      emit({"case": case, "event": "end", "seconds": time.perf_counter() - start} | result)
