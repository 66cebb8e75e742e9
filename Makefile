# meshserve: every command a person or CI needs. `make run` and `make test` set up what they use.
SHELL := /bin/bash
PYTHON_SYS ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PERF_VENV := .venv-perf
PERF_STAMP := $(PERF_VENV)/.installed
MODELS_STAMP := models/.built
PYTEST_ARGS ?=

.PHONY: setup run test bench bench-peers protos protos-check models lint clean

setup: $(STAMP) $(PERF_STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[model,cache,feature,gateway,cli,train,dev]'
	@touch $(STAMP)

# perf_analyzer's own virtualenv: the tritonclient 2.49 wheel carries the binary, and its old pins stay here.
$(PERF_STAMP): tools/perf-requirements.txt
	@test -x $(PERF_VENV)/bin/python || $(PYTHON_SYS) -m venv $(PERF_VENV)
	$(PERF_VENV)/bin/python -m pip install -q -r tools/perf-requirements.txt
	@touch $(PERF_STAMP)

models: $(MODELS_STAMP)

MODEL_SOURCES := models/build.py models/fraud_mlp.py models/digits_cnn.py models/heavy_mlp.py models/transactions.py \
	models/feature_replay.py models/fraud_mlp/config.yaml models/digits_cnn/config.yaml \
	models/bench/heavy_mlp/config.yaml services/model/export.py features/fraud_v1.yaml \
	$(wildcard features/tables/*.csv) $(wildcard services/feature/*.py)

$(MODELS_STAMP): $(STAMP) $(MODEL_SOURCES)
	$(PY) -m models.build
	@touch $(MODELS_STAMP)

protos: $(STAMP)
	$(PY) tools/gen_protos.py

protos-check: $(STAMP)
	$(PY) tools/gen_protos.py --check

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) tools/gen_protos.py --check
	$(PY) tools/gen_config_docs.py --check
	$(PY) tools/gen_module_map.py --check

# Three pytest processes. tests/unit: in process only (tests/unit/conftest.py refuses to start a process), with
# tests/manifests (kubectl). tests/integration and tests/fuzz: real processes (Valkey, Envoy, the services)
# driven through the project's own stubs. tests/compat and tests/mesh: real processes driven by unmodified
# clients (tritonclient, perf_analyzer), whose protobuf package `inference` one process cannot hold beside
# services.protos.
test: setup models
	@bash tools/ensure_system_packages.sh
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) tools/gen_config_docs.py --check
	$(PY) tools/gen_module_map.py --check
	$(PY) -m pytest tests/unit $(wildcard tests/manifests) $(PYTEST_ARGS)
	$(PY) -m pytest tests/integration tests/fuzz $(PYTEST_ARGS)
	$(PY) -m pytest tests/compat $(wildcard tests/mesh) $(PYTEST_ARGS)

# The whole local stack (Valkey, model v1 x2 + v2 canary, feature, cache, gateway, Envoy from istio/), 20 s of
# demo traffic with a live view and a summary, then it keeps serving until Ctrl-C.
# TOPOLOGY=edge_cloud: two tiers (an edge and a cloud stack, the 30 ms emulated WAN between them) and a demo of
# sensitive and general requests, its summary per tier.
run: setup models
	$(VENV)/bin/meshserve up --demo 20 $(if $(TOPOLOGY),--topology $(TOPOLOGY))

bench: setup models
	$(PY) -m bench.model_service
	$(PY) -m bench.cache
	$(PY) -m bench.feature_service
	$(PY) -m bench.pipeline
	$(PY) -m bench.mesh
	$(PY) -m bench.tracing
	$(PY) -m bench.stack
	$(PY) -m bench.elastic

# Two tiers with the 30 ms emulated WAN beside the edge stack alone (about 3 minutes): sensitive p50 against the
# edge alone, general p50 against WAN + the cloud alone, bytes per request sent to the cloud per leave_edge policy.
.PHONY: bench-edge
bench-edge: setup models
	$(PY) -m bench.edge

bench-peers: setup models
	$(PY) -m bench.peers
	$(PY) -m bench.peers.pipeline

# The chaos run (about 11 minutes): the whole stack through Envoy under open-loop load at 50% and 90% of the
# capacity it measures first, through a scripted sequence of faults; the table goes to bench/results/chaos-<date>.md.
.PHONY: chaos
chaos: setup models
	$(PY) -m bench.chaos

clean:
	rm -rf $(VENV) $(MODELS_STAMP) models/*/[0-9]*/ models/bench/*/[0-9]*/

.PHONY: gpu-check gpu-bundle
# The GPU paths this machine has (torch CUDA FP32/FP16 beside ONNX Runtime on the CPU; ONNX Runtime CUDA/TensorRT and
# native TensorRT reported present or missing): the GPU tests, FP16 vs FP32, batch invariance, memory over 20
# reloads, rows/s, served infer/s with GPU utilisation from /metrics, cost per million; without a GPU each part says
# why it did not run. docs/gpu.md.
gpu-check: setup models
	$(PY) -m tests.gpu.check
# The folder a GPU machine's run carries (.gpu-bundle/: wheels for its Python 3.12, models, pycuda's sdist, run.sh).
gpu-bundle: setup models
	$(PY) tools/gpu_bundle.py
