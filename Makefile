# One obvious entry point per activity. Everything installs what it needs itself (root, Debian 12).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
CACHE ?= $(HOME)/.cache/gpubox
export GPUBOX_CACHE := $(CACHE)
export GPUBOX_APTREPO := $(CACHE)/aptrepo/repo
export PATH := $(abspath $(VENV))/bin:$(PATH)
export ANSIBLE_FORCE_COLOR := 0
export PY_COLORS := 0
# run_scenarios.py starts them in this order, JOBS at a time. fleet (the longest, three CPU engines) runs
# beside the scenarios without a CPU engine; the other CPU-engine scenarios (crash, day2_model, serving)
# come after it: vLLM's CPU workers busy-poll, and engines sharing the 2 cores starve each other's start.
SCENARIOS ?= fleet day2_driver fleet_cache default topology_4x4090 refusals crash day2_model serving python_env_conda host_ubuntu
JOBS ?= 2

.PHONY: help venv lock lint unit vllm073 harness molecule test bench plan lock-models verify demo demo-clean clean promtool

help:
	@echo "make demo | test | lint | unit | vllm073 | molecule | bench | plan [INVENTORY=…] [LIMIT=group|host] [EXTRA='k=v …'] | lock-models | verify | lock | clean"

$(VENV)/.stamp: requirements-dev.lock pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements-dev.lock
	touch $@

# The venv sees this checkout's collection (ansible_collections.gpubox.gpubox) through a .pth file.
venv: $(VENV)/.stamp
	@echo "$(abspath collections)" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gpubox-collection.pth"

lock: ## re-resolve the tooling pins from pyproject.toml into requirements-dev.lock
	rm -rf .lockvenv && python3 -m venv .lockvenv
	.lockvenv/bin/pip install -q --disable-pip-version-check \
	  $$(python3 -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
	.lockvenv/bin/pip freeze --exclude gpubox | sort > requirements-dev.lock
	rm -rf .lockvenv

# ansible-test sanity runs on a copy of the collection's plugins (tools/sanity.sh): locally, no docker.
# Skipped for the environment only: compile/import on Pythons other than the venv's (Debian 12 ships
# 3.11 alone); the box's 3.10 is checked with vermin instead (syntax and standard library).
# tools/secrets_scan.py: detect-secrets over every tracked file against the audited .secrets.baseline.
lint: venv
	ruff check . && ruff format --check .
	yamllint -s .
	check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	ansible-lint
	tools/sanity.sh
	$(PY) tools/secrets_scan.py

# promtool from Debian's `prometheus` package, unpacked into the cache (no Prometheus server installed or
# started): tests/unit/test_prometheus.py checks the scrape config and alert rules with it.
PROMTOOL_DIR := $(CACHE)/promtool
export GPUBOX_PROMTOOL := $(PROMTOOL_DIR)/usr/bin/promtool
promtool: $(GPUBOX_PROMTOOL)
$(GPUBOX_PROMTOOL):
	rm -rf $(PROMTOOL_DIR).tmp && mkdir -p $(PROMTOOL_DIR).tmp
	cd $(PROMTOOL_DIR).tmp && { apt-get download prometheus 2>/dev/null || { apt-get update -qq && apt-get download prometheus; }; }
	dpkg-deb -x $(PROMTOOL_DIR).tmp/prometheus_*.deb $(PROMTOOL_DIR).tmp/root
	rm -rf $(PROMTOOL_DIR) && mv $(PROMTOOL_DIR).tmp/root $(PROMTOOL_DIR) && rm -rf $(PROMTOOL_DIR).tmp
	$(GPUBOX_PROMTOOL) --version | head -1

# host-setup.sh: the host packages the unit tests use too (idempotent, quick when present).
unit: venv promtool
	molecule/shared/host-setup.sh
	pytest -q tests/unit

# The production command lines of both topologies, parsed by vLLM 0.7.3's own argument parser
# (installs the real vLLM 0.7.3 stack, about 7 GB, into a cached venv).
vllm073: venv
	pytest -q -m vllm073 tests/vllm073

harness: venv
	molecule/shared/host-setup.sh
	molecule/shared/image/build.sh
	$(PY) molecule/shared/aptrepo/build_repo.py --out $(GPUBOX_APTREPO) --cache $(CACHE)/aptrepo

molecule: harness
	$(PY) tools/run_scenarios.py --jobs $(JOBS) $(SCENARIOS)

test: lint unit vllm073 molecule

bench: venv
	$(PY) tools/bench.py --out bench/results.md

# The memory plan of each box (one per group when its hosts share every fact), from the inventory as
# Ansible reads it, over roles/gpubox/defaults; no box needed. LIMIT: groups or hosts, comma-separated
# (default: the topology groups; GROUP= still works); EXTRA: as ansible-playbook -e.
INVENTORY ?= inventories/production
LIMIT ?= $(GROUP)
plan: export GPUBOX_PLAN_EXTRA = $(EXTRA)
plan: venv
	$(PY) tools/plan.py -i $(INVENTORY) $(if $(strip $(LIMIT)),-l '$(strip $(LIMIT))') $${GPUBOX_PLAN_EXTRA:+-e "$$GPUBOX_PLAN_EXTRA"}

# Day two, the model (README): lock each box's branch to the commit the hub names now (written to
# <inventory>/models.lock.json), and re-hash each box's live model against its manifest.
lock-models: venv
	ansible-playbook -i $(INVENTORY) playbooks/lock_models.yml $(if $(strip $(LIMIT)),-l '$(strip $(LIMIT))')

verify: venv
	ansible-playbook -i $(INVENTORY) playbooks/verify.yml $(if $(strip $(LIMIT)),-l '$(strip $(LIMIT))')

demo: harness
	$(PY) tools/demo.py up

demo-clean: venv
	$(PY) tools/demo.py down

clean:
	rm -rf $(VENV) .cache
