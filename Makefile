# The two quickstart commands: `make demo` runs the default suite, `make test` runs the tests.
# torch is pinned to the CPU build (2.13.0) so a plain requirement does not pull CUDA wheels.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# kvbench with its extras, and the example plug-in (knorm), which suites/implementations.yaml
# sets beside KnormPress.
$(BIN)/kvbench: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e ".[torch,mlx,dev,plots,serve,cuda,ray,quanto,hqq,datasets]"
	$(BIN)/pip install -e tests/data/example_plugin
	touch $@

# kvpress's presses (the kvpress extra) need transformers below 5.3: their environment is
# .venv-kvpress, which sees .venv's packages through a path file and installs its own
# transformers and kvpress in front of them (torch is not installed twice), and the example
# plug-in again (an editable install is not seen through the path file).
KVPRESS_VENV ?= .venv-kvpress
SITE = lib/python$(shell $(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')/site-packages

$(KVPRESS_VENV)/bin/kvbench: $(BIN)/kvbench
	$(BIN)/python -m venv --without-pip $(KVPRESS_VENV)
	echo "$(abspath $(VENV))/$(SITE)" > $(KVPRESS_VENV)/$(SITE)/kvbench_base.pth
	$(KVPRESS_VENV)/bin/python -m pip install -e ".[kvpress]" -e tests/data/example_plugin
	touch $@

.PHONY: install demo test test-kvpress site
install: $(BIN)/kvbench

demo: install
	$(BIN)/kvbench run suites/quick.yaml

test: install
	$(BIN)/kvbench models prepare smollm2-135m
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# The kvpress adapter's tests (and the method contract) in kvpress's own environment.
test-kvpress: $(KVPRESS_VENV)/bin/kvbench
	$(BIN)/kvbench models prepare smollm2-135m
	$(KVPRESS_VENV)/bin/python -m pytest -q -n 2 --dist loadfile tests/test_kvpress.py \
	  tests/test_conformance.py -k "kvpress or KVPress"

# The results page of every committed run (reports/index.html, linking each run's folder in
# place), and its screenshot where Chromium is installed.
site: install
	$(BIN)/kvbench report reports/*/results.json --format html --link --out reports
	@if command -v chromium >/dev/null; then chromium --headless --no-sandbox --disable-gpu \
	  --hide-scrollbars --window-size=1400,2400 --screenshot=reports/site.png \
	  "file://$(CURDIR)/reports/index.html" 2>/dev/null; else echo "no chromium: no screenshot"; fi
