# paystream — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO            ?= go
GOLANGCI_LINT_VERSION := v2.6.2
PKGS          := ./...
DATA_DIR      ?= .data
SOURCES       ?= deploy/sources.example.yaml
STACK         := deploy/stack.sh
FUZZTIME      ?= 60s
BIN           ?= bin/paystream
LAB_BIN       ?= bin/paystream-lab
IMAGE         ?= paystream:local

# What `paystream version` and paystream_build_info report: `git describe` of the checkout (a
# tag, tag-N-gCOMMIT, or the commit; -dirty with uncommitted changes) and the commit. Set
# them to stamp something else: make build VERSION=v1.2.0.
VERSION       ?= $(shell git describe --tags --always --dirty 2>/dev/null)
REVISION      ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS       := -X main.version=$(VERSION) -X main.revision=$(REVISION)

# Integration tests need a real Postgres and Kafka. Unless the caller points
# PAYSTREAM_TEST_* at its own, bring up the local stack and use it.
define with_stack
	if [ -z "$$PAYSTREAM_TEST_DATABASE_URL" ] || [ -z "$$PAYSTREAM_TEST_KAFKA_BROKERS" ]; then \
		$(STACK) up >&2 && eval "$$($(STACK) env)"; \
	fi;
endef

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_-]+:.*##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

.PHONY: run
run: build ## Run the whole pipeline in one process (embedded Kafka, private Postgres under .data/).
	$(BIN) dev --data-dir $(DATA_DIR) --sources $(SOURCES)

.PHONY: build
build: ## Build bin/paystream (BIN), stamped with VERSION and REVISION, and the tools' bin/paystream-lab (LAB_BIN: simulate, loadgen).
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/paystream
	$(GO) build -o $(LAB_BIN) ./cmd/paystream-lab

.PHONY: test
test: ## Run every test (race detector, shuffled) against the local stack, started if needed.
	@$(with_stack) $(GO) test -race -shuffle=on -timeout 20m $(PKGS)

.PHONY: test-slow
test-slow: ## Run every test plus the slow ones (a 2-minute Postgres outage) against the local stack.
	@$(with_stack) PAYSTREAM_SLOW_TESTS=1 $(GO) test -race -shuffle=on -timeout 30m $(PKGS)

.PHONY: test-short
test-short: ## Run only the tests that need no Postgres, Kafka or Docker (integration tests skip under -short).
	env -u PAYSTREAM_TEST_DATABASE_URL -u PAYSTREAM_TEST_KAFKA_BROKERS $(GO) test -race -shuffle=on -short $(PKGS)

.PHONY: stack-up
stack-up: ## Install (if missing) and start PostgreSQL and Kafka 4 (KRaft) on loopback.
	$(STACK) up

.PHONY: stack-down
stack-down: ## Stop the local stack (data kept; `deploy/stack.sh down --purge` deletes it).
	$(STACK) down

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 60s).
	@set -e; for pkg in $$($(GO) list ./...); do \
		for fn in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz' || true); do \
			echo "== $$pkg $$fn"; $(GO) test -run='^$$' -fuzz="^$$fn$$" -fuzztime=$(FUZZTIME) $$pkg; \
		done; \
	done

.PHONY: bench
bench: ## Run the Go benchmarks (pure packages).
	$(GO) test -run='^$$' -bench=. -benchmem ./internal/...

.PHONY: lint
lint: ## Run golangci-lint (pinned version).
	$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) run ./...

.PHONY: tidy-check
tidy-check: ## Fail if go.mod/go.sum are not tidy.
	$(GO) mod tidy -diff

.PHONY: clean
clean: ## Remove build output and the dev data dir.
	rm -rf bin $(DATA_DIR)

.PHONY: bench-processor
bench-processor: build ## Processor throughput (batched vs one tx per event) and peak RSS on the real stack.
	@$(with_stack) $(GO) run ./bench/processor -binary bin/paystream $(BENCH_PROCESSOR_FLAGS)

.PHONY: bench-e2e
bench-e2e: build ## End to end: ingest, processor, sink vs a synchronous baseline, same workload (minutes; BENCH_E2E_FLAGS=-quick for a smoke run, "-rate 5000" for latency at a fixed rate).
	@$(with_stack) $(GO) run ./bench/e2e -binary bin/paystream -json bin/bench-e2e.json $(BENCH_E2E_FLAGS)

.PHONY: bench-ingest
bench-ingest: ## Ingest vs a bare HMAC handler on the local Kafka, then p50/p99 at 5,000 req/s (≈1.5 min).
	@$(with_stack) $(GO) run ./bench/ingest $(BENCH_ARGS)

.PHONY: chaos
chaos: build ## Chaos suite: faults while ≥20,000 simulated webhooks flow, then verify (≈15–21 min; CHAOS=name,... CHAOS_FLAGS=-deliveries 3000).
	@$(with_stack) $(GO) run ./bench/chaos -binary bin/paystream -json bin/chaos.json -scenarios "$(or $(CHAOS),all)" $(CHAOS_FLAGS)

.PHONY: loadgen
loadgen: build ## Send signed webhooks to a running ingest, e.g. make loadgen ARGS="--rate 1000/s -d 30s".
	$(LAB_BIN) loadgen --sources $(SOURCES) $(ARGS)

# --- Docker: docker-compose.yml, deploy/Dockerfile and testenv's testcontainers path, run
# on offline stand-in images (deploy/images.sh; see deploy/README.md, "Docker").
CONTAINER_PKGS ?= ./internal/testenv ./processor ./internal/e2e

.PHONY: images
images: ## Start Docker if needed and build the offline stand-in images (deploy/images.sh).
	deploy/images.sh engine && deploy/images.sh build

.PHONY: image
image: ## Build the paystream image IMAGE from deploy/Dockerfile, stamped with VERSION and REVISION (PAYSTREAM_GO_IMAGE, PAYSTREAM_RUNTIME_IMAGE: its base images).
	DOCKER_BUILDKIT=1 docker build -f deploy/Dockerfile -t $(IMAGE) \
		--build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
		$(if $(PAYSTREAM_GO_IMAGE),--build-arg GO_IMAGE=$(PAYSTREAM_GO_IMAGE)) \
		$(if $(PAYSTREAM_RUNTIME_IMAGE),--build-arg RUNTIME_IMAGE=$(PAYSTREAM_RUNTIME_IMAGE)) .

.PHONY: compose-test
compose-test: build ## docker-compose.yml end to end on the stand-ins: signed webhooks reach `paid` and the state topic.
	deploy/compose-test.sh

.PHONY: test-containers
# No -race here: `make test` runs these packages with the race detector on the local stack;
# this run proves the testcontainers path, and each extra -race run adds exposure to a data
# race inside franz-go v1.22.3's Client.close (a fetch started by a late offset listing).
test-containers: images ## Run CONTAINER_PKGS on testenv's own Kafka and Postgres containers (testcontainers, stand-in images).
	@eval "$$(deploy/images.sh env)"; \
	env -u PAYSTREAM_TEST_DATABASE_URL -u PAYSTREAM_TEST_KAFKA_BROKERS TESTCONTAINERS_RYUK_DISABLED=true \
		$(GO) test -shuffle=on -timeout 20m $(CONTAINER_PKGS); rc=$$?; \
	left=$$(docker ps -aq --filter label=paystream.testenv); \
	if [ -n "$$left" ]; then \
		echo "test-containers: testenv left containers behind: $$left (removing)" >&2; \
		docker rm -f $$left >/dev/null; rc=1; \
	fi; exit $$rc
