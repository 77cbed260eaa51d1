"""The quantization decisions of a ``PrecisionPolicy`` as the model made them before the
rule engine (a test-only reference): a site's spec by a loop over the site rules (later
rules override), and the GEMM recipe per layer (every linear layer and the routed experts
of a covered layer; none on layers outside ``gemm_layers`` or in the BF16 tail).

It has the interface of :class:`fp8jax.models.policy_rules.Decisions`, so a test can put
it in place of the engine's answers and compare the model's outputs bit for bit.
"""


class LegacyDecisions:
  """The pre-engine decisions of ``policy`` on a model of ``num_layers`` layers."""

  def __init__(self, policy, num_layers: int):
    self.policy, self.num_layers = policy, num_layers

  def site(self, site: str, layer: int):
    spec = None
    for rule in self.policy.rules:
      if rule.site == site and (rule.layers is None or layer in rule.layers):
        spec = rule.spec
    return spec

  def layer_gemm(self, layer: int):
    p = self.policy
    if p.gemm is None:
      return None
    outside = p.gemm_layers is not None and layer not in p.gemm_layers
    if outside or layer >= self.num_layers - p.bf16_tail_layers(self.num_layers):
      return None
    return p.gemm

  def gemm(self, path: str, op: str = "dot_general"):
    del op  # every GEMM of a covered layer ran the recipe
    parts = path.split("/")
    assert parts[0] == "layers", path
    return self.layer_gemm(int(parts[1]))
