"""The local trace store: an OTLP/gRPC receiver keeping recent spans in SQLite, `meshserve traces` and a web UI.

Receiving: `servicer` (Export) -> `writer` (one thread, batched, `converters` off the event loop) -> `store` (spans,
and per trace a summary row with the `marks` a search filters on).
Reading: `query` (search, one trace, the traces an analysis reads; shared by both readers) -> `analysis` (trees,
self time, critical path, slow against typical, batched calls' time attributed to their members through span links;
stage names from `stages`), then either `cli` -> `render` (terminal) or `html_report` (a page), or `web` (HTTP:
the `ui` package's pages and the JSON API of `web_api`).
"""
