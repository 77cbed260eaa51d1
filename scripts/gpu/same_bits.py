"""Are two training runs the same bit for bit? Losses per logged step and checkpoint digests.

    python scripts/gpu/same_bits.py RUN_A RUN_B [--json=OUT.json]

Prints, for the steps both runs logged: how many losses (LM loss, training objective,
gradient norm) are equal, the first step where they differ and the largest relative
difference; for the checkpoints both saved: whether every array digest
(``fp8jax/train/checkpoint_digest.py``, recorded in each checkpoint's ``meta`` item) is
equal, and the number of arrays that differ. Exit status 0 when everything is equal, else 1.
"""

import json
import math
import pathlib
import sys

KEYS = ("loss", "lm_loss", "grad_norm")


def metrics(run: pathlib.Path) -> dict[int, dict]:
  rows = {}
  for line in (run / "metrics.jsonl").read_text().splitlines():
    if line.strip():
      r = json.loads(line)
      if "step" in r and "loss" in r:
        rows[int(r["step"])] = r
  return rows


def digests(run: pathlib.Path) -> dict[int, dict]:
  out = {}
  for meta in sorted((run / "checkpoints").glob("*/meta/metadata")):
    step = int(meta.parent.parent.name)
    out[step] = json.loads(meta.read_text())["digests"]["arrays"]
  return out


def compare(a: pathlib.Path, b: pathlib.Path) -> dict:
  ma, mb = metrics(a), metrics(b)
  steps = sorted(set(ma) & set(mb))
  res = {"runs": [str(a), str(b)], "steps": len(steps), "losses": {}}
  for k in KEYS:
    pairs = [(s, ma[s].get(k), mb[s].get(k)) for s in steps if k in ma[s] and k in mb[s]]
    diff = [(s, x, y) for s, x, y in pairs if x != y]
    rel = [abs(x - y) / max(abs(y), 1e-30) for _, x, y in diff
           if isinstance(x, float) and isinstance(y, float) and math.isfinite(x - y)]
    res["losses"][k] = {"equal": len(pairs) - len(diff), "of": len(pairs),
                        "first_diff_step": diff[0][0] if diff else None,
                        "max_rel_diff": max(rel) if rel else 0.0}
  da, db = digests(a), digests(b)
  res["checkpoints"] = {}
  for s in sorted(set(da) & set(db)):
    differ = sorted(k for k in da[s] if da[s][k] != db[s].get(k))
    res["checkpoints"][s] = {"arrays": len(da[s]), "differ": len(differ),
                             "first": differ[:3]}
  res["same"] = (all(v["equal"] == v["of"] for v in res["losses"].values())
                 and all(v["differ"] == 0 for v in res["checkpoints"].values())
                 and bool(res["checkpoints"]))
  return res


def main():
  args = [x for x in sys.argv[1:] if not x.startswith("--json=")]
  out = [x[len("--json="):] for x in sys.argv[1:] if x.startswith("--json=")]
  res = compare(pathlib.Path(args[0]), pathlib.Path(args[1]))
  print(json.dumps(res, indent=1))
  if out:
    pathlib.Path(out[0]).write_text(json.dumps(res, indent=1))
  sys.exit(0 if res["same"] else 1)


if __name__ == "__main__":
  main()
