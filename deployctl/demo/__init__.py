"""``deployctl demo``: a whole canary rollout on this machine (``run``), and the local stand-in for a GPU host's
python environment that the demo and the test fleet use (``localenv``)."""
