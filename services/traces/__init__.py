"""The local trace store: an OTLP/gRPC receiver keeping recent spans in SQLite, and `meshserve traces` analysis."""
