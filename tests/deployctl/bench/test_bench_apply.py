"""`deployctl bench --apply`: a real short bench against the tiny runtime writes its knee into deploy.yaml
(engine.max_num_seqs, router.max_conns_per_host below the knee) with a comment naming the time and the run; the
rest of the file (comments, layout) is kept and the result loads. Refusals leave the file unchanged."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest
import yaml

from deployctl.bench.apply import MARKER, apply_recommendation
from deployctl.config import load_config
from deployctl.errors import CheckFailed, ConfigError

DEPLOY = """\
# production deploy.yaml (hand-written comments must survive)
service: {name: tiny}
model:
  path: MODEL
engine:
  device: cpu
  max_num_seqs: 64   # the default
server: {bind: 127.0.0.1, port: PORT}
hosts:
  - {name: local-a, address: local, deploy_root: /tmp/deployctl-apply-test}
router:
  listen: 8088
  upstream_conf: /tmp/deployctl-apply-test/router.conf
"""


def _rec(knee=6, seqs=6, conns=4) -> dict:
    return {"knee_concurrency": knee, "max_num_seqs": seqs, "criterion": "2x_level1",
            "router": {"max_conns_per_host": conns, "rate_limit_rps": 3.2}}


def test_bench_apply_on_a_real_bench_edits_the_file_and_it_loads(run_bench, slow_tiny_runtime, tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOY.replace("MODEL", str(slow_tiny_runtime["model"])).replace("PORT", str(slow_tiny_runtime["port"])))
    path.chmod(0o640)
    code, doc, err = run_bench("--url", slow_tiny_runtime["url"], "-c", str(path), "--apply", "--concurrency", "1,2",
                               "--requests", "4", "--input-len", "8", "--output-len", "6", "--no-loadgen-check",
                               "--json", timeout=180)
    assert code == 0, err[-2000:]
    rec = doc["recommendation"]
    cfg = load_config(path)
    assert cfg.engine.max_num_seqs == rec["max_num_seqs"] == rec["knee_concurrency"] >= 1
    assert cfg.router.max_conns_per_host == rec["router"]["max_conns_per_host"]
    assert cfg.router.max_conns_per_host <= cfg.engine.max_num_seqs
    assert cfg.router.max_conns_per_host < cfg.engine.max_num_seqs or cfg.engine.max_num_seqs == 1  # below the knee
    text = path.read_text()
    assert "# production deploy.yaml (hand-written comments must survive)" in text
    assert "server: {bind: 127.0.0.1" in text and oct(path.stat().st_mode & 0o777) == "0o640"
    comments = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(f"# {MARKER}")]
    assert len(comments) == 2 and all(slow_tiny_runtime["url"] in c and " UTC: " in c for c in comments), comments
    assert "(was 64)" in comments[0] and "(was None)" in comments[1]
    assert f"engine.max_num_seqs 64 -> {rec['max_num_seqs']}" in err
    # the fragment printed for pasting holds only keys deploy.yaml knows
    pasted = yaml.safe_load(rec["deploy_yaml"])
    doc = yaml.safe_load(text)
    doc["engine"].update(pasted["engine"])
    doc["router"].update(pasted["router"])
    from deployctl.config import parse_config

    assert parse_config(yaml.safe_dump(doc)).router.max_conns_per_host == rec["router"]["max_conns_per_host"]


def test_reapplying_replaces_its_comments_and_keeps_the_rest(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOY.replace("MODEL", "/m").replace("PORT", "8001"))
    when = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    apply_recommendation(path, _rec(), run="run one", when=when)
    done = apply_recommendation(path, _rec(8, 8, 6), run="run two", when=when)
    text = path.read_text()
    assert text.count(MARKER) == 2 and "run one" not in text and "run two" in text
    assert done.changes == {"engine.max_num_seqs": (6, 8), "router.max_conns_per_host": (4, 6)}
    doc = yaml.safe_load(text)
    assert doc["engine"] == {"device": "cpu", "max_num_seqs": 8} and doc["router"]["max_conns_per_host"] == 6
    assert "max_num_seqs: 8   # the default" in text  # the value's own comment stays beside it


def test_no_knee_or_a_bad_file_leaves_it_unchanged(tmp_path):
    path = tmp_path / "deploy.yaml"
    original = DEPLOY.replace("MODEL", "/m").replace("PORT", "8001")
    path.write_text(original)
    with pytest.raises(CheckFailed, match="no level of the bench held"):
        apply_recommendation(path, {**_rec(), "knee_concurrency": None, "max_num_seqs": None}, run="r")
    assert path.read_text() == original
    with pytest.raises(ConfigError, match="max_conns_per_host"):  # a value deploy.yaml refuses is never written
        apply_recommendation(path, _rec(conns=0), run="r")
    assert path.read_text() == original
    no_router = original[: original.index("router:")]
    path.write_text(no_router)
    done = apply_recommendation(path, _rec(), run="r")
    assert "no router: section" in done.notes[0] and load_config(path).engine.max_num_seqs == 6


def test_apply_refuses_before_the_bench_runs(run_bench, tmp_path):
    """Nothing listens at the URL: the refusals come first, so no bench (and no connection) is tried."""
    bad = tmp_path / "deploy.yaml"
    bad.write_text("service: {name: x}\nengine: {max_num_seqs: 0}\n")
    code, _, err = run_bench("--url", "http://127.0.0.1:9", "-c", str(bad), "--apply")
    assert code == 3 and "deploy.yaml" in err and "Connect" not in err, err
    code, _, err = run_bench("--url", "http://127.0.0.1:9", "-c", str(tmp_path / "missing.yaml"), "--apply")
    assert code == 2 and "--apply:" in err and "does not exist" in err
    code, _, err = run_bench("--url", "http://127.0.0.1:9", "--url", "http://127.0.0.1:10", "-c", str(bad), "--apply")
    assert code == 2 and "two servers were given" in err


def test_router_limit_is_below_the_knee():
    from deployctl.bench.knee import Knee
    from deployctl.bench.recommend import router_limit

    def knee(c):
        return Knee(c, "2x_level1", None, None, 0.01, c, None, 0.8, None, "")

    assert {c: router_limit(knee(c)) for c in (1, 2, 4, 5, 8, 10, 64)} == {1: 1, 2: 1, 4: 3, 5: 4, 8: 6, 10: 8, 64: 51}
    assert router_limit(knee(None)) is None
