# Two commands do all set-up on a fresh Debian machine (as root, or with sudo):
#   make demo   runs the main job on a generated dataset, no external service
#   make test   runs the whole test suite
# Both bootstrap what they need once: Debian packages when missing, .venv,
# the project with its extras. Running either again reinstalls nothing.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEB_PACKAGES := fuse3 libfuse3-dev pkg-config gcc python3-dev python3-venv rsync
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.stamp-$(shell cat pyproject.toml setup.py | cksum | cut -d' ' -f1)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=
PYTEST_WORKERS ?= auto

.PHONY: demo test bootstrap debs clean bench

demo: $(STAMP)
	$(BIN)/stager demo

# One worker per core, a test file's tests on one worker (see tests/conftest.py); PYTEST_WORKERS=0 runs in one process.
test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

bootstrap: $(STAMP)

debs:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml setup.py
	@$(MAKE) --no-print-directory debs
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@# A pinned CPU build of torch first: an open range would pull a CUDA build of several GB.
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install -q -e '.[test,s3,fuse,torch]'
	@rm -f $(VENV)/.stamp-*
	@touch $@

bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'

clean:
	rm -rf $(VENV) build *.egg-info
