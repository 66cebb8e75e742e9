"""The model service: serves a Triton-layout model repository over the Open Inference Protocol v2.

A request travels servicer.py (protobuf in and out) -> converters.py (protobuf <-> domain types) ->
ModelHandler in handler.py (domain types) -> ModelManager in manager.py (which versions serve) ->
ModelVersion in version.py (one loaded version) -> its scheduler in batcher.py -> a backend from backends/.
"""
