"""`deployctl init` and `deployctl plan`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from deployctl.cli.params import CONFIG, JSON, one_of
from deployctl.cli._app import app, err_console, escape, out_console, print_json



@app.command()
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
    err_console.print(f"wrote {out}; next: `{cmd}`{why}", markup=False)


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


@app.command()
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
    as_json: bool = JSON,
) -> None:
    """Capacity plan: weights, KV bytes/token, KV pool, max concurrency; fits or not. Exit 1 when not."""
    from deployctl.capacity import verdict
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
                             num_gpu_blocks_override=num_gpu_blocks_override, device=device)
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
    sized = size_plan(engine, model_dir, model_config=model_config, dtype=dtype or (cfg.model.dtype if cfg else "auto"),
                      gpu_memory=gpu_bytes)
    p = sized.plan
    status, message = verdict(p)
    if as_json:
        print_json({**p.to_json(), "status": status, "message": message, "notes": sized.notes})
    else:
        _print_plan(sized, status, message)
    if not p.fits:
        raise typer.Exit(1)


def _print_plan(sized, status: str, message: str) -> None:
    from rich.table import Table

    from deployctl.config.units import format_bytes

    p, inp = sized.plan, sized.inputs
    table = Table(title="capacity plan", show_header=True)
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
        table.add_row("runtime overhead", format_bytes(inp.runtime_overhead_bytes), "activations, CUDA context")
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
