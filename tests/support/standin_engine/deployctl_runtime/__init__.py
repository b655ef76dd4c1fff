"""TEST-ONLY stand-in for the bundled runtime (tests/support/standin_engine; see server.py). Never shipped: the
real runtime is runtime/deployctl_runtime."""
STANDIN = True
__version__ = "0.1.0+standin"
