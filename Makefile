# Piper: thin wrapper over CMake. `make run` trains the quickstart job; `make test` runs every test.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
NP ?= 1

.PHONY: all deps configure build run test bench data clean bundle bundle-check

all: build

deps:
	@tools/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

data: deps
	@tools/prepare-data.sh

run: build data
	$(BUILD)/piper --config configs/quickstart.toml

test: build data
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build data
	@bench/run-all.sh $(BUILD)

bundle:
	@tools/gpu-bundle.sh

bundle-check: bundle
	@tools/gpu-bundle-check.sh

clean:
	rm -rf $(BUILD)
