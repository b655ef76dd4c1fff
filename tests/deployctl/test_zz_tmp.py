import time
from runbook_fleet import *
def test_t(ssh_fleet, tmp_path):
    fleet = ssh_fleet(1); h = fleet.hosts[0]; port = free_port()
    model = Path("/tmp/rbtiny")
    cfg = write_deploy_yaml(tmp_path / "deploy.yaml", fleet.host_yaml(), port=port, model_path=str(model))
    install_release(cfg, h.name)
    print(open(Path(h.deploy_root)/"current/runtime.yaml").read())
    t=time.time(); r = cli("runbook", "run", "restart-after-crash", "-c", str(cfg), "--yes"); print(time.time()-t)
    print(r.stdout, r.stderr)
    print(open(Path(h.deploy_root)/"shared/logs/runtime.log").read()[-3000:])
    t=time.time(); r = cli("runbook", "run", "restart-after-crash", "-c", str(cfg), "--yes"); print(time.time()-t)
    print(r.stdout, r.stderr)
    r = cli("runbook", "run", "connection-resets", "-c", str(cfg), "--yes"); print(time.time()-t)
    print(r.stdout, r.stderr)
    kill_group(pidfile_pid(h.deploy_root))
