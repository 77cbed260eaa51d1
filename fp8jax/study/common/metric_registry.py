"""The metrics of the study's report, each registered once (:data:`METRICS`).

A :class:`Metric` has its name, a one-line doc with its units, its scale (:data:`LOG`:
positive quantities such as norms and relative errors, summarized by geometric means and
intervals of the logs; :data:`LINEAR`: signed ones such as cosines, shares and fractions,
and losses, summarized by arithmetic means), the columns it is written as and where the
report uses it: the summary table, against the noise floor, as a branch-off predictor, in
the figures, as a conditioning signal, as a branch outcome, per expert. ``bf16`` in a name
or doc is the reference (the model's baseline, in its own precision: BF16 for DeepSeek-MoE,
FP32 for a model that computes in FP32; the report's labels say "reference").

The views the report reads keep the registry's order (its tables' column order):
:func:`summary_names`, :func:`floor_names`, :func:`predictors`, :func:`signals`,
:func:`flag_signals`, :func:`telemetry`, :func:`outcomes`, :func:`expert_names`,
:func:`positive_names`.
Lookups (:func:`get`, :func:`is_positive`) read a name by its last ``/`` component, so
``module/attn_o/rel_err`` and ``moe/rel_err`` are ``rel_err``; :func:`column_metric` also
checks that a ``rows.jsonl`` column has one of its metric's column forms. An unknown name
raises KeyError naming it and the registered ones.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import re

LOG, LINEAR = "log", "linear"
"""The scales: positive quantities (log) and signed ones (linear)."""
ALWAYS, EXTRA = "always", "extra"
"""Branch-off predictors tested always, or when the sweep has them."""

BARE = ("{}",)
"""Column forms (``{}``: the name, ``*``: one group key): the bare name in ``rows.jsonl``."""
GROUPED = ("{}", "module/*/{}", "group/*/{}", "layer/*/{}")
"""The bare name and one column per module, coarse group and layer (``metrics.flat_row``)."""
ROUTING = ("routing/*/{}",)
"""One column per MoE layer."""
TEL = ("tel/{}",)
"""A field of the GEMM operand telemetry (``tel/<name>``)."""


@dataclasses.dataclass(frozen=True)
class Metric:
  """One metric of the report.

  Attributes:
    name: the name (the last ``/`` component of its columns).
    doc: what it is, one line, with its units.
    scale: :data:`LOG` or :data:`LINEAR`.
    label: the short description the report gives it (the conditioning table's header,
      the predictor and outcome labels and their axes); "" when it has none.
    columns: its ``rows.jsonl`` column forms (:data:`BARE`, :data:`GROUPED`,
      :data:`ROUTING`, :data:`TEL`); () when not a rows column.
    baseline: a field of ``baseline.jsonl``.
    summary: a column of the per-policy summary table.
    floor: reported as a multiple of the noise floor's.
    predictor: a branch-off predictor: "" (no), :data:`ALWAYS` or :data:`EXTRA`.
    figures: the figures that plot it (``<name>.png``).
    signal: a conditioning signal per checkpoint.
    flag: a signal that flags a checkpoint (a spike).
    outcome: an outcome of a branch-off line.
    expert: a gradient metric per expert (``by_expert`` of ``details.jsonl``, the report's
      section on experts).
  """

  name: str
  doc: str
  scale: str
  label: str = ""
  columns: tuple[str, ...] = ()
  baseline: bool = False
  summary: bool = False
  floor: bool = False
  predictor: str = ""
  figures: tuple[str, ...] = ()
  signal: bool = False
  flag: bool = False
  outcome: bool = False
  expert: bool = False

  @property
  def positive(self) -> bool:
    """Whether it is summarized on the log scale."""
    return self.scale == LOG

  @property
  def key(self) -> str:
    """The name the report keys its values by: ``tel/<name>`` for telemetry, else name."""
    return TEL[0].format(self.name) if self.columns == TEL else self.name


M = Metric
METRICS: tuple[Metric, ...] = (
    # The paired gradient comparison (fp8jax.metrics.compare_grads): one value per row, per
    # module, coarse group and layer. Norms in loss units per parameter unit; experts no
    # token chose count as zero (union).
    M("rel_err", "||g_fp8 - g_bf16|| / ||g_bf16|| (dimensionless)", LOG,
      "one-step relative gradient error", GROUPED, summary=True, floor=True, expert=True,
      predictor=ALWAYS, figures=("grad_error", "loss_vs_grad", "format_width", "noise_floor",
                                 "trajectory")),
    M("diff_norm", "||g_fp8 - g_bf16||", LOG, columns=GROUPED, summary=True, expert=True,
      figures=("grad_error", "heatmaps")),
    M("cosine", "cosine of g_fp8 and g_bf16 (NaN when either is 0)", LINEAR,
      columns=GROUPED, summary=True, expert=True),
    M("loss_rel_err", "|loss_fp8 - loss_bf16| / |loss_bf16| (dimensionless)", LOG,
      columns=BARE, summary=True, floor=True, figures=("loss_vs_grad",)),
    M("share_direct", "share of ||g_fp8 - g_bf16||^2 in the directly quantized parameters",
      LINEAR, "direct share of the perturbation", BARE, summary=True, predictor=ALWAYS,
      figures=("migration", "trajectory")),
    M("diff_norm_intersection", "||g_fp8 - g_bf16|| over the experts both passes chose", LOG,
      columns=GROUPED),
    M("rel_err_intersection", "diff_norm_intersection / ||g_bf16|| over the same experts",
      LOG, columns=GROUPED),
    M("norm_bf16", "||g_bf16||", LOG, columns=GROUPED),
    M("norm_fp8", "||g_fp8||", LOG, columns=GROUPED),
    M("loss_abs_err", "|loss_fp8 - loss_bf16| (nats per token)", LOG, columns=BARE),
    M("loss_bf16", "the BF16 LM + balance loss (nats per token)", LINEAR, columns=BARE,
      figures=("loss_curves",)),
    M("loss_fp8", "the policy's LM + balance loss (nats per token)", LINEAR, columns=BARE,
      figures=("loss_curves",)),
    M("lm_loss_fp8", "the policy's LM loss (nats per token)", LINEAR, columns=BARE),
    M("aux_loss_fp8", "the policy's balance loss (0 without one)", LINEAR, columns=BARE),
    M("diff_norm_direct", "||g_fp8 - g_bf16|| over the directly quantized parameters", LOG,
      columns=BARE),
    M("diff_norm_other", "||g_fp8 - g_bf16|| over the other parameters", LOG, columns=BARE),
    M("share_direct_intersection", "share_direct over the experts both passes chose",
      LINEAR, columns=BARE),
    # Routing, per MoE layer (fp8jax.metrics.routing_divergence; a: BF16, b: the policy).
    M("topk_set_diff_frac", "fraction of tokens whose top-k expert set differs", LINEAR,
      columns=ROUTING, figures=("routing",)),
    M("n_only_a", "experts that only the BF16 pass chose (count)", LINEAR, columns=ROUTING),
    M("n_only_b", "experts that only the policy's pass chose (count)", LINEAR,
      columns=ROUTING),
    M("expert_tokens", "tokens the reference pass routed to an expert, per batch (count; "
      "details.jsonl)", LINEAR, "tokens"),
    M("routing", "a row's topk_set_diff_frac, mean over the MoE layers (fraction)", LINEAR,
      "one-step routing divergence", predictor=ALWAYS, figures=("trajectory",)),
    M("floor_multiple", "rel_err / the noise floor's on the same batch, geometric mean", LOG,
      "one-step rel_err / noise floor", predictor=EXTRA),
    # Conditioning of a checkpoint: the BF16 baseline (baseline.jsonl) and the noise floor.
    M("loss", "the BF16 LM + balance loss of a batch (nats per token)", LINEAR,
      "reference loss", baseline=True, predictor=EXTRA, signal=True),
    M("grad_norm", "||g_bf16|| of a batch (loss units per parameter unit)", LOG,
      "reference gradient norm", baseline=True, predictor=EXTRA, signal=True, flag=True),
    M("lm_loss", "the BF16 LM loss of a batch (nats per token)", LINEAR, baseline=True),
    M("aux_loss", "the BF16 balance loss of a batch (0 without one)", LINEAR, baseline=True),
    M("floor_rel_err", "the noise floor's rel_err at a checkpoint (dimensionless)", LOG,
      "floor rel_err", predictor=EXTRA, signal=True, flag=True),
    M("perturbation_norm", "||w_perturbed - w|| of the floor's perturbation (floor rows)",
      LOG, columns=BARE),
    M("curvature", "diff_norm / perturbation_norm of the floor: a Hessian-vector product's "
      "norm (floor rows)", LOG, "floor curvature", BARE, predictor=EXTRA, signal=True,
      flag=True),
    # Block-scale telemetry of the GEMM recipes' forward operands (fp8jax.gemm.
    # operand_telemetry), over every recorded operand.
    M("saturated_frac", "fraction of blocks with an element the saturating cast clips",
      LINEAR, "blocks saturating", TEL, predictor=EXTRA),
    M("underflow_frac", "fraction of blocks with a nonzero element flushed to zero", LINEAR,
      "blocks underflowing", TEL, predictor=EXTRA),
    M("zero_block_frac", "fraction of all-zero blocks", LINEAR, "all-zero blocks", TEL,
      predictor=EXTRA),
    M("scale_subnormal_frac", "fraction of blocks whose NVFP4 block scale (E4M3, UE5M3) is "
      "subnormal", LINEAR, "blocks with a subnormal scale", TEL, predictor=EXTRA),
    M("scale_zero_frac", "fraction of nonzero blocks whose NVFP4 block scale rounds to 0",
      LINEAR, "blocks with a zero scale", TEL, predictor=EXTRA),
    M("four_frac", "fraction of Four Over Six's nonzero finite blocks scaled to 4, not 6",
      LINEAR, "blocks Four Over Six scaled to 4", TEL, predictor=EXTRA),
    M("oas_raised_frac", "fraction of OAS's nonzero finite blocks with a scale a binade "
      "above the OCP rule's", LINEAR, "blocks OAS raised a binade", TEL, predictor=EXTRA),
    M("kurtosis", "E[q^4] / E[q^2]^2 of the dequantized operands (3: Gaussian)", LINEAR,
      "kurtosis of the quantized activations", TEL, predictor=EXTRA),
    M("scale_log2_p05", "floor(log2) of the blocks' dequantization scale, 5th percentile",
      LINEAR, "log2 block scale, 5th percentile", TEL, predictor=EXTRA),
    M("scale_log2_p50", "floor(log2) of the blocks' dequantization scale, median", LINEAR,
      "log2 block scale, median", TEL, predictor=EXTRA),
    M("scale_log2_p95", "floor(log2) of the blocks' dequantization scale, 95th percentile",
      LINEAR, "log2 block scale, 95th percentile", TEL, predictor=EXTRA),
    # Outcomes of a branch-off line after K steps, against the BF16 branch.
    M("param_div", "||theta - theta_bf16|| / ||theta_bf16|| after K steps", LOG,
      "K-step parameter divergence", outcome=True, figures=("trajectory",)),
    M("loss_gap", "relative loss gap, mean over the last steps (dimensionless, signed)",
      LINEAR, "K-step relative loss gap", outcome=True, figures=("trajectory",)),
    M("update_cos", "cosine of the updates with the BF16 branch's, mean over the steps",
      LINEAR, "mean update cosine", outcome=True),
    M("routing_div", "fraction of tokens whose top-k set differs at step K", LINEAR,
      "routing divergence at K", outcome=True),
    M("growth_rate", "slope of log(param_div) per step (1/step)", LINEAR,
      "divergence growth rate (per step)", outcome=True),
)
"""Every metric of the report, in the order of its tables."""
del M

_BY_NAME = {m.name: m for m in METRICS}


def get(name: str) -> Metric:
  """The metric of a name or column (read by its last ``/`` component).

  Raises:
    KeyError: the name is not registered (the message lists the registered ones).
  """
  base = name.rsplit("/", 1)[-1]
  if base not in _BY_NAME:
    read = "" if base == name else f" (read as {base!r})"
    raise KeyError(f"metric {name!r}{read} is not registered in "
                   f"fp8jax.study.common.metric_registry; registered: {', '.join(_BY_NAME)}")
  return _BY_NAME[base]


def is_positive(name: str) -> bool:
  """Whether a metric (``rel_err``, ``module/attn_o/rel_err``) is summarized on the log
  scale; KeyError for an unregistered one."""
  return get(name).positive


def _form(form: str, name: str) -> re.Pattern:
  return re.compile(re.escape(form.format(name)).replace(r"\*", "[^/]+"))


def column_metric(column: str) -> Metric:
  """The metric of a ``rows.jsonl`` column, which must have one of its column forms.

  Raises:
    KeyError: the metric is unregistered, or is not written as this column.
  """
  m = get(column)
  if not any(_form(f, m.name).fullmatch(column) for f in m.columns):
    forms = ", ".join(f.format(m.name) for f in m.columns) or "no rows.jsonl column"
    raise KeyError(f"column {column!r}: metric {m.name!r} is registered as {forms}")
  return m


def positive_names() -> frozenset[str]:
  """The names of the metrics on the log scale."""
  return frozenset(m.name for m in METRICS if m.positive)


def summary_names() -> tuple[str, ...]:
  """The columns of the per-policy summary table."""
  return tuple(m.name for m in METRICS if m.summary)


def floor_names() -> tuple[str, ...]:
  """The metrics reported as multiples of the noise floor's."""
  return tuple(m.name for m in METRICS if m.floor)


def predictors(extra: bool = False) -> dict[str, str]:
  """``{key: label}`` of the branch-off predictors tested always (or, ``extra``, those
  tested when the sweep has them: a signal's label says "(checkpoint)", a telemetry
  field's starts "telemetry: ")."""
  want = EXTRA if extra else ALWAYS

  def label(m: Metric) -> str:
    return (f"{m.label} (checkpoint)" if m.signal else f"telemetry: {m.label}"
            if m.columns == TEL else m.label)
  return {m.key: label(m) for m in METRICS if m.predictor == want}


def signals() -> dict[str, str]:
  """``{name: label}`` of the conditioning signals per checkpoint."""
  return {m.name: m.label for m in METRICS if m.signal}


def flag_signals() -> tuple[str, ...]:
  """The signals that flag a checkpoint."""
  return tuple(m.name for m in METRICS if m.flag)


def telemetry() -> dict[str, str]:
  """``{name: label}`` of the telemetry fields (columns ``tel/<name>``)."""
  return {m.name: m.label for m in METRICS if m.columns == TEL}


def outcomes() -> dict[str, str]:
  """``{name: label}`` of the branch-off outcomes."""
  return {m.name: m.label for m in METRICS if m.outcome}


def expert_names() -> tuple[str, ...]:
  """The gradient metrics per expert (``by_expert`` of ``details.jsonl``)."""
  return tuple(m.name for m in METRICS if m.expert)


def plotted_in(figure: str) -> tuple[str, ...]:
  """The metrics a figure plots."""
  return tuple(m.name for m in METRICS if figure in m.figures)


def problems(metrics: Sequence[Metric] = METRICS) -> list[str]:
  """What is inconsistent in a registry ([] when nothing): duplicate names, a bad scale or
  predictor kind, a doc that is not one line, a column form without the name, a flag that
  is no signal, a label missing where the report shows one."""
  out, seen = [], set()
  for m in metrics:
    if m.name in seen or "/" in m.name or not m.name:
      out.append(f"{m.name!r}: a duplicate, empty or prefixed name")
    seen.add(m.name)
    if m.scale not in (LOG, LINEAR):
      out.append(f"{m.name}: scale {m.scale!r} is not {LOG!r} or {LINEAR!r}")
    if m.predictor not in ("", ALWAYS, EXTRA):
      out.append(f"{m.name}: predictor {m.predictor!r} is not '', {ALWAYS!r} or {EXTRA!r}")
    if not m.doc or "\n" in m.doc:
      out.append(f"{m.name}: the doc must be one line")
    if any("{}" not in f for f in m.columns):
      out.append(f"{m.name}: a column form lacks the name ({{}}): {m.columns}")
    if m.flag and not m.signal:
      out.append(f"{m.name}: flags checkpoints but is no signal")
    if not m.label and (m.predictor or m.signal or m.outcome or m.columns == TEL):
      out.append(f"{m.name}: a predictor, signal, outcome or telemetry field needs a label")
  return out
