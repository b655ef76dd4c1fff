"""Standard-library scripts shipped to a host and run there with the host's own python.

Nothing here imports deployctl (or anything outside the standard library, pynvml aside), so a file's source can
be sent as is: ``probe`` (the host's facts for preflight), ``weights`` (manifest and safetensors checks, hashing),
``snippets`` (small ``python -c`` programs: an HTTP request, who holds a port, is a pid alive).
"""
