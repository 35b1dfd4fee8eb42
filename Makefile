# One command to start the sidecar, one to run the tests; each sets up .venv itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LISTEN ?= 127.0.0.1:50051
CONFIG ?=
ADMIN ?=

.PHONY: serve test screenshots lint typecheck proto check-proto docs check-docs buf check bench soak soak-hostile clean \
  wheelhouse image image-tools image-test bench-image

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## Start the sidecar with the defaults (no config file needed).
serve: $(STAMP)
	$(BIN)/dsh-system-prompt serve --listen $(LISTEN) $(if $(CONFIG),--config $(CONFIG)) \
	  $(if $(ADMIN),--admin-listen $(ADMIN))

## Run the whole test suite.
test: $(STAMP) node-deps independent-client-deps codegen-tools browser ts-test go-test
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

## Regenerate the protobuf stubs from proto/ (Python, and the TypeScript and Go clients').
proto: $(STAMP) ts-proto go-proto
	PYTHON=$(BIN)/python scripts/gen_proto.sh

## Fail when the committed stubs differ from what proto/ generates.
check-proto: $(STAMP)
	@tmp=$$(mktemp -d) && PYTHON=$(BIN)/python scripts/gen_proto.sh $$tmp \
	  && diff -r $$tmp/dsh/systemprompt/v1 client/dsh/systemprompt/v1 -x __pycache__ \
	  && echo "generated stubs are fresh"; status=$$?; rm -rf $$tmp; exit $$status

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

## mypy --strict on what pyproject.toml's [tool.mypy] files name: the packages and bench/.
typecheck: $(STAMP)
	$(BIN)/mypy

## Regenerate docs/contract.md from the proto, and operations.md's config tables from the keys.
docs: $(STAMP)
	$(BIN)/python scripts/proto_docs.py
	$(BIN)/python scripts/config_docs.py

## Fail when docs/contract.md or operations.md's config tables differ from what they are made from.
check-docs: $(STAMP)
	@$(BIN)/python scripts/proto_docs.py - | diff - docs/contract.md \
	  && echo "contract reference is fresh"
	@$(BIN)/python scripts/config_docs.py --check

## buf lint (STANDARD + COMMENTS), and buf breaking against the previous commit.
buf: $(STAMP)
	$(BIN)/buf lint proto
	@if git rev-parse --verify --quiet HEAD~1 >/dev/null; then \
	  $(BIN)/buf breaking proto --against '.git#ref=HEAD~1,subdir=proto' \
	    && echo "no breaking change against the previous commit"; \
	else echo "no previous commit to check for breaking changes"; fi

## Fail when the docs name a file, flag, config key or metric that does not exist, or
## operations.md leaves one out, or architecture.md a folder, or a module its docstring
## (scripts/check_docs.py).
.PHONY: docs-check
docs-check: $(STAMP)
	$(BIN)/python scripts/check_docs.py

check: check-proto check-ts-proto check-go-proto check-docs docs-check buf lint typecheck ts-typecheck go-vet \
  validate-deploy

.PHONY: validate-deploy
## Lint the Dockerfile (hadolint) and validate deploy/kubernetes/ (kubernetes-validate).
validate-deploy: $(STAMP)
	BIN=$(BIN) scripts/validate-deploy.sh

bench: $(STAMP) ts-build go-bench
	$(BIN)/python -m bench

## A bounded soak test (not part of `make test`): SOAK_ARGS="--clients 8 --seconds 60".
soak: $(STAMP)
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

## The hostile soak: the soak's clients beside every attack of issue 11, against a calm run.
soak-hostile: $(STAMP)
	$(BIN)/python -m bench.hostile $(SOAK_ARGS)

clean:
	rm -rf $(VENV) build wheelhouse/*.whl *.egg-info examples/node/node_modules tests/independent_client/node_modules \
	  $(TS_CLIENT)/node_modules $(TS_CLIENT)/dist .gopath examples/go/vendor

## Install the Node.js example's dependencies (examples/node) from its lockfile,
## when node_modules is missing or older than package.json / package-lock.json;
## its one dependency is the TypeScript client, linked and built.
NODE_EXAMPLE := examples/node
.PHONY: node-deps
node-deps: $(NODE_EXAMPLE)/node_modules/.package-lock.json ts-build

$(NODE_EXAMPLE)/node_modules/.package-lock.json: $(NODE_EXAMPLE)/package.json $(NODE_EXAMPLE)/package-lock.json
	cd $(NODE_EXAMPLE) && npm ci --no-audit --no-fund
	touch $@

## The same for the independent client (tests/independent_client), written from the docs alone.
INDEPENDENT_CLIENT := tests/independent_client
.PHONY: independent-client-deps
independent-client-deps: $(INDEPENDENT_CLIENT)/node_modules/.package-lock.json

$(INDEPENDENT_CLIENT)/node_modules/.package-lock.json: $(INDEPENDENT_CLIENT)/package.json $(INDEPENDENT_CLIENT)/package-lock.json
	cd $(INDEPENDENT_CLIENT) && npm ci --no-audit --no-fund
	touch $@

## protoc and the Go plugins the README's codegen commands use (Debian packages), when missing.
CODEGEN_PACKAGES := protobuf-compiler protoc-gen-go protoc-gen-go-grpc
.PHONY: codegen-tools
codegen-tools:
	@if command -v protoc >/dev/null && command -v protoc-gen-go >/dev/null \
	  && command -v protoc-gen-go-grpc >/dev/null; then exit 0; fi; \
	sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	$$sudo apt-get install -y -q --no-install-recommends $(CODEGEN_PACKAGES) >/dev/null \
	  || { $$sudo apt-get update -q >/dev/null && \
	       $$sudo apt-get install -y -q --no-install-recommends $(CODEGEN_PACKAGES) >/dev/null; }

## The TypeScript client (clients/typescript): its dependencies from its lockfile,
## when node_modules is missing or older than package.json / package-lock.json.
TS_CLIENT := clients/typescript
.PHONY: ts-deps ts-proto check-ts-proto ts-typecheck ts-build ts-test
ts-deps: $(TS_CLIENT)/node_modules/.package-lock.json

$(TS_CLIENT)/node_modules/.package-lock.json: $(TS_CLIENT)/package.json $(TS_CLIENT)/package-lock.json
	cd $(TS_CLIENT) && npm ci --no-audit --no-fund
	touch $@

## Regenerate the TypeScript client's messages and service from proto/ (buf + protoc-gen-es).
ts-proto: ts-deps
	cd $(TS_CLIENT) && npm run --silent generate

## Fail when the TypeScript client's generated code differs from what proto/ generates.
check-ts-proto: ts-deps
	@tmp=$$(mktemp -d) && (cd $(TS_CLIENT) && npx --no-install buf generate ../../proto \
	    --template buf.gen.yaml -o $$tmp) \
	  && diff -r $$tmp/src/gen $(TS_CLIENT)/src/gen \
	  && echo "TypeScript generated code is fresh"; status=$$?; rm -rf $$tmp; exit $$status

## Type-check the TypeScript client and its tests (strict), without emitting.
ts-typecheck: ts-deps
	cd $(TS_CLIENT) && npx --no-install tsc -p tsconfig.json --noEmit

## Build the TypeScript client (strict type-check, ESM + .d.ts into dist/).
ts-build: ts-deps
	cd $(TS_CLIENT) && npm run --silent build

## Build the TypeScript client and run its tests against real sidecars from .venv (npm's pretest builds).
ts-test: $(STAMP) ts-deps
	cd $(TS_CLIENT) && npm test

## Debian's Chromium, which the admin page's browser tests drive through Playwright
## (tests/admin/test_admin.py launches /usr/bin/chromium; `playwright install` is never needed).
.PHONY: browser
browser:
	@if [ -x /usr/bin/chromium ]; then exit 0; fi; \
	sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	$$sudo apt-get install -y -q --no-install-recommends chromium >/dev/null \
	  || { $$sudo apt-get update -q >/dev/null && \
	       $$sudo apt-get install -y -q --no-install-recommends chromium >/dev/null; }

## Refresh the admin page's screenshots in docs/admin/ (the browser tests take them).
screenshots: $(STAMP) browser
	DSP_ADMIN_SCREENSHOTS=1 $(BIN)/python -m pytest -q tests/admin/test_admin.py

## The Go client (clients/go), built offline from Debian's packages: Go 1.19 and the gRPC,
## protobuf and genproto sources in /usr/share/gocode, in GOPATH mode (no module proxy).
## Its import path is go.mod's module line; a GOPATH of a link (.gopath/) puts the client
## under it. The example agent (examples/go) is built as a consumer builds it
## (clients/go/README.md, "Your own module"): its own module, the client by a replace to its
## path, in module mode from a vendor/ of links to the client and Debian's sources.
GO_CLIENT := clients/go
GO_MODULE := $(shell sed -n 's/^module //p' $(GO_CLIENT)/go.mod)
GO_REPOSITORY := $(patsubst %/$(GO_CLIENT),%,$(GO_MODULE))
GO_PATH := $(CURDIR)/.gopath
GO_SRC := $(GO_PATH)/src/$(GO_REPOSITORY)
GO := GO111MODULE=off GOPATH=$(GO_PATH):/usr/share/gocode GOPROXY=off GOFLAGS= go
GO_PACKAGES := golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-google-genproto-dev \
  golang-github-golang-protobuf-1-5-dev protobuf-compiler protoc-gen-go protoc-gen-go-grpc
GO_PROTOC := protoc -I proto --go_opt=paths=source_relative --go-grpc_opt=paths=source_relative
GO_GEN := $(GO_CLIENT)/gen
GO_EXAMPLE := examples/go
GO_DEBIAN_MODULES := google.golang.org/grpc google.golang.org/protobuf google.golang.org/genproto \
  github.com/golang/protobuf golang.org/x/net golang.org/x/sys golang.org/x/text
GO_CONSUMER := GO111MODULE=on GOPROXY=off GOFLAGS=-mod=vendor go
.PHONY: go-tools go-path go-vendor go-proto check-go-proto go-vet go-test go-bench

## Debian's Go toolchain and libraries (the Go client needs nothing else), when missing.
go-tools:
	@n=$$(dpkg-query -W -f='$${db:Status-Abbrev}\n' $(GO_PACKAGES) 2>/dev/null | grep -c '^ii'); \
	if [ "$$n" -ne $(words $(GO_PACKAGES)) ]; then \
	  sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$sudo apt-get install -y -q --no-install-recommends $(GO_PACKAGES) >/dev/null \
	  || { $$sudo apt-get update -q >/dev/null && \
	       $$sudo apt-get install -y -q --no-install-recommends $(GO_PACKAGES) >/dev/null; }; fi

go-path:
	@mkdir -p $(GO_SRC)/clients
	@ln -sfn $(CURDIR)/$(GO_CLIENT) $(GO_SRC)/$(GO_CLIENT)

## examples/go/vendor/: the client (by the path of go.mod's replace) and Debian's modules, as
## links, and the modules.txt that says so (the README's recipe, for the example).
go-vendor:
	@replaced=$$(sed -n 's|^replace $(GO_MODULE) => ||p' $(GO_EXAMPLE)/go.mod); \
	rm -rf $(GO_EXAMPLE)/vendor && mkdir -p $(GO_EXAMPLE)/vendor/$(dir $(GO_MODULE)) \
	&& ln -sfn $(CURDIR)/$(GO_CLIENT) $(GO_EXAMPLE)/vendor/$(GO_MODULE) \
	&& for m in $(GO_DEBIAN_MODULES); do mkdir -p $(GO_EXAMPLE)/vendor/$$(dirname $$m) \
	  && ln -sfn /usr/share/gocode/src/$$m $(GO_EXAMPLE)/vendor/$$m; done \
	&& printf '%s\n' "# $(GO_MODULE) v0.0.0 => $$replaced" '## explicit; go 1.19' \
	  "# $(GO_MODULE) => $$replaced" > $(GO_EXAMPLE)/vendor/modules.txt

## Regenerate the Go client's messages and service (clients/go/gen/) from proto/.
go-proto: go-tools
	rm -rf $(GO_GEN) && mkdir -p $(GO_GEN)
	$(GO_PROTOC) --go_out=$(GO_GEN) --go-grpc_out=$(GO_GEN) proto/dsh/systemprompt/v1/system_prompt.proto

## Fail when the Go client's generated code differs from what proto/ generates.
check-go-proto: go-tools
	@tmp=$$(mktemp -d) && $(GO_PROTOC) --go_out=$$tmp --go-grpc_out=$$tmp \
	    proto/dsh/systemprompt/v1/system_prompt.proto \
	  && diff -r $$tmp $(GO_GEN) && echo "Go generated code is fresh"; status=$$?; rm -rf $$tmp; exit $$status

## gofmt and go vet on the Go client and the Go example.
go-vet: go-tools go-path go-vendor
	@test -z "$$(gofmt -l $(GO_CLIENT) $(GO_EXAMPLE)/*.go)" || { gofmt -l $(GO_CLIENT) $(GO_EXAMPLE)/*.go; exit 1; }
	cd $(GO_SRC) && $(GO) vet ./$(GO_CLIENT)/...
	cd $(GO_EXAMPLE) && $(GO_CONSUMER) vet .

## Build and test the Go client against real sidecars from .venv (and scripted ones).
go-test: $(STAMP) go-tools go-path go-vendor
	cd $(GO_EXAMPLE) && $(GO_CONSUMER) build -o $(GO_PATH)/bin/go-agent .
	cd $(GO_SRC) && DSP_SIDECAR=$(CURDIR)/$(BIN)/dsh-system-prompt DSP_GO_EXAMPLE=$(GO_PATH)/bin/go-agent \
	     $(GO) test -count=1 $(GO_TEST_ARGS) ./$(GO_CLIENT)/...

## Build the Go client's bench program (clients/go/bench) for `make bench`.
go-bench: go-tools go-path
	cd $(GO_SRC) && $(GO) build -o $(GO_PATH)/bin/go-bench ./$(GO_CLIENT)/bench

## The wheels the image installs (wheelhouse/): the project's, built here, and its server
## extra's dependencies for the image's Python and this CPU (scripts/wheelhouse.sh).
wheelhouse: $(STAMP)
	PYTHON=$(BIN)/python scripts/wheelhouse.sh

## The sidecar's image, dsh-system-prompt:VERSION, with docker or podman, offline: from the
## wheelhouse, --network none (scripts/image.sh; deploy/kubernetes/README.md).
image: $(STAMP)
	PYTHON=$(BIN)/python scripts/image.sh

## podman, runc, catatonit (kube play's pause image) and debootstrap (a local build image when
## none can be pulled), from Debian, when missing.
IMAGE_PACKAGES := podman runc catatonit debootstrap containernetworking-plugins iptables
image-tools:
	@if command -v podman >/dev/null && command -v runc >/dev/null \
	  && command -v catatonit >/dev/null && command -v debootstrap >/dev/null; then exit 0; fi; \
	sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	$$sudo apt-get install -y -q --no-install-recommends $(IMAGE_PACKAGES) >/dev/null \
	  || { $$sudo apt-get update -q >/dev/null && \
	       $$sudo apt-get install -y -q --no-install-recommends $(IMAGE_PACKAGES) >/dev/null; }

## Build the image and run real containers and pods of it (tests/image; not part of
## `make test`): health check, security context, the manifests' pods, reload, SIGTERM,
## restart, kube play. Podman's state stays in build/containers/ (scripts/image-test.sh).
image-test: $(STAMP) image-tools
	PYTHON=$(BIN)/python scripts/image-test.sh $(PYTEST_ARGS)

## The image's figures: size, what it adds over its base, start to serving, idle RSS.
bench-image: $(STAMP) image-tools
	PYTHON=$(BIN)/python scripts/image-test.sh --bench --write
