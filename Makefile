# Piper: thin wrapper over CMake. `make run` trains the quickstart job; `make test` runs every test;
# `make sanitize` runs them under ASan+UBSan, `make fuzz` runs the libFuzzer targets (clang).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
NP ?= 1
SANITIZE_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_TIME ?= 60
FUZZ_DEPS = clang-14 libclang-rt-14-dev libomp-14-dev
FUZZ_TARGETS = $(basename $(notdir $(wildcard fuzz/fuzz_*.cpp)))

.PHONY: all deps configure build run test sanitize fuzz bench data clean bundle bundle-check

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

# ASan+UBSan build of piper and the unit tests (CUDA off), then every test but the Slurm one under it.
sanitize: deps data
	@cmake -S . -B $(SANITIZE_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPIPER_SANITIZE=ON -DPIPER_CUDA=OFF >/dev/null
	@cmake --build $(SANITIZE_BUILD) -j $(JOBS) --target piper piper-ckpt piper_tests
	@tools/sanitize-test.sh $(SANITIZE_BUILD) $(JOBS)

# libFuzzer targets (clang-14, ASan+UBSan), each run FUZZ_TIME seconds from fuzz/corpus.
fuzz: data
	@tools/install-deps.sh $(FUZZ_DEPS)
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14 \
	  -DCMAKE_CXX_COMPILER=clang++-14 -DPIPER_FUZZ=ON -DPIPER_CUDA=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(FUZZ_TARGETS)
	@tools/fuzz.sh $(FUZZ_BUILD) $(FUZZ_TIME)

bench: build data
	@bench/run-all.sh $(BUILD)

bundle:
	@tools/gpu-bundle.sh

bundle-check: bundle
	@tools/gpu-bundle-check.sh

# rm -rf --one-file-system, refused (nothing deleted) while anything is mounted below a folder (tools/rootfs-lib.sh).
clean:
	bash tools/rootfs-lib.sh remove $(BUILD) $(SANITIZE_BUILD) $(FUZZ_BUILD)
