"""The runtime's OpenAI-compatible HTTP server (FastAPI + uvicorn).

Layers, top to bottom: `cli` (the `serve` subcommand) -> `app` (routes, middleware, lifecycle) -> `serving`
(request -> engine requests -> response/SSE) -> `async_engine` (the engine's step loop on its own thread).
Text handling (`detokenizer`, `stop_strings`, `chat_template`) and the cross-cutting parts (`auth`, `metrics`,
`faults`, `verify`) are small modules of their own. Importing this package imports neither torch nor FastAPI.
"""
