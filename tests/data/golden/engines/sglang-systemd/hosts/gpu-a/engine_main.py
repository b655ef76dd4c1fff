# Rendered by deployctl: starts the engine module with its API key flag filled in from the env file,
# so the key is never on a command line, and keeps the key out of the log the engine writes.
import os, runpy, sys

def scrub(key, fds=(1, 2)):
    import select, signal
    k, mark = key.encode(), b'<redacted>'
    pipes = {}
    for fd in fds:
        r, w = os.pipe()
        pipes[r] = [os.dup(fd), b'']
        os.dup2(w, fd)
        os.close(w)
    if os.fork():
        for r, (out, _) in pipes.items():
            os.close(r)
            os.close(out)
        return
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # outlive the engine: write what its last words were
    for fd in fds:
        os.close(fd)
    while pipes:
        for r in select.select(list(pipes), [], [])[0]:
            out, held = pipes[r]
            chunk = os.read(r, 65536)
            data = (held + chunk).replace(k, mark)
            keep = 0 if not chunk else next((n for n in range(min(len(k) - 1, len(data)), 0, -1)
                                             if data.endswith(k[:n])), 0)
            pipes[r][1] = data[len(data) - keep:] if keep else b''
            body = data[:len(data) - keep]
            while body:
                body = body[os.write(out, body):]
            if not chunk:
                del pipes[r]
    os._exit(0)

key = os.environ.pop('DEPLOYCTL_ENGINE_API_KEY', '')
module = sys.argv[1]
if key:
    scrub(key)
sys.argv = [module] + sys.argv[2:] + (['--api-key', key] if key else [])
runpy.run_module(module, run_name='__main__', alter_sys=True)
