"""The local trace store: an OTLP/gRPC receiver keeping recent spans in SQLite, and `meshserve traces` analysis.

Receiving: `servicer` (Export) -> `writer` (one thread, batched, `converters` off the event loop) -> `store`.
Reading: `cli` -> `store` -> `analysis` (trees, self time, critical path, batched calls' time attributed to their
members through span links; stage names from `stages`) -> `render` (terminal) or `html_report` (a page).
"""
