import time, os, json, pytest, subprocess, sys
from deployctl.demo.run import Traffic

def test_time(rollout_env, tmp_path):
    env = rollout_env(2, engine="standin", steps=[50, 100], pause_s=0,
                      analysis={"interval_s": 1, "min_requests": 1, "min_client_requests": 0})
    env.make_local()
    assert env.cli("deploy", "--yes").returncode == 0
    traffic = Traffic(env.url, "tiny-chat", workers=1, completion_workers=1).start()
    env.cfg["engine"]["max_num_seqs"] = 6; env.write()
    trace = tmp_path / "trace.jsonl"
    t0 = time.monotonic()
    p = env.popen("deploy", "--yes", env={"DEPLOYCTL_TRACE_REMOTE": str(trace)})
    for line in p.stderr:
        print(f"{time.monotonic()-t0:6.2f} {line.rstrip()[:150]}")
    p.wait()
    print(f"total {time.monotonic()-t0:.2f}")
    recs = [json.loads(l) for l in trace.read_text().splitlines()]
    print(len(recs), "remote commands", sum(r["seconds"] for r in recs))
    for r in recs: print(f'{r["host"]} {r["seconds"]:.2f} {str(r["command"])[:110]}')
    t0 = time.monotonic(); env.cli("status"); print("status", time.monotonic()-t0)
    t0 = time.monotonic(); subprocess.run([sys.executable, "-m", "deployctl", "--help"], capture_output=True); print("help", time.monotonic()-t0)
    traffic.stop()
