# Rendered by deployctl: starts the engine module with its API key flag filled in from the env file,
# so the key is never on a command line.
import os, runpy, sys

key = os.environ.pop('DEPLOYCTL_ENGINE_API_KEY', '')
module = sys.argv[1]
sys.argv = [module] + sys.argv[2:] + (['--api-key', key] if key else [])
runpy.run_module(module, run_name='__main__', alter_sys=True)
