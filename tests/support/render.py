"""deploy.yaml builders shared by the render tests (a helper module, not a test file)."""
from __future__ import annotations

import copy
from typing import Any

import yaml

API_KEY = "sk-render-test-0123456789abcdef"

BASE: dict[str, Any] = {
    "service": {"name": "chat-7b"},
    "model": {"path": "/models/llm-7b-chat", "served_name": "llm-7b-chat", "dtype": "bfloat16"},
    "engine": {"device": "cuda", "max_model_len": 8192, "max_num_seqs": 64},
    "server": {"bind": "0.0.0.0", "port": 8080, "api_key_env": "LLM_API_KEY", "request_timeout_s": 120,
               "drain_timeout_s": 30, "startup_timeout_s": 600},
    "hosts": [
        {"name": "gpu-a", "address": "10.0.0.11", "user": "deploy", "deploy_root": "/opt/deployctl/chat-7b",
         "python": "/opt/deployctl/venv/bin/python"},
        {"name": "gpu-b", "address": "10.0.0.12", "user": "deploy", "deploy_root": "/opt/deployctl/chat-7b",
         "python": "/opt/deployctl/venv/bin/python", "gpu": 1},
    ],
    "router": {"kind": "nginx", "host": "local", "listen": 8088, "upstream_conf": "/etc/nginx/conf.d/chat-7b.conf",
               "access_log": "/var/log/nginx/chat-7b.access.json"},
}


def merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def config_dict(**sections: Any) -> dict:
    """BASE with ``sections`` merged in (dicts merge key by key; other values replace)."""
    return merge(BASE, sections)


def make_config(**sections: Any):
    from deployctl.config import parse_config

    return parse_config(yaml.safe_dump(config_dict(**sections), sort_keys=False), "test-deploy.yaml")


def write_config(path, **sections: Any):
    path.write_text(yaml.safe_dump(config_dict(**sections), sort_keys=False))
    return path


def golden_problems(got: dict[str, str], golden_dir, label: str) -> list[str]:
    """Differences between rendered files ``got`` ({relative path: text}) and ``golden_dir`` (rewritten from ``got``
    first when DEPLOYCTL_UPDATE_GOLDEN=1), as unified diffs and missing/extra file lines."""
    import difflib
    import os
    import shutil
    from pathlib import Path

    golden_dir = Path(golden_dir)
    if os.environ.get("DEPLOYCTL_UPDATE_GOLDEN") == "1":
        shutil.rmtree(golden_dir, ignore_errors=True)
        for rel, text in got.items():
            (golden_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (golden_dir / rel).write_text(text)
    want = ({str(p.relative_to(golden_dir)): p.read_text() for p in sorted(golden_dir.rglob("*")) if p.is_file()}
            if golden_dir.exists() else {})
    problems = [f"missing from the render: {p}" for p in sorted(set(want) - set(got))]
    problems += [f"not in the golden files: {p}" for p in sorted(set(got) - set(want))]
    for rel in sorted(set(got) & set(want)):
        if got[rel] != want[rel]:
            problems.append("".join(difflib.unified_diff(want[rel].splitlines(True), got[rel].splitlines(True),
                                                         f"golden/{label}/{rel}", f"rendered/{rel}")))
    return problems


def local_release(root, python: str, *, api_key: str | None, release_id: str = "r1", **sections: Any):
    """A process-launcher host under ``root`` running ``python``, and its release rendered into
    ``root/releases/<release_id>`` (modes kept); ``sections`` merged over the config's (e.g. a real model and
    port). Returns (cfg, release dir)."""
    from pathlib import Path

    from deployctl.render import render_release

    cfg = make_config(**merge({"engine": {"device": "cpu"}, "server": {"bind": "127.0.0.1", "api_key_env": None},
                               "hosts": [{"name": "h", "address": "local", "deploy_root": str(root),
                                          "python": python, "launcher": "process"}]}, sections))
    rel = Path(root) / "releases" / release_id
    rel.mkdir(parents=True)
    for f in render_release(cfg, cfg.hosts[0], release_id, api_key=api_key):
        (rel / f.path).write_text(f.content)
        (rel / f.path).chmod(f.mode)
    return cfg, rel


def loopback_fleet(n: int, **rollout: Any):
    """A parsed deploy.yaml for the analysis and rollout-plan unit tests: hosts a, b, … on 127.0.0.1 (deploy_root
    /d/<name>, server_port 8001, 8002, …), model /m, and ``rollout`` as given."""
    from deployctl.config import parse_config

    doc = {"service": {"name": "svc"}, "model": {"path": "/m"},
           "hosts": [{"name": chr(97 + i), "address": "127.0.0.1", "deploy_root": f"/d/{chr(97 + i)}",
                      "server_port": 8001 + i} for i in range(n)],
           "rollout": rollout}
    return parse_config(yaml.safe_dump(doc, sort_keys=False), "test-deploy.yaml")


def promtool_rule_tests(test_file, rules_path, tests: list[dict]):
    """Write ``tests`` (promtool unit-test groups over ``rules_path``, evaluated every minute) to ``test_file`` and
    run the real ``promtool test rules`` on it (deployctl.render.validate.run_rule_tests)."""
    from deployctl.render.validate import run_rule_tests

    test_file.write_text(yaml.safe_dump({"rule_files": [str(rules_path)], "evaluation_interval": "1m",
                                         "tests": tests}, sort_keys=False))
    return run_rule_tests(test_file)


def assert_config_refused(doc: dict, says: str, tmp_path) -> None:
    """``doc`` (a deploy.yaml as a dict) is refused twice with a message containing ``says``: by parse_config
    (ConfigError) and by `deployctl render` (exit 3, nothing written)."""
    import subprocess
    import sys

    import pytest

    from deployctl.config import parse_config
    from deployctl.errors import ConfigError

    with pytest.raises(ConfigError) as exc:
        parse_config(yaml.safe_dump(doc), "d.yaml")
    assert says in str(exc.value), str(exc.value)
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = subprocess.run([sys.executable, "-m", "deployctl", "render", "--out", str(tmp_path / "o"), "-c", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and says in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()
