# The front door. Each target installs what it is missing first.
BUILD ?= build
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo
JOBS ?= $(shell nproc)

.PHONY: all deps build run test bench sanitize clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The main job on its defaults: an environment that runs commands.
run: build
	@scripts/demo.sh $(BUILD)/bin

test: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 300 -j 2

bench: build
	@bench/run.sh $(BUILD)/bin

sanitize:
	@$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Debug -DMOAT_SANITIZE=ON"

clean:
	rm -rf $(BUILD) build-asan
