"""Generated from protos/ by tools/gen_protos.py (`make protos`). Do not edit."""
