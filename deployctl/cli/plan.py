"""`deployctl init` and `deployctl plan`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from deployctl.cli.params import CONFIG, JSON, one_of
from deployctl.cli._app import app, err_console, escape, out_console, print_json



@app.command(epilog="Example: deployctl init /models/llama-3-8b --out deploy.yaml")
def init(
    model_dir: Path = typer.Argument(..., help="HF model directory with config.json."),
    out: Path = typer.Option(Path("deploy.yaml"), "--out", "-o", help="Where to write deploy.yaml."),
    device: str = typer.Option("cuda", parser=one_of("--device", "cuda", "cpu"), help="cuda or cpu."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a commented deploy.yaml for MODEL_DIR with sensible defaults."""
    from deployctl.config import parse_config
    from deployctl.errors import UsageError
    from deployctl.capacity.initfile import render_init

    if out.exists() and not force:
        raise UsageError(f"{out} exists", fix="pass --force to overwrite it, or --out another path")
    text = render_init(model_dir, device=device)
    parse_config(text, str(out))  # what we write must load
    out.write_text(text)
    cmd, why = _next_step(out, device)
    # soft_wrap: the command is copied as printed; rich's 80-column wrap would cut a long path in two
    err_console.print(f"wrote {out}; next: `{cmd}`{why}", markup=False, soft_wrap=True)


def _next_step(out: Path, device: str) -> tuple[str, str]:
    """The plan command that works here (C33): on cuda without a GPU on this machine (no NVML), the target GPU's
    memory must be given."""
    if device == "cuda":
        from deployctl.capacity.sizing import gpu_memory_from_nvml
        from deployctl.errors import ConfigError

        try:
            gpu_memory_from_nvml(0)
        except ConfigError:
            return f"deployctl plan -c {out} --gpu-memory 80GiB", " (no GPU on this machine: give the target GPU's memory)"
    return f"deployctl plan -c {out}", ""


@app.command(epilog="Example: deployctl plan --gpu-memory 80GiB "
                     "--profile prompt=512/2048,output=256/1024,concurrency=64")
def plan(
    config: Path = CONFIG,
    model_config: Optional[Path] = typer.Option(None, "--model-config", help="config.json (or model dir) instead of model.path."),
    gpu_memory: Optional[str] = typer.Option(None, "--gpu-memory", help="GPU memory, e.g. 80GiB or 40GB (default: NVML)."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len"),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs"),
    gpu_memory_utilization: Optional[float] = typer.Option(None, "--gpu-memory-utilization"),
    block_size: Optional[int] = typer.Option(None, "--block-size"),
    num_gpu_blocks_override: Optional[int] = typer.Option(None, "--num-gpu-blocks-override"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="auto, float32, bfloat16 or float16."),
    device: Optional[str] = typer.Option(None, "--device", help="cuda or cpu."),
    kv_cache_dtype: Optional[str] = typer.Option(None, "--kv-cache-dtype", help="auto or fp8 (engine.kv_cache_dtype)."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Traffic: prompt=MEAN[/P90[/P99]],output=MEAN[/P90[/P99]],concurrency=N (or a JSON object / @file); sized at P99 where given, else P90."),
    from_log: Optional[Path] = typer.Option(None, "--from-log", help="Traffic from the runtime's access log (needs --concurrency)."),
    bench: Optional[Path] = typer.Option(None, "--bench", help="A `deployctl bench --json` result: its knee caps the sessions."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Peak concurrent requests (with --from-log or --bench)."),
    margin: Optional[float] = typer.Option(None, "--margin", help="Share of sessions kept free (capacity.margin, default 0.25)."),
    as_json: bool = JSON,
) -> None:
    """Capacity plan: weights, KV bytes/token, KV pool, max concurrency; fits or not. Exit 1 when not.
    With --profile / --from-log / --bench: sessions at the traffic profile, replicas and GPUs needed after the margin."""
    from deployctl.capacity.sizing import plan_json, plan_verdict
    from deployctl.config import EngineConfig, ModelConfig, load_config
    from deployctl.errors import ConfigError
    from deployctl.capacity.sizing import override_engine, size_plan
    from deployctl.config.units import parse_bytes

    dtypes = ModelConfig.model_fields["dtype"].annotation.__args__  # the values deploy.yaml and the runtime accept
    if dtype is not None and dtype not in dtypes:
        raise ConfigError(f"--dtype: {dtype!r} is not a dtype the runtime serves", fix=f"use one of: {', '.join(dtypes)}")
    # --model-config alone plans without deploy.yaml; with both, deploy.yaml's engine settings apply.
    cfg = load_config(config) if (model_config is None or config.exists()) else None
    engine = cfg.engine if cfg else EngineConfig()
    engine = override_engine(engine, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                             gpu_memory_utilization=gpu_memory_utilization, block_size=block_size,
                             num_gpu_blocks_override=num_gpu_blocks_override, device=device,
                             kv_cache_dtype=kv_cache_dtype)
    try:
        gpu_bytes = parse_bytes(gpu_memory) if gpu_memory is not None else None
    except ValueError as exc:
        raise ConfigError(f"--gpu-memory: {exc}") from None
    if gpu_bytes is not None and gpu_bytes <= 0:
        raise ConfigError(f"--gpu-memory must be positive, got {gpu_memory!r}")
    if model_config is not None:
        model_dir = model_config if model_config.is_dir() else model_config.parent
    else:
        model_dir = Path(cfg.model.path)
    from deployctl.engines import adapter, standby_residue_bytes

    residue = standby_residue_bytes(cfg.model_copy(update={"engine": engine})) if cfg else 0
    sized = size_plan(engine, model_dir, model_config=model_config, dtype=dtype or (cfg.model.dtype if cfg else "auto"),
                      gpu_memory=gpu_bytes, standby_residue=residue,
                      standby_source=adapter(engine.kind).sleep.residue_source if residue else "")
    p = sized.plan
    status, message = plan_verdict(sized)
    traffic = _traffic(sized, cfg, profile, from_log, bench, concurrency, margin)
    if cfg and (cfg.server.max_prompt_tokens or cfg.server.max_completion_tokens):
        n = engine.max_model_len
        worst = min(n, (cfg.server.max_prompt_tokens or n - 1) + (cfg.server.max_completion_tokens or n))
        sized.notes.append(f"server caps: one request holds at most {worst} tokens of KV (max_prompt_tokens "
                           f"{cfg.server.max_prompt_tokens or '-'} + max_completion_tokens "
                           f"{cfg.server.max_completion_tokens or '-'}, at most max_model_len {n}): "
                           f"{p.kv_pool_tokens // worst if worst else 0} such requests fit at once")
    if traffic is not None and traffic.replicas_configured == 1:
        sized.notes.append("one host: a canary or a host failure takes the only replica; for production plan "
                           f"{(traffic.replicas_needed or 1) + 1} hosts (the replicas needed + 1 spare)")
    if as_json:
        doc = plan_json(sized, status, message)
        if traffic is not None:
            doc["traffic"] = traffic.to_json()
        print_json(doc)
    else:
        _print_plan(sized, status, message)
        if traffic is not None:
            _print_traffic(traffic)
        if cfg is not None and len(cfg.hosts) > 1 and cfg.router is not None:
            from deployctl.rollout.plan import config_schedule

            out_console.print("canary steps if deployed now: " + escape("; ".join(config_schedule(cfg))))
    if sized.weights_problem or not p.fits_one or (traffic is None and not p.fits) or (traffic is not None and not traffic.fits):
        raise typer.Exit(1)


def _traffic(sized, cfg, profile, from_log, bench, concurrency, margin):
    """The traffic plan from --profile / --from-log / --bench, or None when none is given."""
    import json

    from deployctl.capacity.traffic import knee_from_bench, parse_profile, plan_traffic, profile_from_log
    from deployctl.errors import ConfigError, UsageError

    if profile is None and from_log is None and bench is None:
        if concurrency is not None or margin is not None:
            raise UsageError("--concurrency/--margin need a traffic profile", fix="add --profile, --from-log or --bench")
        return None
    if profile is not None and from_log is not None:
        raise UsageError("--profile and --from-log both give the traffic", fix="pass one of them")
    if concurrency is not None and concurrency <= 0:
        raise ConfigError(f"--concurrency must be a positive number of requests, got {concurrency}", fix="pass --concurrency N, N >= 1")
    if margin is not None and not 0 <= margin < 1:
        raise ConfigError(f"--margin must be in [0, 1), got {margin:g}", fix="e.g. --margin 0.25 (the guides' 20–30%)")
    knee = None
    if bench is not None:
        try:
            doc = json.loads(bench.read_text())
        except FileNotFoundError:
            raise ConfigError(f"--bench {bench}: no such file", fix="give the JSON `deployctl bench --json` wrote") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--bench {bench}:{exc.lineno}: invalid JSON: {exc.msg}") from None
        knee, _ = knee_from_bench(doc, f"--bench {bench}")
        knee = knee if knee is not None else 0  # even the first level broke the SLO
    if from_log is not None:
        try:
            text = from_log.read_text(errors="replace")
        except FileNotFoundError:
            raise ConfigError(f"--from-log {from_log}: no such file", fix="give the runtime's access log file") from None
        prof = profile_from_log(text, concurrency, f"--from-log {from_log}")
    elif profile is not None:
        spec = profile
        if spec.startswith("@"):
            try:
                spec = Path(spec[1:]).read_text()
            except FileNotFoundError:
                raise ConfigError(f"--profile {spec}: no such file", fix="give @FILE with a JSON profile, or the profile inline") from None
        prof = parse_profile(spec, concurrency)
    else:
        raise UsageError("--bench gives the knee, not the traffic", fix="add --profile (or --from-log) with the bench result")
    m = margin if margin is not None else (cfg.capacity.margin if cfg else 0.25)
    p = sized.plan
    return plan_traffic(pool_tokens=p.kv_pool_tokens, max_num_seqs=p.max_num_seqs, max_model_len=p.max_model_len,
                        tensor_parallel_size=sized.tensor_parallel_size, profile=prof, margin=m, knee=knee,
                        replicas_configured=len(cfg.hosts) if cfg else None,
                        max_prompt_tokens=cfg.server.max_prompt_tokens if cfg else None,
                        max_completion_tokens=cfg.server.max_completion_tokens if cfg else None)


def _print_traffic(t) -> None:
    from rich.table import Table

    table = Table(title=f"at the traffic profile ({t.profile.source})", show_header=True)
    table.add_column("item")
    table.add_column("value", justify="right")
    table.add_column("how")
    pr = t.profile
    prompt, output = pr.tail()
    table.add_row(f"tokens / session ({t.sized_at})", f"{t.tokens_per_session_tail:,.0f} (mean {t.tokens_per_session_mean:,.0f})",
                  f"{t.sized_at} prompt {prompt:g} + {t.sized_at} output {output:g}: the pool is sized at {t.sized_at}")
    table.add_row("sessions (KV)", f"{t.sessions_at_tail:.2f} (mean {t.sessions_at_mean:.2f})", "KV pool tokens / tokens per session")
    if t.knee is not None:
        table.add_row("bench knee", str(t.knee), "highest concurrency within the SLO")
    table.add_row("sessions / replica", f"{t.sessions_per_replica:.2f}", f"limited by {t.limited_by}")
    table.add_row("sessions / GPU", f"{t.sessions_per_gpu:.2f}", "per replica / tensor_parallel_size")
    table.add_row("usable / replica", str(t.usable_per_replica), f"× (1 − margin {t.margin:g}), floor")
    table.add_row("replicas needed", str(t.replicas_needed) if t.replicas_needed else "-", f"peak {pr.peak_concurrency} / usable")
    table.add_row("GPUs needed", str(t.gpus_needed) if t.gpus_needed else "-", "replicas × tensor_parallel_size")
    out_console.print(table)
    color = "green" if t.fits else "red"
    out_console.print(f"[{color}]{'fits' if t.fits else 'does not fit'} at the profile[/]: {escape(t.message)}")


def _print_plan(sized, status: str, message: str) -> None:
    from rich.table import Table

    from deployctl.config.units import format_bytes

    p, inp = sized.plan, sized.inputs
    table = Table(title=f"capacity plan (per GPU, tensor_parallel_size {sized.tensor_parallel_size})", show_header=True)
    table.add_column("item")
    table.add_column("value", justify="right")
    table.add_column("how")
    shape = sized.shape
    table.add_row("KV bytes / token", f"{p.kv_bytes_per_token:,} ({format_bytes(p.kv_bytes_per_token)})",
                  f"2 × {shape.num_hidden_layers} layers × {shape.num_key_value_heads} kv heads × {shape.head_dim} head_dim × {inp.dtype_bytes} B")
    table.add_row("KV / request", format_bytes(p.kv_bytes_per_request), f"× max_model_len {p.max_model_len}")
    table.add_row("KV / all requests", format_bytes(p.kv_bytes_all_requests), f"× max_num_seqs {p.max_num_seqs}")
    table.add_row("weights", format_bytes(p.weights_bytes), sized.weights_source)
    if inp.gpu_memory_bytes:
        table.add_row("GPU memory", format_bytes(inp.gpu_memory_bytes), f"{sized.gpu_memory_source}, × {inp.gpu_memory_utilization}")
        r = sized.reserve
        if r is None:
            table.add_row("runtime overhead", format_bytes(inp.runtime_overhead_bytes), "engine.runtime_overhead (the runtime measures its own)")
        else:
            table.add_row("activation peak", format_bytes(r.activation_peak), "max_num_batched_tokens forward + sampler logits")
            table.add_row("CUDA graphs", format_bytes(r.cudagraph), f"{r.num_capture_sizes} capture sizes" if r.num_capture_sizes else "enforce_eager: none")
            table.add_row("non-torch", format_bytes(r.non_torch), "cuBLAS/sampler workspaces")
            table.add_row("CUDA context + NCCL", format_bytes(r.outside), "outside the engine's share")
        table.add_row("peak need", format_bytes(p.peak_bytes), "weights + overhead + KV for all requests")
    table.add_row("KV pool", format_bytes(p.kv_pool_bytes), p.budget_source)
    table.add_row("KV pool tokens", f"{p.kv_pool_tokens:,}", f"{p.num_blocks:,} blocks × {p.block_size}")
    table.add_row("max concurrency", f"{p.max_concurrency:.2f}", "pool tokens / max_model_len")
    table.add_row("largest max_model_len", f"{p.max_feasible_model_len:,}", "one request alone")
    table.add_row("largest max_num_seqs", f"{p.max_feasible_num_seqs}", "at max_model_len")
    out_console.print(table)
    color = {"pass": "green", "warn": "yellow", "fail": "red"}[status]
    out_console.print(f"[{color}]{'fits' if p.fits else 'does not fit'}[/]: {escape(message)}")
    for note in sized.notes:
        out_console.print(f"note: {escape(note)}")
