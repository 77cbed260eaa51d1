"""The results table shared by the benchmark scripts: ``record`` stores a row in
``RESULTS`` (written to JSON by each script) and prints it."""

RESULTS: dict = {}


def record(name: str, **values) -> None:
  RESULTS[name] = values
  shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in values.items() if k != "times")
  print(f"{name}: {shown}", flush=True)
