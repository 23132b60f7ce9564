# HeadLab: `make app` sets everything up and starts the app; `make test` sets up and runs the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha256sum requirements.txt | cut -c1-12)

.PHONY: app test zoo setup browser clean-venv

setup: $(STAMP)

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
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
	$(VENV)/bin/streamlit run app.py --server.address 127.0.0.1 --server.port 8501 --server.headless true

test: setup browser
	$(PY) -m pytest -q

clean-venv:
	rm -rf $(VENV)
