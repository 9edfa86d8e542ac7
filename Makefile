# The two commands of the README: `make demo` (run) and `make test` (all tests).
SHELL := /bin/bash
export CARGO_TARGET_DIR ?= $(HOME)/.cache/proxyfleet/target
export PATH := $(HOME)/.cargo/bin:$(PATH)
K8S_BIN := $(shell . e2e/lib/versions.sh && echo $$K8S_BIN)

.PHONY: demo test lint unit e2e images cluster-up cluster-down crds bench setup

## Run: local cluster + operator + a sample ProxyDeployment serving traffic + a canary.
demo: setup
	@bash scripts/demo.sh

## Test: formatting, lint, unit + integration tests, then e2e on the real local cluster.
test: setup lint unit e2e

setup:
	@bash scripts/setup.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	$(K8S_BIN)/helm lint charts/proxyfleet
	$(K8S_BIN)/helm template x charts/proxyfleet --kube-version 1.34.0 --set leaderElection=false 2>&1 | grep -q 'leaderElection: false with replicaCount > 1'
	lua5.1 e2e/gitops/argocd-health-test.lua charts/proxyfleet/files/argocd-health.lua
	lua5.1 e2e/gitops/argocd-health-approllout-test.lua charts/proxyfleet/files/argocd-health-approllout.lua
	bash scripts/check-readme.sh
	bash scripts/deny.sh

unit:
	cargo test --workspace --locked

e2e:
	bash e2e/run-tests

images:
	bash e2e/images/build

cluster-up:
	bash e2e/cluster up

cluster-down:
	bash e2e/cluster down --all

crds:
	cargo run -q -p proxyfleet-operator --bin crdgen > crds/proxydeployments.proxyfleet.io.yaml
	cp crds/proxydeployments.proxyfleet.io.yaml charts/proxyfleet/crds/
	cargo run -q -p proxyfleet-operator --bin crdgen -- --app > crds/approllouts.proxyfleet.io.yaml
	cp crds/approllouts.proxyfleet.io.yaml charts/proxyfleet/crds/
	cargo run -q -p proxyfleet-operator --bin crdgen -- --policy > crds/proxyfleetpolicies.proxyfleet.io.yaml
	cp crds/proxyfleetpolicies.proxyfleet.io.yaml charts/proxyfleet/crds/
	cargo run -q -p proxyfleet-operator --bin crdgen -- --reference > docs/crd-reference.md

bench:
	bash bench/run.sh
