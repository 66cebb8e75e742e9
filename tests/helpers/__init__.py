"""Test helpers: build small real TorchScript models, start real service processes over sockets.

Nothing here imports `services.protos`: the compat tests (tests/compat, tests/mesh) use tritonclient, whose protobuf
symbols (package `inference`) would clash with ours in one process.
"""
