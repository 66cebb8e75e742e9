"""The feature service: declared feature sets (YAML) -> FP32 feature matrices; online aggregates in Redis."""
