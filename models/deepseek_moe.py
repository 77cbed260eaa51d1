"""DeepSeek-MoE (v1) in Flax NNX, with a functional facade.

    params = init(cfg, jax.random.key(0))                  # plain nested dict
    logits, aux = apply(params, tokens, cfg, policy=policy)

``apply`` is a pure function of (params, tokens): jit and grad it directly; ``cfg``,
``policy`` and the keyword options are static. Semantics follow the HF remote code of
``deepseek-ai/deepseek-moe-16b-base`` (see ``shared/reference/deepseek_moe.md``):
pre-norm decoder, multi-head or grouped-query attention with rotate_half RoPE, RMSNorm
(float32 variance, cast back before the weight), SwiGLU, softmax router with greedy
top-k, shared experts added with weight 1, dropless routing. The router softmax is
computed in float32.

Float32 parity on a GPU needs ``jax.default_matmul_precision("highest")``: XLA:GPU runs
float32 matmuls in TF32 by default (seen on an H100: ~5e-4 relative logit differences).
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp

import fp8jax
from fp8jax.gemm import grouped as grouped_gemm
from fp8jax.gemm import operand_telemetry
from fp8jax.models import delayed_sites, embedding, layer_scan, layer_stack, moe, policy_rules
from fp8jax.models import policy as policy_lib
from fp8jax.models.attention import attention_core, cudnn_applies, rope  # noqa: F401
from fp8jax.models.config import ModelConfig
from fp8jax.models.deepseek_compute import DEFAULT, DISPATCH_IMPLS, MOE_IMPLS, Compute  # noqa: F401
from fp8jax.models.norm import RMSNorm
from fp8jax.models.policy_rules import Gemms

LAYER = layer_scan.LAYER  # ``param_transform``'s ``where`` for a decoder layer's params


def _normal(cfg: ModelConfig):
  return nnx.initializers.normal(cfg.initializer_range)


def _linear(cfg, d_in, d_out, rngs):
  return nnx.Linear(d_in, d_out, use_bias=False, dtype=jnp.dtype(cfg.dtype),
                    param_dtype=jnp.dtype(cfg.param_dtype), kernel_init=_normal(cfg),
                    rngs=rngs)


def linear(layer: nnx.Linear, x: jax.Array, config: fp8jax.GemmConfig | None,
           record=None, name: str = ""):
  """A bias-free linear layer, through the simulated FP8 GEMM with ``config`` (None: the
  layer's own matmul). ``record``: None, or a ``(name, value)`` callable that takes the
  telemetry sums of the GEMM's forward operands (``{"input": ..., "weight": ...}``,
  :mod:`fp8jax.gemm.operand_telemetry`)."""
  if config is None:
    return layer(x)
  kernel = layer.kernel[...].astype(x.dtype)
  if record is not None and config.fprop != "bf16":  # W^T: contraction-last [N, K]
    roles = config.roles
    record(name, {"input": operand_telemetry.operand_sums(x, roles.input),
                  "weight": operand_telemetry.operand_sums(kernel.T, roles.weight)})
  return fp8jax.fp8_dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), config=config)


def _named(record, prefix: str):
  """``record`` (a ``(name, value)`` callable, or None) for the children of ``prefix``."""
  if record is None:
    return None
  return lambda name, value: record(f"{prefix}/{name}", value)


class Attention(nnx.Module):
  """q/o projections [d, d], k/v projections [d, kv_heads * head_dim]."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    d, d_kv = cfg.hidden_size, cfg.kv_heads * cfg.head_dim
    self.cfg = cfg
    self.q_proj = _linear(cfg, d, d, rngs)
    self.k_proj = _linear(cfg, d, d_kv, rngs)
    self.v_proj = _linear(cfg, d, d_kv, rngs)
    self.o_proj = _linear(cfg, d, d, rngs)

  def __call__(self, x, gemms: Gemms, record=None, deterministic: bool = False):
    b, s, _ = x.shape
    h, kv, hd = self.cfg.num_attention_heads, self.cfg.kv_heads, self.cfg.head_dim
    pos = jnp.arange(s)
    proj = lambda name, v: linear(getattr(self, name), v, gemms(name), record, name)  # noqa: E731
    q = rope(proj("q_proj", x).reshape(b, s, h, hd), pos, self.cfg.rope_theta)
    k = rope(proj("k_proj", x).reshape(b, s, kv, hd), pos, self.cfg.rope_theta)
    v = proj("v_proj", x).reshape(b, s, kv, hd)
    impl = self.cfg.attention_impl
    if deterministic and impl != "xla":  # cuDNN's backward adds dQ with atomics
      if impl == "cudnn":
        raise ValueError("attention_impl='cudnn' is not deterministic (its backward adds dQ "
                         "with atomics); use 'auto' or 'xla' in the deterministic mode")
      impl = "xla"
    out = attention_core(q, k, v, impl).reshape(b, s, h * hd)
    return proj("o_proj", out)


class MLP(nnx.Module):
  """SwiGLU MLP (dense layers and the fused shared experts)."""

  def __init__(self, cfg: ModelConfig, width: int, rngs: nnx.Rngs):
    self.limit = cfg.swiglu_limit  # the activation's clamp (moe.glu), None: off
    self.gate_proj = _linear(cfg, cfg.hidden_size, width, rngs)
    self.up_proj = _linear(cfg, cfg.hidden_size, width, rngs)
    self.down_proj = _linear(cfg, width, cfg.hidden_size, rngs)

  def __call__(self, x, gemms: Gemms, record=None):
    proj = lambda name, v: linear(getattr(self, name), v, gemms(name), record, name)  # noqa: E731
    hidden = moe.glu(proj("gate_proj", x), proj("up_proj", x), self.limit)
    return proj("down_proj", hidden)




class MoE(nnx.Module):
  """Routed experts (stacked weights) plus fused shared experts."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    d, e, f = cfg.hidden_size, cfg.n_routed_experts, cfg.expert_width
    pdt = jnp.dtype(cfg.param_dtype)
    init = _normal(cfg)
    live = (jnp.arange(f) < cfg.moe_intermediate_size).astype(pdt)  # zero padding
    self.gate = nnx.Param(init(rngs.params(), (d, e), pdt))
    self.experts_gate = nnx.Param(init(rngs.params(), (e, d, f), pdt) * live)
    self.experts_up = nnx.Param(init(rngs.params(), (e, d, f), pdt) * live)
    self.experts_down = nnx.Param(init(rngs.params(), (e, f, d), pdt) * live[:, None])
    self.shared_experts = (MLP(cfg, cfg.n_shared_experts * cfg.moe_intermediate_size, rngs)
                           if cfg.n_shared_experts else None)

  def __call__(self, x, site, gemms: Gemms, compute: Compute = DEFAULT, record=None):
    """x [B, S, d] -> (output [B, S, d], routing dict, scores [T, E]).

    ``site(name, x)`` fake-quantizes the named sites; ``gemms`` answers the GEMM configs
    of this module's path: its own ``ragged_dot`` (the routed experts) and the shared
    experts' linear layers.

    ``compute``: the MoE path (``moe_impl``) and its groups (``moe_groups``); ``groups``
    > 1 splits the batch into that many groups of whole sequences, each
    dispatched on its own (vmapped): with the batch sharded over ``groups`` devices each
    device sorts and multiplies only its own tokens (one global sort would make XLA
    replicate the whole MoE on every device). The result is the same, except that with
    an FP8 GEMM policy the routed experts' Wgrad tiles along the tokens follow the groups
    (as on real data-parallel devices).
    """
    impl, groups = compute.moe_impl, compute.moe_groups
    b, s, d = x.shape
    flat = x.reshape(b * s, d)
    scores, weights, ids = moe.route(flat, self.gate[...], self.cfg.num_experts_per_tok,
                                     self.cfg.norm_topk_prob)
    experts_in = site("expert_in", flat)
    dt = x.dtype
    params = (self.experts_gate[...], self.experts_up[...], self.experts_down[...])
    args = (experts_in, weights, ids, *(w.astype(dt) for w in params))
    config = gemms(op="ragged_dot")
    telemetry = record is not None and config is not None and config.fprop != "bf16"
    # each weight quantized once, from the parameters, for the GEMM and its telemetry
    once, weight_sums = (moe.experts_weights_once(params, dt, config, telemetry)
                         if impl in DISPATCH_IMPLS else (None, None))
    if telemetry:
      record("experts", moe.experts_telemetry(args, config.roles, weight_sums))
    if impl == "reference":
      if config is not None:
        raise ValueError("the every-expert reference path has no FP8 GEMM hook; use "
                         "moe_impl='dispatch'")
      routed = moe.experts_reference(*args, limit=self.cfg.swiglu_limit)
    else:  # one of DISPATCH_IMPLS (Compute checks the path)
      if b % groups:
        raise ValueError(f"moe_groups {groups} does not divide the batch {b}")
      kernel = impl == "pallas" and config is None
      routed = moe.dispatch_groups(args, groups, grouped_gemm.matmul_for(impl, config), kernel,
                                   once=once, limit=self.cfg.swiglu_limit).reshape(b * s, d)
    routed = site("moe_routed_out", routed.reshape(b, s, d))
    out = routed
    if self.shared_experts is not None:
      out = out + site("moe_shared_out",
                       self.shared_experts(x, gemms.child("shared_experts"),
                                           _named(record, "shared_experts")))
    routing = {"topk_ids": ids.reshape(b, s, -1), "topk_weights": weights.reshape(b, s, -1),
               "expert_counts": moe.expert_counts(ids, self.cfg.n_routed_experts)}
    return site("moe_out", out), routing, scores


class DecoderLayer(nnx.Module):
  def __init__(self, cfg: ModelConfig, index: int, rngs: nnx.Rngs):
    self.index = index
    self.input_layernorm = RMSNorm(cfg)
    self.self_attn = Attention(cfg, rngs)
    self.post_attention_layernorm = RMSNorm(cfg)
    self.is_moe = cfg.is_moe_layer(index)
    self.mlp = MoE(cfg, rngs) if self.is_moe else MLP(cfg, cfg.intermediate_size, rngs)


class DeepseekMoE(nnx.Module):
  """The decoder: embedding, layers, final norm, untied float32-logit head."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed_tokens = nnx.Embed(cfg.vocab_size, cfg.hidden_size, dtype=jnp.dtype(cfg.dtype),
                                  param_dtype=jnp.dtype(cfg.param_dtype),
                                  embedding_init=_normal(cfg), rngs=rngs)
    self.layers = nnx.List([DecoderLayer(cfg, i, rngs) for i in range(cfg.num_hidden_layers)])
    self.norm = RMSNorm(cfg)
    self.lm_head = _linear(cfg, cfg.hidden_size, cfg.vocab_size, rngs)

  def __call__(self, tokens, policy=policy_lib.BF16, *,
               train: bool = True, compute: Compute = DEFAULT, delayed_state=None,
               scan_layers=False, layer_params=None, param_transform=None):
    """``layer_params``: the decoder layers' params in either layout of
    :mod:`fp8jax.models.layer_stack` (the ``layers`` and ``layer_runs`` entries of a params
    tree), used in place of the layer modules' own (then only their structure is read);
    ``param_transform``: see :func:`apply`."""
    cfg = self.cfg
    if isinstance(policy, policy_lib.PrecisionPolicy):
      policy.check_layers(cfg.num_hidden_layers, cfg.is_moe_layer)
    delayed_sites.check(cfg, policy, delayed_state)
    decide = policy_rules.decisions(policy, cfg.num_hidden_layers)  # the engine's answers
    (table,) = self.embed_tokens.promote_dtype((self.embed_tokens.embedding[...],),
                                               dtype=self.embed_tokens.dtype, inexact=False)
    h = embedding.lookup(table, tokens, compute.deterministic)  # = self.embed_tokens(tokens)
    step = functools.partial(self._layer, decide=decide, batch=tokens.shape[0], train=train,
                             compute=compute)
    n = cfg.num_hidden_layers
    opts = layer_scan.options(scan_layers)
    groups = (layer_scan.policy_runs(self.layers, decide) if opts
              else [[i] for i in range(n)])
    outs = {}
    for group in groups:
      if len(group) == 1:
        layer = layer_stack.module(self.layers, group[0], layer_params, param_transform)
        h, outs[group[0]] = step(layer, h, group[0], delayed_state)
      else:
        stacked = layer_stack.run_state(self.layers, group, layer_params)
        h, per_layer = layer_scan.scan(step, *stacked, group, h, delayed_state, opts,
                                       param_transform)
        outs.update(per_layer)
    tel, gemm_tel, aux_losses, routing = {}, {}, {}, {}
    for i in range(n):  # in layer order, as the unrolled loop records them
      tel.update({f"layer_{i}/{k}": v for k, v in outs[i]["tel"].items()})
      gemm_tel.update({f"layers/{i}/{k}": v for k, v in outs[i]["gemm"].items()})
      if "routing" in outs[i]:
        routing[i] = outs[i]["routing"]
      if "aux_loss" in outs[i]:
        aux_losses[i] = outs[i]["aux_loss"]
    logits = self.lm_head(self.norm(h)).astype(jnp.float32)
    # Summed as computed: XLA would otherwise fold the sum into the layers' fusions, where
    # the scanned and the unrolled layers round it differently.
    aux_losses = jax.lax.optimization_barrier(aux_losses)
    aux = {"aux_loss": sum(aux_losses.values(), jnp.float32(0)),
           "aux_loss_per_layer": aux_losses, "routing": routing}
    if compute.telemetry:
      aux["telemetry"] = tel
    if compute.gemm_telemetry:
      aux["gemm_telemetry"] = gemm_tel
    return logits, aux

  def _layer(self, layer: DecoderLayer, h, i: int, delayed_state, *, decide, batch: int,
             train: bool, compute: Compute):
    """Decoder layer ``layer`` with the decisions of layer ``i``: h [B, S, d] -> (h, out),
    ``out``: ``tel`` ``{site: telemetry}``, ``gemm`` ``{module path: sums}`` (paths under
    the layer) and, on MoE layers, ``routing`` and (training) ``aux_loss``."""
    cfg = self.cfg
    tel, gemm_tel, out = {}, {}, {}
    rec = ((lambda name, value: gemm_tel.__setitem__(name, value)) if compute.gemm_telemetry
           else None)

    def site(name, x):
      spec = decide.site(name, i)
      if spec is None:
        return x
      state = delayed_sites.at(delayed_state, name, i, spec)  # None: current scaling
      if compute.telemetry:
        x, tel[name] = fp8jax.fake_quant(x, spec, state, telemetry=True)
        return x
      return fp8jax.fake_quant(x, spec, state)

    gemms = Gemms(decide, f"layers/{i}")  # the GEMM recipe, where the rules apply it
    h = h + site("attn_out", layer.self_attn(layer.input_layernorm(h), gemms.child("self_attn"),
                                             _named(rec, "self_attn"), compute.deterministic))
    x = layer.post_attention_layernorm(h)
    if layer.is_moe:
      y, out["routing"], scores = layer.mlp(x, site, gemms.child("mlp"), compute,
                                            _named(rec, "mlp"))
      if train and cfg.aux_loss_alpha > 0:
        out["aux_loss"] = moe.balance_loss(scores, out["routing"]["topk_ids"].reshape(
            scores.shape[0], -1), batch, cfg.aux_loss_alpha, cfg.seq_aux)
    else:
      y = site("mlp_out", layer.mlp(x, gemms.child("mlp"), _named(rec, "mlp")))
    return h + y, {"tel": tel, "gemm": gemm_tel, **out}


@functools.cache
def _skeleton(cfg: ModelConfig):
  """(graphdef, abstract param state) of the model, built without allocating."""
  abstract = nnx.eval_shape(lambda: DeepseekMoE(cfg, nnx.Rngs(0)))
  return nnx.split(abstract)


def layer_runs(cfg: ModelConfig, policy) -> list[list[int]]:
  """The runs of alike layers under ``policy`` that ``apply(..., scan_layers=True)`` scans:
  the stacked layout that fits it (:func:`fp8jax.models.layer_stack.stack`)."""
  model = nnx.merge(*_skeleton(cfg))
  return layer_scan.policy_runs(model.layers,
                                policy_rules.decisions(policy, cfg.num_hidden_layers))


def init(cfg: ModelConfig, rng: jax.Array) -> dict:
  """Random parameters as a plain nested dict (float ``cfg.param_dtype`` leaves)."""
  model = DeepseekMoE(cfg, nnx.Rngs(params=rng))
  return nnx.to_pure_dict(nnx.state(model))


def abstract_params(cfg: ModelConfig) -> dict:
  """The params tree as ``jax.ShapeDtypeStruct`` leaves (for checkpoint restores)."""
  return nnx.to_pure_dict(_skeleton(cfg)[1])


def apply(params: dict, tokens: jax.Array, cfg: ModelConfig,
          policy=policy_lib.BF16, *, train: bool = True,
          compute: Compute | None = None, delayed_state=None, scan_layers=False,
          param_transform=None, **options):
  """Forward pass.

  Args:
    params: the nested dict from :func:`init` (or a converted checkpoint), its decoder
      layers per layer or stacked per run (:mod:`fp8jax.models.layer_stack`; the
      gradient comes back in the same layout).
    tokens: int [B, S].
    cfg: the model config.
    policy: the precision policy, an :class:`fp8jax.models.api.Variant` (its rules) or a
      ``PrecisionPolicy`` (compiled to rules, :mod:`fp8jax.models.policy_rules`); the
      model asks its rules which sites to fake-quantize and which GEMMs to simulate.
    train: add the balance losses (they need the full router scores).
    compute: how the pass computes and what it reports (:class:`Compute`: the MoE path
      and groups, the deterministic mode, telemetry); ``options``: its fields by name
      (``moe_impl="pallas"``, ``telemetry=True``), which replace ``compute``'s.
    delayed_state: the amax histories of the policy's delayed-scaled sites
      (:func:`fp8jax.models.delayed_sites.init`; None or ``{}`` when it has none). Their
      update is the gradient with respect to it (see :mod:`fp8jax.models.delayed_sites`).
    scan_layers: run each run of consecutive alike layers (same kind, same decisions) as
      one ``jax.lax.scan``: less to compile, the same params and outputs (bit for bit
      with ``--xla_allow_excess_precision=false``; :mod:`fp8jax.models.layer_scan`). A
      :class:`fp8jax.models.layer_scan.ScanOptions` sets its unrolling and remat.
    param_transform: ``fn(tree, where) -> tree`` on each decoder layer's params where the
      layer runs (``where``: :data:`LAYER`; one layer's tree) and on each other top-level
      entry where the forward starts (``where``: its key); None: none. E.g.
      :func:`fp8jax.train.data_parallel.gather_in_forward` (FSDP).

  Returns:
    ``(logits float32 [B, S, V], aux)`` where aux has ``aux_loss`` (sum over MoE
    layers), ``aux_loss_per_layer``, ``routing`` (per MoE layer: ``topk_ids``,
    ``topk_weights`` [B, S, K], ``expert_counts`` [E]) and, on request, ``telemetry``
    and ``gemm_telemetry``.
  """
  compute = Compute.of(compute, **options)
  graphdef, state = _skeleton(cfg)
  layer_params = {k: params[k] for k in (layer_stack.LAYERS, layer_stack.RUNS) if k in params}
  stored = layer_stack.runs(layer_params)
  if sorted(i for unit in stored for i in unit) != list(range(cfg.num_hidden_layers)):
    raise ValueError(f"the params hold layers {stored}, the model has "
                     f"{cfg.num_hidden_layers}: each layer once, per layer or stacked")
  rest = {k: v if param_transform is None else param_transform(v, k)
          for k, v in params.items() if k not in layer_params}
  model = nnx.merge(graphdef, layer_stack.filled(state, rest))
  return model(tokens, policy, train=train, compute=compute, delayed_state=delayed_state,
               scan_layers=scan_layers, layer_params=layer_params,
               param_transform=param_transform)


def lm_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
  """Mean next-token cross-entropy: logits [B, S, V] predict tokens[:, 1:]."""
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  return -jnp.mean(picked)
