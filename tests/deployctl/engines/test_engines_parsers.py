"""The rendered vLLM and SGLang command lines are accepted by the engines' own argument parsers, every modelled
setting arrives with its value, and a flag the engine does not have is refused (exit 2). The pinned vllm and
sglang live in .venv-engines (tests/setup_test_venvs.sh: torch 2.13.0 CPU, the engines with --no-deps, the light packages
their parsers import); each engine's parser runs once per test in a subprocess (importing vLLM takes ~10-30 s
here). The adapters' metric names are checked against the names the installed packages define."""
from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from deployctl.config import load_config, parse_config
from deployctl.engines import adapter
from deployctl.engines.base import Flag, Switch
from deployctl.engines.base import DEFAULT_UNRENDERED
from deployctl.engines.command import setting_values
from deployctl.config import layout
from deployctl.render import render_all
from support import paths

REPO = paths.REPO
ENGINES_PY = REPO / ".venv-engines" / "bin" / "python"
SITE = next((REPO / ".venv-engines" / "lib").glob("python3*/site-packages"), None) if ENGINES_PY.exists() else None
DATA = REPO / "tests" / "data" / "engines"
HELPER = paths.REPO / "tests" / "support" / "engine_argparse.py"
KEY = {"LLM_API_KEY": "sk-parsers-0123456789abcdef"}


def _require_venv():
    if not ENGINES_PY.exists():
        pytest.fail(".venv-engines is missing: run `bash tests/setup_test_venvs.sh` (it installs the pinned vllm and sglang)")


def _parse(kind: str, commands: list[list[str]]) -> list[dict]:
    _require_venv()
    r = subprocess.run([str(ENGINES_PY), str(HELPER), kind], input=json.dumps(commands), capture_output=True,
                       text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "VLLM_TARGET_DEVICE": "cpu",
                                                    "HOME": str(REPO / ".venv-engines")})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _engine_args(kind: str, argv: list[str]) -> list[str]:
    """The arguments the engine's parser sees: after ``serve`` (vLLM, kept: the parser has the subcommand), after
    the module name (SGLang)."""
    if kind == "vllm":
        return argv[argv.index("serve"):]  # after `python -m vllm.entrypoints.cli.main` or the `vllm` script
    return argv[argv.index("sglang.launch_server") + 1:]


def _variants(kind: str) -> list:
    """The golden config plus flips of every switch and a one-GPU host, as DeployConfigs."""
    base = yaml.safe_load((DATA / f"deploy-{kind}.yaml").read_text())
    out = [load_config(DATA / f"deploy-{kind}.yaml")]
    flipped = dict(base, engine={**base["engine"], "enable_prefix_caching": not base["engine"]["enable_prefix_caching"],
                                 "enable_chunked_prefill": not base["engine"]["enable_chunked_prefill"],
                                 "tensor_parallel_size": 1, "extra_args": [], "gpu_memory_utilization": 0.5,
                                 "block_size": 32 if kind == "vllm" else 16, "max_model_len": 4096,
                                 "kv_cache_dtype": "fp8", "enforce_eager": not base["engine"].get("enforce_eager", False)},
                   server={**base["server"], "drain_timeout_s": 42.5})  # --shutdown-timeout 43: whole seconds
    out.append(parse_config(yaml.safe_dump(flipped), "flipped.yaml"))
    return out


def _rendered_commands(kind: str, tmp_path: Path) -> list[tuple[object, object, list[str]]]:
    """(config, host, argv) for every engine command in the rendered files: unit ExecStart, launch.sh's ENGINE_CMD,
    the k8s pod command and the compose entrypoint."""
    found = []
    for n, cfg in enumerate(_variants(kind)):
        for target in ("systemd", "container", "k8s-rollout"):
            out = tmp_path / f"{n}-{target}"
            render_all(cfg, out, target=target, release_id="r1", env=KEY)
            for h in cfg.hosts:
                d = out / "hosts" / h.name
                if target == "systemd":
                    unit = (d / f"{cfg.service.name}.service").read_text()
                    found.append((cfg, h, shlex.split(re.search(r"^ExecStart=(.*)$", unit, re.M).group(1))))
                    launch = (d / "launch.sh").read_text()
                    found.append((cfg, h, shlex.split(re.search(r"^ENGINE_CMD=\((.*)\)$", launch, re.M).group(1))))
                elif target == "container":
                    found.append((cfg, h, yaml.safe_load((d / "compose.yaml").read_text())["services"]["runtime"]["entrypoint"]))
            if target == "k8s-rollout":
                pod = yaml.safe_load((out / "k8s" / "rollout.yaml").read_text())["spec"]["template"]["spec"]
                found.append((cfg, cfg.hosts[0], pod["containers"][0]["command"]))
    return found


def _expected(cfg, host, port: int) -> dict[str, object]:
    """option spelling -> the value the engine must have parsed for it (from the adapter and deploy.yaml)."""
    a = adapter(cfg.engine.kind)
    values = setting_values(cfg, host, port)
    want: dict[str, object] = {}
    for setting, spell in a.flags.items():
        if setting in DEFAULT_UNRENDERED and values[setting] == DEFAULT_UNRENDERED[setting]:
            continue  # not rendered at its default
        if isinstance(spell, Flag) and spell.only_if and not values[spell.only_if]:
            continue  # not rendered (e.g. SGLang's chunk size with chunked prefill off)
        if isinstance(spell, Switch):
            flag = spell.on if values[setting] else spell.off
            if flag and "=" in flag:
                want[flag.split("=")[0]] = flag.split("=", 1)[1]
            elif flag:
                want[flag] = not flag.startswith("--no-")
        elif isinstance(spell, Flag) and not spell.positional:
            want[spell.name] = (spell.values or {}).get(values[setting], values[setting])
    return want


def _same(parsed, rendered) -> bool:
    if isinstance(parsed, list):
        return [str(x) for x in parsed] == [str(rendered)]
    if isinstance(parsed, bool) or isinstance(rendered, bool):
        return parsed == rendered
    if isinstance(parsed, (int, float)):
        return float(parsed) == float(rendered)
    return str(parsed) == str(rendered)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_rendered_commands_parse_with_every_value(tmp_path, kind):
    found = _rendered_commands(kind, tmp_path)
    assert len(found) >= 8
    bad_flag = ["--max-num-seqs", "64x"] if kind == "vllm" else ["--max-running-requests", "64x"]
    results = _parse(kind, [_engine_args(kind, argv) for _, _, argv in found]
                     + [_engine_args(kind, found[0][2]) + bad_flag,
                        _engine_args(kind, found[0][2]) + ["--no-such-flag-deployctl"],
                        # issue 44: fp8 KV scales calculated at start: vLLM 0.33 has no such flag (deployctl does
                        # not render one; the plan says where the scales come from)
                        _engine_args(kind, found[0][2]) + ["--calculate-kv-scales"]])
    *good, typo_value, unknown_flag, kv_scales = results
    if kind == "vllm":
        assert not kv_scales["ok"] and "unrecognized arguments: --calculate-kv-scales" in kv_scales["error"]
    for (cfg, host, argv), res in zip(found, good):
        assert res["ok"], (argv, res)
        for option, value in _expected(cfg, host, layout.service_port(cfg, host)).items():  # no per-host ports here
            assert option in res["options"], (option, "not parsed from", argv)
            dest, parsed = res["options"][option]
            assert _same(parsed, value), (option, dest, parsed, value)
        if kind == "vllm":
            assert res["positional"] == cfg.model.path
            # the drain: vLLM's parser reads --shutdown-timeout (default 0 = abort in-flight requests on SIGTERM)
            # as server.drain_timeout_s in whole seconds, on every rendered start (unit, launch.sh, compose, pod)
            assert res["options"]["--shutdown-timeout"] == ["shutdown_timeout", math.ceil(cfg.server.drain_timeout_s)]
        else:  # SGLang: max_num_batched_tokens is the prefill chunk, or chunked prefill is off (-1)
            want = cfg.engine.max_num_batched_tokens if cfg.engine.enable_chunked_prefill else -1
            assert res["options"]["--chunked-prefill-size"] == ["chunked_prefill_size", want], res["options"]
            assert "--max-prefill-tokens" not in res["options"]
        for extra in cfg.engine.extra_args:  # engine.extra_args reach the engine's parser as they are
            assert extra.split("=")[0] in res["options"], extra
    assert not typo_value["ok"] and typo_value["exit"] == 2 and "64x" in typo_value["error"]
    assert not unknown_flag["ok"] and unknown_flag["exit"] == 2 and "no-such-flag" in unknown_flag["error"]


def _metric_names_in_source(package: str) -> set[str]:
    """Every ``"<package>:name"`` string in the installed package's Python source (counters also as name_total,
    histograms also as name_count)."""
    names: set[str] = set()
    for path in (SITE / package).rglob("*.py"):
        for m in re.finditer(rf'"({package}:[a-z0-9_]+)"', path.read_text(errors="replace")):
            names.add(m.group(1))
    return names | {n + "_total" for n in names} | {n + "_count" for n in names}


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_adapter_metric_names_exist_in_the_installed_engine(kind):
    _require_venv()
    defined = _metric_names_in_source(kind)
    assert len(defined) > 20, "found no metric names: the source layout changed"
    a = adapter(kind)
    named = {role: n for role, n in a.metrics.names.items() if n}
    assert {"ttft", "e2e", "kv_usage", "waiting", "running"} <= set(named)
    if a.error_share:  # the counter the canary analysis judges the error share on (render.analysis)
        named["error_share"] = a.error_share.counter
    missing = {role: n for role, n in named.items() if n not in defined}
    assert not missing, f"{kind} {a.metrics.prefix}: names not defined by the installed package: {missing}"


def test_api_key_reaches_each_engine_the_way_its_source_reads_it():
    _require_venv()
    src = "\n".join(p.read_text(errors="replace") for p in (SITE / "vllm").rglob("*.py") if "VLLM_API_KEY" in p.read_text(errors="replace"))
    assert adapter("vllm").api_key_env == "VLLM_API_KEY" and "envs.VLLM_API_KEY" in src
    fields = (SITE / "sglang" / "srt" / "arg_groups" / "fields" / "serving.py").read_text()
    assert adapter("sglang").api_key_flag == "--api-key" and re.search(r"^\s+api_key: ", fields, re.M)


@pytest.mark.slow
def test_a_generic_server_declaration_of_vllm_parses_with_its_values(tmp_path):
    """engine.kind openai (issue 26): vLLM declared as a generic server, its {placeholders} filled from deploy.yaml,
    reaches vLLM's own parser with every value (the unit and launch.sh)."""
    base = yaml.safe_load((DATA / "deploy-vllm.yaml").read_text())
    command = ["{python}", "-m", "vllm.entrypoints.cli.main", "serve", "{model}", "--host", "{host}", "--port",
               "{port}", "--max-model-len", "{max_model_len}", "--tensor-parallel-size", "{tensor_parallel_size}",
               "--gpu-memory-utilization", "{gpu_memory_utilization}", "--shutdown-timeout", "{shutdown_timeout}"]
    doc = dict(base, engine={"kind": "openai", "tensor_parallel_size": 2, "max_model_len": 4096,
                             "gpu_memory_utilization": 0.85,
                             "server": {"command": command, "api_key_env": "VLLM_API_KEY", "metrics_route": "/metrics",
                                        "metrics": {"ttft": "vllm:time_to_first_token_seconds"}}},
               server={**base["server"], "drain_timeout_s": 42.5})
    cfg = parse_config(yaml.safe_dump(doc), "generic.yaml")
    out = tmp_path / "out"
    render_all(cfg, out, target="systemd", release_id="r1", env=KEY)
    argvs = []
    for h in cfg.hosts:
        d = out / "hosts" / h.name
        unit = (d / f"{cfg.service.name}.service").read_text()
        argvs.append(shlex.split(re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)))
        argvs.append(shlex.split(re.search(r"^ENGINE_CMD=\((.*)\)$", (d / "launch.sh").read_text(), re.M).group(1)))
    results = _parse("vllm", [_engine_args("vllm", a) for a in argvs])
    for argv, res in zip(argvs, results):
        assert res["ok"], (argv, res)
        assert res["positional"] == cfg.model.path
        for option, value in (("--port", 8000), ("--max-model-len", 4096), ("--tensor-parallel-size", 2),
                              ("--gpu-memory-utilization", 0.85), ("--shutdown-timeout", 43), ("--host", "0.0.0.0")):
            assert _same(res["options"][option][1], value), (option, res["options"][option])
