"""HF DeepSeek-MoE (v1) checkpoints <-> fp8jax params, tensor by tensor.

HF ``nn.Linear`` weights are [out, in]; fp8jax kernels are [in, out]. The k/v projections
are [kv_heads * head_dim, d] in HF (grouped-query attention when kv_heads < heads), the
head order kept: query head h reads key/value head h // (heads // kv_heads). Routed
experts are stacked: ``experts_gate``/``experts_up`` [E, d, f], ``experts_down``
[E, f, d], zero-padded to ``cfg.expert_width``.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from fp8jax.models import safetensors_io as st
from fp8jax.models.config import ModelConfig

_CONFIG_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "moe_intermediate_size", "n_routed_experts",
                  "n_shared_experts", "num_experts_per_tok", "num_key_value_heads",
                  "first_k_dense_replace", "moe_layer_freq", "norm_topk_prob",
                  "aux_loss_alpha", "seq_aux", "rms_norm_eps", "rope_theta",
                  "max_position_embeddings", "initializer_range")
_REQUIRED = _CONFIG_FIELDS[:9]

# Fields of HF's DeepseekConfig that change the function but that the model does not
# implement: each with the values it accepts (an absent field takes HF's default, which
# is accepted). Every other unknown field (``_name_or_path``, ``torch_dtype``,
# ``pretraining_tp``: a split of the same GEMMs, ...) leaves the function alone.
_SUPPORTED_ONLY = {"rope_scaling": (None,), "attention_bias": (False,),
                   "attention_dropout": (0.0,), "hidden_act": ("silu", "swish"),
                   "scoring_func": ("softmax",), "tie_word_embeddings": (False,)}


def unsupported_fields(hf: dict) -> list[str]:
  """``"field=value (supported: ...)"`` for each field of ``hf`` the model would ignore
  although it changes the function; empty when every field is supported."""
  bad = [f"{k}={hf[k]!r} (supported: {', '.join(map(repr, ok))})"
         for k, ok in _SUPPORTED_ONLY.items() if k in hf and hf[k] not in ok]
  heads, d = hf.get("num_attention_heads"), hf.get("hidden_size")
  if hf.get("head_dim") is not None and heads and d and hf["head_dim"] != d // heads:
    bad.append(f"head_dim={hf['head_dim']!r} (supported: hidden_size / "
               f"num_attention_heads = {d // heads})")
  return bad


def config_from_hf(hf: dict, **overrides) -> ModelConfig:
  """ModelConfig from an HF ``config.json`` dict.

  Raises ValueError, naming the fields, for a missing or null required field or a
  field the model does not implement (:func:`unsupported_fields`): before any tensor is
  read. A null or absent ``num_key_value_heads`` is multi-head attention (as in HF).
  """
  if hf.get("model_type", "deepseek") != "deepseek":
    raise ValueError(f"not a DeepSeek-MoE v1 config: model_type {hf.get('model_type')!r}")
  missing = [k for k in _REQUIRED if k not in hf]
  if missing:
    raise ValueError(f"HF config lacks {missing}")
  null = [k for k in _REQUIRED if hf[k] is None and k != "n_shared_experts"]
  if null:
    raise ValueError(f"HF config fields {null} are null; fp8jax needs them set (a null "
                     "n_routed_experts, a model without MoE layers, is not supported)")
  bad = unsupported_fields(hf)
  if bad:
    raise ValueError("HF config fields not supported by fp8jax: " + "; ".join(bad))
  fields = {k: hf[k] for k in _CONFIG_FIELDS if k in hf and hf[k] is not None}
  if hf.get("n_shared_experts", 0) is None:  # HF allows null: no shared experts
    fields["n_shared_experts"] = 0
  return ModelConfig(**{**fields, **overrides})


def config_to_hf(cfg: ModelConfig) -> dict:
  """HF ``config.json`` dict for ``cfg`` (ValueError for a clamped SwiGLU, which HF's
  DeepSeek-MoE v1 does not compute)."""
  if cfg.swiglu_limit is not None:
    raise ValueError(f"swiglu_limit={cfg.swiglu_limit}: HF's DeepSeek-MoE v1 has no clamped "
                     "SwiGLU, so its checkpoint would compute another function")
  out = {k: getattr(cfg, k) for k in _CONFIG_FIELDS}
  out.update(model_type="deepseek", architectures=["DeepseekForCausalLM"],
             tie_word_embeddings=False, torch_dtype="bfloat16", hidden_act="silu",
             num_key_value_heads=cfg.kv_heads, attention_bias=False, rope_scaling=None,
             scoring_func="softmax", attention_dropout=0.0)
  return out


def hf_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
  """Every HF key of ``cfg`` with its [out, in] shape."""
  d, v, f = cfg.hidden_size, cfg.vocab_size, cfg.moe_intermediate_size
  d_kv = cfg.kv_heads * cfg.head_dim
  shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,),
            "lm_head.weight": (v, d)}
  for i in range(cfg.num_hidden_layers):
    p = f"model.layers.{i}."
    for proj, rows in zip("qkvo", (d, d_kv, d_kv, d)):
      shapes[f"{p}self_attn.{proj}_proj.weight"] = (rows, d)
    shapes[p + "input_layernorm.weight"] = (d,)
    shapes[p + "post_attention_layernorm.weight"] = (d,)
    if cfg.is_moe_layer(i):
      shapes[p + "mlp.gate.weight"] = (cfg.n_routed_experts, d)
      for e in range(cfg.n_routed_experts):
        shapes.update(_mlp_shapes(f"{p}mlp.experts.{e}.", d, f))
      if cfg.n_shared_experts:
        shapes.update(_mlp_shapes(p + "mlp.shared_experts.", d, f * cfg.n_shared_experts))
    else:
      shapes.update(_mlp_shapes(p + "mlp.", d, cfg.intermediate_size))
  return shapes


def _mlp_shapes(prefix, d, width):
  return {prefix + "gate_proj.weight": (width, d), prefix + "up_proj.weight": (width, d),
          prefix + "down_proj.weight": (d, width)}


class HFCheckpoint:
  """A directory of ``*.safetensors`` shards (with or without an index), read lazily."""

  def __init__(self, directory: str | pathlib.Path):
    self.directory = pathlib.Path(directory)
    files = sorted(self.directory.glob("*.safetensors"))
    if not files:
      raise FileNotFoundError(f"no *.safetensors files in {self.directory}")
    self._where = {}
    for path in files:
      header, start = st.read_header(path)
      for name in header:
        self._where[name] = (path, header, start)

  @property
  def keys(self) -> set[str]:
    return set(self._where)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._where[name][1][name]["shape"])

  def __getitem__(self, name: str) -> np.ndarray:
    path, header, start = self._where[name]
    return st.load(path, name, header, start)

  def validate(self, cfg: ModelConfig) -> None:
    """Raises ValueError naming every missing, unexpected or mis-shaped key."""
    want = hf_tensor_shapes(cfg)
    missing = sorted(set(want) - self.keys)
    unexpected = sorted(k for k in self.keys - set(want) if "rotary_emb.inv_freq" not in k)
    bad = [f"{k}: {self.shape(k)} != {want[k]}" for k in sorted(set(want) & self.keys)
           if self.shape(k) != want[k]]
    if missing or unexpected or bad:
      raise ValueError("checkpoint does not match the config:"
                       + (f"\n  missing: {missing[:20]}{' ...' if len(missing) > 20 else ''}"
                          if missing else "")
                       + (f"\n  unexpected: {unexpected[:20]}" if unexpected else "")
                       + (f"\n  wrong shapes: {bad[:20]}" if bad else ""))


def _pad(a: np.ndarray, axis: int, size: int) -> np.ndarray:
  if a.shape[axis] == size:
    return a
  widths = [(0, 0)] * a.ndim
  widths[axis] = (0, size - a.shape[axis])
  return np.pad(a, widths)


def param_builders(cfg: ModelConfig, ckpt: HFCheckpoint):
  """Yields (path tuple, zero-arg builder of the float32 array) for every param leaf."""
  f32 = lambda name: np.asarray(ckpt[name], np.float32)  # noqa: E731
  kernel = lambda name: f32(name).T  # noqa: E731
  yield ("embed_tokens", "embedding"), lambda: f32("model.embed_tokens.weight")
  yield ("norm", "weight"), lambda: f32("model.norm.weight")
  yield ("lm_head", "kernel"), lambda: kernel("lm_head.weight")
  width = cfg.expert_width
  experts = range(cfg.n_routed_experts)
  for i in range(cfg.num_hidden_layers):
    p, base = f"model.layers.{i}.", ("layers", i)
    for proj in "qkvo":
      yield base + ("self_attn", f"{proj}_proj", "kernel"), \
          lambda n=f"{p}self_attn.{proj}_proj.weight": kernel(n)
    for norm in ("input_layernorm", "post_attention_layernorm"):
      yield base + (norm, "weight"), lambda n=f"{p}{norm}.weight": f32(n)
    if not cfg.is_moe_layer(i):
      for proj in ("gate_proj", "up_proj", "down_proj"):
        yield base + ("mlp", proj, "kernel"), lambda n=f"{p}mlp.{proj}.weight": kernel(n)
      continue
    yield base + ("mlp", "gate"), lambda n=f"{p}mlp.gate.weight": kernel(n)
    for ours, theirs, axis in (("experts_gate", "gate_proj", 1), ("experts_up", "up_proj", 1),
                               ("experts_down", "down_proj", 0)):
      yield base + ("mlp", ours), lambda t=theirs, a=axis, p=p: np.stack(
          [_pad(kernel(f"{p}mlp.experts.{e}.{t}.weight"), a, width) for e in experts])
    if cfg.n_shared_experts:
      for proj in ("gate_proj", "up_proj", "down_proj"):
        yield base + ("mlp", "shared_experts", proj, "kernel"), \
            lambda n=f"{p}mlp.shared_experts.{proj}.weight": kernel(n)


def hf_to_params(cfg: ModelConfig, directory) -> dict:
  """Loads and validates an HF checkpoint into an fp8jax params dict (float32)."""
  ckpt = HFCheckpoint(directory)
  ckpt.validate(cfg)
  params: dict = {}
  for path, build in param_builders(cfg, ckpt):
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = build()
  return params


def params_to_hf(cfg: ModelConfig, params: dict, directory, *, dtype=np.float32,
                 shard_tensors: int = 500) -> None:
  """Writes ``params`` as HF safetensors shards plus index and config.json."""
  config = config_to_hf(cfg)  # refuses what HF cannot compute before writing anything
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  f = cfg.moe_intermediate_size

  def tensor(name: str) -> np.ndarray:
    parts = name.split(".")
    if name == "model.embed_tokens.weight":
      return np.asarray(params["embed_tokens"]["embedding"])
    if name == "model.norm.weight":
      return np.asarray(params["norm"]["weight"])
    if name == "lm_head.weight":
      return np.asarray(params["lm_head"]["kernel"]).T
    layer = params["layers"][int(parts[2])]
    rest = parts[3:]
    if rest[0].endswith("layernorm"):
      return np.asarray(layer[rest[0]]["weight"])
    if rest[0] == "self_attn":
      return np.asarray(layer["self_attn"][rest[1]]["kernel"]).T
    mlp = layer["mlp"]
    if rest[1] == "gate":
      return np.asarray(mlp["gate"]).T
    if rest[1] == "experts":
      stacked = np.asarray(mlp[{"gate_proj": "experts_gate", "up_proj": "experts_up",
                                "down_proj": "experts_down"}[rest[3]]][int(rest[2])])
      stacked = stacked[:f] if rest[3] == "down_proj" else stacked[:, :f]
      return stacked.T
    if rest[1] == "shared_experts":
      return np.asarray(mlp["shared_experts"][rest[2]]["kernel"]).T
    return np.asarray(mlp[rest[1]]["kernel"]).T

  shapes = list(hf_tensor_shapes(cfg).items())
  shards = [shapes[i:i + shard_tensors] for i in range(0, len(shapes), shard_tensors)]
  weight_map = {}
  for n, shard in enumerate(shards):
    fname = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
    st.write(directory / fname, [(k, s, dtype) for k, s in shard], tensor,
             metadata={"format": "pt"})
    weight_map.update({k: fname for k, _ in shard})
  (directory / "model.safetensors.index.json").write_text(
      json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
  (directory / "config.json").write_text(json.dumps(config, indent=1))
