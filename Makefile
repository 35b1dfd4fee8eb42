# One command to start the sidecar, one to run the tests; each sets up .venv itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LISTEN ?= 127.0.0.1:50051
CONFIG ?=

.PHONY: serve test lint typecheck proto check-proto check bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## Start the sidecar with the defaults (no config file needed).
serve: $(STAMP)
	$(BIN)/dsh-system-prompt serve --listen $(LISTEN) $(if $(CONFIG),--config $(CONFIG))

## Run the whole test suite.
test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

## Regenerate the protobuf stubs from proto/.
proto: $(STAMP)
	PYTHON=$(BIN)/python scripts/gen_proto.sh

## Fail when the committed stubs differ from what proto/ generates.
check-proto: $(STAMP)
	@tmp=$$(mktemp -d) && PYTHON=$(BIN)/python scripts/gen_proto.sh $$tmp \
	  && diff -r $$tmp/dsh/systemprompt/v1 client/dsh/systemprompt/v1 -x __pycache__ \
	  && echo "generated stubs are fresh"; status=$$?; rm -rf $$tmp; exit $$status

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

check: check-proto lint typecheck

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info
