"""Load ladder against an OpenAI-compatible streaming server: TTFT, TPOT, ITL and E2E percentiles per
concurrency level, errors per reason, goodput, and the knee.

Modules: workload (requests from JSONL or seeded synthetic lengths), client (one streaming request, timed),
ladder (levels of concurrency, optional Poisson arrivals), stats (percentiles, TPOT, goodput), knee,
overhead (the load generator's own cost against a trivial in-process server), plot (matplotlib, lazy).
Depends on httpx only (and deployctl.promhist for server-side histograms).
"""
