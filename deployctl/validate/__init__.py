"""`deployctl validate`: the go-live validation layers against a running service (the router or one host).

- ``functional``  short, long and at-the-limit requests, multi-turn chat, the documented 400s, streaming and not;
  every answer checked for truncation, errors, invalid UTF-8 and degenerate repetition (functional.py)
- ``latency``     the bench ladder with deploy.yaml's SLOs: the knee and the recommendation (latency.py)
- ``stability``   sustained load at a share of the knee, the runtime's metrics sampled over time (stability.py)
- ``report``      the JSON document and a self-contained Markdown page with inline SVG plots (report.py)

Layer results share one shape (result.LayerResult). Lower layers only: bench, rollout's output rules; the CLI prints.
"""
