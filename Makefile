# The two commands a newcomer needs: `make run` (demo on the simulated GPU) and `make test`.
# Both create .venv on first use, install sharegpu into it and build the C libraries; `make test`
# also installs the third-party CUDA clients the tests run (cuda-core, numba-cuda, pycuda) into
# .venv-clients (`make clients`, once).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NATIVE_STAMP := src/sharegpu/_lib/.built
CLIENTS_VENV := .venv-clients
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed
NATIVE_SRC := $(shell find native -name '*.c' -o -name '*.h' -o -name '*.inc' -o -name '*.map' -o -name '*.def' -o -name '*.in' -o -name Makefile)

.PHONY: run test test-unit bench check native clients clean setup proto gpu-check gpu-wheels kube image

setup: $(STAMP) $(NATIVE_STAMP)

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

$(NATIVE_STAMP): $(NATIVE_SRC)
	$(MAKE) -s -C native
	touch $@

native: $(NATIVE_STAMP)

# pycuda is built against the simulator's libcuda.so (resolved again at run time, so a rebuilt
# simulator does not need a rebuilt pycuda: order-only).
$(CLIENTS_STAMP): tests/clients/install.sh | $(NATIVE_STAMP)
	PYTHON=$(PYTHON) bash tests/clients/install.sh $(CLIENTS_VENV)
	touch $@

clients: $(CLIENTS_STAMP)

run: setup
	$(BIN)/sharegpu demo

test: setup clients kube
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The unit tests alone (tests/unit: pure, no process, no simulated GPU), in seconds: the quick
# loop while editing. `make test` runs them too, with tests/integration and tests/e2e.
test-unit: setup
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

bench: setup
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/isolation.py
	$(BIN)/python bench/agent.py
	$(BIN)/python bench/placement.py
	@if [ "$$(id -u)" = 0 ] && command -v podman >/dev/null; then $(BIN)/python bench/containers.py && \
	$(BIN)/python bench/container_isolation.py; \
	else echo "bench/containers.py, bench/container_isolation.py not run: they start containers (root, podman)"; fi

check: setup
	$(BIN)/ruff format --check src tests bench
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	MYPYPATH=src $(BIN)/mypy bench/gpucheck
	bash -n scripts/gpu-check.sh
	$(BIN)/lint-imports
	$(MAKE) -s -C native LIBDIR=$(CURDIR)/build/check all

# The validation run on a real NVIDIA GPU (docs/gpu-check.md): on a GPU machine, `make gpu-check`;
# GPU_CHECK_ARGS="--dry-run --quick" runs the same steps on the simulated GPU. It creates no venv
# and reaches no network (a GPU machine has none): what its Python lacks comes from .whl/, which
# `make gpu-wheels` fills here with the versions this venv tests (Python 3.12, x86-64).
GPU_CHECK_ARGS ?=
gpu-check:
	bash scripts/gpu-check.sh $(GPU_CHECK_ARGS)

GPU_WHEELS := pydantic pydantic-core annotated-types typing-inspection typing-extensions
gpu-wheels: setup
	$(BIN)/pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl $$($(BIN)/python -c 'import importlib.metadata as m, sys; \
	  print(" ".join(f"{n}=={m.version(n)}" for n in sys.argv[1:]))' $(GPU_WHEELS))
	@ls .whl

# The kubelet's device plugin, DRA, DRA resource health and plugin registration APIs: regenerate the committed Python
# modules from their .proto files (grpcio-tools, pinned in the dev extra). PROTO_OUT=DIR writes
# elsewhere (the drift tests).
PROTO_OUT ?= src
PROTOS := sharegpu/kube/deviceplugin/api.proto sharegpu/kube/dra/dra.proto sharegpu/kube/dra/registration.proto \
  sharegpu/kube/dra/health.proto
proto:
	$(BIN)/python -m grpc_tools.protoc -Isrc --python_out=$(PROTO_OUT) --pyi_out=$(PROTO_OUT) \
	  --grpc_python_out=$(PROTO_OUT) $(PROTOS)

# The real Kubernetes components, etcd, containerd 2, Helm and Docker Engine 28 (docs/kubernetes.md),
# built once from the Go module proxy into ${SHAREGPU_KUBE_CACHE:-~/.cache/sharegpu/kube}; `make test`
# builds what is missing (the e2e tests run them).
kube:
	bash scripts/build-kube.sh

# The project's image from Debian's packages and this tree, no registry (needs root and
# debootstrap): an OCI archive for `ctr images import` or `podman load`.
image: setup
	bash scripts/build-image.sh

clean:
	rm -rf $(VENV) $(CLIENTS_VENV) build src/sharegpu/_lib .pytest_cache .mypy_cache .ruff_cache
