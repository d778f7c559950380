# Baton: the two commands are `make demo` and `make test`. Everything else is a step of those.
BUILD_DIR ?= build
FUZZ_DIR ?= build-fuzz
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 30
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release
# The project's own checks (`make test`, CI) treat warnings as errors; a plain build does not.
CHECK_FLAGS = -DBATON_WERROR=ON

.PHONY: all deps build checked-build test unit fuzz fuzz-build demo serve perf format clean install

all: build

deps:
	@scripts/install-deps

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The build with warnings as errors.
checked-build: deps
	cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) $(CHECK_FLAGS)
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Every unit and integration test, then each fuzzer for FUZZ_SECONDS. BATON_TEST_RUN tags
# every process of this run, for the suite's last test (tests/support/suite_tag.h).
test: checked-build
	cd $(BUILD_DIR) && BATON_TEST_RUN=make-test.$$$$.$$(date +%s%N) ctest --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory fuzz

unit: checked-build
	cd $(BUILD_DIR) && BATON_TEST_RUN=make-unit.$$$$.$$(date +%s%N) ctest --output-on-failure -j $(JOBS)

$(FUZZ_DIR)/CMakeCache.txt:
	cmake -S . -B $(FUZZ_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
	  -DCMAKE_CXX_COMPILER=clang++ -DBATON_BUILD_FUZZERS=ON -DBATON_ENABLE_CUDA=OFF

fuzz-build: deps $(FUZZ_DIR)/CMakeCache.txt
	cmake -S . -B $(FUZZ_DIR) $(CHECK_FLAGS)
	cmake --build $(FUZZ_DIR) -j $(JOBS) --target baton_fuzzers

# Runs each libFuzzer target (ASan + UBSan) for FUZZ_SECONDS over a scratch copy of its seed
# corpus, so the committed corpus does not grow.
fuzz: fuzz-build
	@scripts/run-fuzzers $(FUZZ_DIR)/bin $(FUZZ_SECONDS)

demo: build
	@scripts/demo

# Installs the programs, the systemd units, example configs, alert rules and the dashboard
# (deploy/CMakeLists.txt). `make install PREFIX=/usr` sets the prefix (default /usr/local);
# `make install DESTDIR=/tmp/root` installs under a scratch root, as packagers do. It builds
# what is missing first, without installing packages (`make deps` does that).
# The prefix is set at every install: one given once does not stay in the build's cache for
# the next plain `make install`.
PREFIX ?= /usr/local
install: $(BUILD_DIR)/CMakeCache.txt
	cmake -S . -B $(BUILD_DIR) -DCMAKE_INSTALL_PREFIX=$(PREFIX)
	cmake --build $(BUILD_DIR) -j $(JOBS)
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD_DIR)

# The stack in the foreground on the default model until Ctrl-C; batonctl reaches it with no flags.
serve: build
	@scripts/serve

perf: build
	perf/weightload

format:
	git ls-files '*.h' '*.cc' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR) $(FUZZ_DIR)
