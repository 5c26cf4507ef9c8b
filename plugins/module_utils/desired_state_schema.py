"""The schema of the desired state: one typed row for every variable of roles/gpubox, in one table.

A row says a variable's name, its argument-spec type (and choices), its default, whether null is an error,
its one-line description and hint, how state_checks checks it, the vLLM 0.7.3 flag it renders (how, where on
the command line, when it is left out) and the capacity planner's key for it. Nothing else writes these down:

- generated from ROWS by tools/gen_schema.py (tests/unit/test_schema.py fails when one is stale):
  roles/gpubox/defaults/main.yml, roles/gpubox/meta/argument_specs.yml, and (through tools/role_readme.py,
  which it runs) the variables tables of roles/gpubox/README.md and docs/deploy.md;
- derived from ROWS when imported: state_checks.FACTS (checker, required, hint), state_checks.RENDERED_FLAGS
  and FLAG_ALIASES (what gpubox_vllm_extra_args refuses), vllm_cmdline's command line, and
  capacity_planner.INVENTORY_NAMES.

Rows with a ``check`` are desired-state facts (validated by state_checks, read through the
gpubox.gpubox.desired_state lookup); rows without one are the role's shared switches. Adding a vLLM flag is one
row here and one test line (docs/design.md, "Adding a vLLM flag"). Imports only vllm_words and stacks (leaves), so every
module that checks facts can import it without a cycle (tests/unit/test_imports.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks
from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_words import DTYPES, KV_CACHE_DTYPES, QUANTIZATIONS


@dataclass(frozen=True)
class Flag:
    """How a fact reaches vLLM 0.7.3's command line.

    ``renders``: "value" (the flag, then the value), "switch" (the bare flag when the value is true), or
    "fixed" (vllm_cmdline composes it: --model from the root and the id). ``slot``: its place on the command
    line, ascending; existing slots never move, so no box's unit changes when a flag is added. ``omit``:
    values left out besides null (vLLM's own default: the command line stays the seed's). ``aliases``: the
    single-dash spellings vLLM defines for it. ``source``: what to set instead, when it is not the fact.
    ``stacks``: the stacks (plugins/module_utils/stacks.py) whose vLLM has the flag; empty = every stack (each
    stack's rendered command line is parsed by that release's own parser: tests/vllm073, tests/vllm032).
    ``inverted``: a switch rendered when the value is false (a knob whose flag was turned around by a release).
    """

    name: str
    slot: int
    renders: str = "value"
    omit: tuple[Any, ...] = ()
    aliases: tuple[str, ...] = ()
    source: str = ""
    stacks: tuple[str, ...] = ()
    inverted: bool = False

    def in_stack(self, stack: str) -> bool:
        return not self.stacks or stack in self.stacks


@dataclass(frozen=True)
class Row:
    """One variable of roles/gpubox.

    ``type``/``elements``: the argument spec's (Ansible checks them before any task runs), and ``choices``
    unless ``type_note`` says why the spec is wider than the fact (a raw type, no choices; a comment in the
    spec). ``doc_type``: the type
    as the tables say it, with the range ("int 1-64, required"). ``check``: state_checks' checker: "int"
    (``low``..``high``, ``example`` in the message), "fraction", "bool", "choice" (``choices``) or the name
    of one of state_checks' own checkers; "" for a shared switch. ``required``: null is an error, with
    ``hint`` as the fix. ``planner``: the capacity planner's input key. ``section``/``comment``: the lines
    above it in defaults/main.yml.
    """

    name: str
    type: str
    description: str
    default: Any = None
    doc_type: str = ""
    check: str = ""
    required: bool = False
    hint: str = ""
    low: int = 0
    high: int = 0
    example: str = ""
    choices: tuple[Any, ...] = ()
    elements: str = ""
    type_note: str = ""
    flag: Flag | None = None
    planner: str = ""
    secret: bool = False
    section: str = ""
    comment: str = ""


TOPOLOGY = "put the host in one topology group (gpu_2x3090, gpu_4x4090) whose group_vars set it"
# The spellings state_checks reads as null ("", none, null, ~): Ansible's int/dict conversion refuses them.
_NULL_TEXT = "raw: state_checks reads '', 'none', 'null' and '~' (from -e) as unset, which type {0} would refuse"
_STRIPPED = "no choices: state_checks accepts a value with surrounding spaces (from -e), which choices would refuse"

ROWS: tuple[Row, ...] = (
    Row(
        "gpubox_stack",
        "str",
        "The stack the box runs (plugins/module_utils/stacks.py): driver branch and version, CUDA toolkit, Python, "
        f"vLLM and torch pins with their hash lock and advisories. {', '.join(stacks.NAMES)}.",
        default=stacks.DEFAULT,
        check="stack",
        choices=stacks.NAMES,
        type_note=_STRIPPED,
        required=True,
        hint=f"use {stacks.DEFAULT} (the design card's stack) or lts-580 (driver R580, vLLM 0.32.0)",
        section="the stack: driver, CUDA, Python and vLLM pins (plugins/module_utils/stacks.py)",
        comment="One name for everything that moves together: pinned-0.7.3 (R535, CUDA 12.2, vLLM 0.7.3, the design\n"
        "card's) or lts-580 (R580, CUDA 13.0, vLLM 0.32.0). Per group; make plan and preflight print its support ends.",
    ),
    Row(
        "gpubox_gpu_name",
        "str",
        "nvidia-smi product name every GPU must have, e.g. 'NVIDIA GeForce RTX 3090'.",
        doc_type="str, required",
        check="gpu_name",
        required=True,
        hint=TOPOLOGY,
        planner="gpu.name",
        section="GPUs the box must have",
    ),
    Row(
        "gpubox_gpu_count",
        "int",
        "Number of NVIDIA GPUs the box must have.",
        doc_type="int 1-64, required",
        check="int",
        low=1,
        high=64,
        example="2",
        required=True,
        hint=TOPOLOGY,
        planner="gpu.count",
    ),
    Row(
        "gpubox_gpu_memory_mib",
        "int",
        "nvidia-smi memory.total of each GPU in MiB (24576 for a 3090).",
        doc_type="int, required",
        check="int",
        low=1024,
        high=1 << 22,
        example="24576",
        required=True,
        hint=TOPOLOGY,
        planner="gpu.memory_total_mib",
    ),
    Row(
        "gpubox_model_id",
        "str",
        "ModelScope id 'owner/name' of the model to serve.",
        doc_type="str, required",
        check="model_id",
        required=True,
        hint=TOPOLOGY,
        planner="model",
        section="the model",
    ),
    Row(
        "gpubox_model_revision",
        "str",
        "ModelScope revision (branch, tag or commit) to download.",
        default="master",
        check="revision",
        required=True,
        hint="set the revision to serve (a commit pins the weights)",
    ),
    Row(
        "gpubox_model_lock_file",
        "path",
        "Lock file pinning a branch or tag to the commit it was resolved to (make lock-models, or the first "
        "converge); '' for none. Default: models.lock.json beside the inventory.",
        default="{{ (inventory_dir ~ '/models.lock.json') if inventory_dir | default('', true) else '' }}",
        doc_type="path on the controller",
        check="lock_file",
        comment="The lock file (on the controller) that pins a branch or tag to the commit it was resolved to\n"
        "(plugins/module_utils/lock_file.py; `make lock-models`); '' for none.",
    ),
    Row(
        "gpubox_model_accept_unpinned",
        "bool",
        "true: serve a model lock entry that pins the commit but not its content (no content_sha256); false "
        "refuses it, naming its line.",
        default=False,
        check="bool",
        required=True,
        hint="use false (content pinned by the lock), or true to accept an entry without content_sha256",
        comment="A lock entry without content_sha256 pins the commit, not the files: refused unless this is true.",
    ),
    Row(
        "gpubox_model_dtype",
        "str",
        f"vLLM --dtype: {', '.join(DTYPES)}.",
        default="auto",
        check="choice",
        choices=DTYPES,
        type_note=_STRIPPED,
        required=True,
        hint="use auto, or the model's torch_dtype",
        flag=Flag("--dtype", 110),
        planner="model.torch_dtype",
    ),
    Row(
        "gpubox_model_quantization",
        "str",
        "The stack's vLLM --quantization method (awq_marlin, gptq_marlin, fp8, mxfp4 on lts-580, ...); null for none.",
        doc_type="str or null",
        check="choice",
        choices=QUANTIZATIONS,
        type_note=_STRIPPED,
        flag=Flag("--quantization", 120, aliases=("-q",)),
        planner="model.quantization",
    ),
    Row(
        "gpubox_model_config",
        "raw",
        "A model outside the capacity catalog: its published config.json whole as config_json, plus weights_bytes "
        "(the size of its weight files); or the config.json facts the planner reads (+ weights_bytes).",
        doc_type="dict or null",
        check="model_config",
        type_note=_NULL_TEXT.format("dict"),
        comment="config.json facts of a model outside the capacity catalog (plugins/module_utils/model_catalog.py).",
    ),
    Row(
        "gpubox_tensor_parallel_size",
        "int",
        "vLLM --tensor-parallel-size.",
        default=1,
        doc_type="int 1-64",
        check="int",
        low=1,
        high=64,
        example="2",
        required=True,
        hint=TOPOLOGY,
        flag=Flag("--tensor-parallel-size", 50, aliases=("-tp",)),
        planner="serving.tensor_parallel_size",
        section="serving profile (vLLM 0.7.3)",
    ),
    Row(
        "gpubox_pipeline_parallel_size",
        "int",
        "vLLM --pipeline-parallel-size.",
        default=1,
        doc_type="int 1-64",
        check="int",
        low=1,
        high=64,
        example="1",
        required=True,
        hint="use 1",
        flag=Flag("--pipeline-parallel-size", 60, omit=(1,), aliases=("-pp",)),
        planner="serving.pipeline_parallel_size",
    ),
    Row(
        "gpubox_gpu_memory_utilization",
        "float",
        "vLLM --gpu-memory-utilization.",
        default=0.9,
        doc_type="number in (0, 1]",
        check="fraction",
        required=True,
        hint="use 0.9",
        flag=Flag("--gpu-memory-utilization", 70),
        planner="serving.gpu_memory_utilization",
    ),
    Row(
        "gpubox_max_model_len",
        "int",
        "vLLM --max-model-len (context length in tokens).",
        doc_type="int, required",
        check="int",
        low=1,
        high=1 << 24,
        example="8192",
        required=True,
        hint=TOPOLOGY,
        flag=Flag("--max-model-len", 80),
        planner="serving.max_model_len",
    ),
    Row(
        "gpubox_max_num_seqs",
        "int",
        "vLLM --max-num-seqs (256 is vLLM's default).",
        default=256,
        check="int",
        low=1,
        high=1 << 16,
        example="256",
        required=True,
        hint="use 256 (vLLM's default)",
        flag=Flag("--max-num-seqs", 90),
        planner="serving.max_num_seqs",
    ),
    Row(
        "gpubox_max_num_batched_tokens",
        "raw",
        "vLLM --max-num-batched-tokens; null: vLLM's default.",
        doc_type="int or null",
        check="int",
        low=1,
        high=1 << 24,
        example="8192",
        type_note=_NULL_TEXT.format("int"),
        flag=Flag("--max-num-batched-tokens", 100),
        planner="serving.max_num_batched_tokens",
    ),
    Row(
        "gpubox_kv_cache_dtype",
        "str",
        f"vLLM --kv-cache-dtype: {', '.join(KV_CACHE_DTYPES)}.",
        default="auto",
        check="choice",
        choices=KV_CACHE_DTYPES,
        type_note=_STRIPPED,
        required=True,
        hint="use auto",
        flag=Flag("--kv-cache-dtype", 130, omit=("auto",)),
        planner="serving.kv_cache_dtype",
    ),
    Row(
        "gpubox_block_size",
        "raw",
        "vLLM --block-size: 8, 16 or 32; null: vLLM's 16.",
        doc_type="int or null",
        check="block_size",
        type_note=_NULL_TEXT.format("int"),
        flag=Flag("--block-size", 140),
        planner="serving.block_size",
    ),
    Row(
        "gpubox_enforce_eager",
        "bool",
        "vLLM --enforce-eager (no CUDA graphs).",
        default=False,
        check="bool",
        required=True,
        hint="use false",
        flag=Flag("--enforce-eager", 150, renders="switch"),
        planner="serving.enforce_eager",
    ),
    Row(
        "gpubox_speculative_config",
        "raw",
        "vLLM --speculative-config on lts-580 (vLLM 0.32): {method: ngram, mtp, draft_model, eagle or eagle3, "
        "num_speculative_tokens: 1-16}; ngram takes prompt_lookup_min/max; draft_model and eagle/eagle3 name a second "
        "checkpoint (model: OWNER/NAME, revision, and config as in gpubox_model_config when it is not in the catalog), "
        "which the model store fetches, verifies and publishes beside the model. The planner counts its memory. Null "
        "for none.",
        doc_type="dict or null",
        check="speculative_config",
        type_note=_NULL_TEXT.format("dict"),
        flag=Flag("--speculative-config", 170, aliases=("-sc",), stacks=("lts-580",)),
        planner="serving.speculative_config",
    ),
    Row(
        "gpubox_kv_cache_memory_bytes",
        "raw",
        "vLLM --kv-cache-memory-bytes on lts-580: the KV cache budget per GPU in bytes, pinned instead of profiled "
        "for every box of the group; null: the box pins what vLLM measured at its unit's first start for the later "
        "starts (ansible_local.gpubox_kv_pin; measured again when the unit changes).",
        doc_type="int or null",
        check="int",
        low=1 << 26,
        high=1 << 44,
        example="13900000000",
        type_note=_NULL_TEXT.format("int"),
        flag=Flag("--kv-cache-memory-bytes", 180, stacks=("lts-580",)),
        planner="serving.kv_cache_memory_bytes",
    ),
    Row(
        "gpubox_capacity_measured_start",
        "bool",
        "lts-580: start a model whose architecture the planner does not model (MLA, Nemotron-H, ...) unplanned, "
        "gpubox_gpu_memory_utilization <= 0.85, then pin vLLM's measured KV cache (docs/planner.md). false: refused.",
        default=False,
        check="bool",
        required=True,
        hint="use false, or true on lts-580 for a measured start (docs/planner.md)",
        planner="serving.measured_start",
    ),
    Row(
        "gpubox_served_model_name",
        "str",
        "Name clients ask for (vLLM --served-model-name); not a flag.",
        doc_type="str, required",
        check="served_name",
        required=True,
        hint=TOPOLOGY,
        flag=Flag("--served-model-name", 20, renders="fixed"),
    ),
    Row(
        "gpubox_port",
        "int",
        "Port vLLM listens on (on 127.0.0.1 only when the front door is enabled).",
        default=8000,
        doc_type="int 1-65535",
        check="int",
        low=1,
        high=65535,
        example="8000",
        required=True,
        hint="use 8000",
        flag=Flag("--port", 40, renders="fixed"),
    ),
    Row(
        "gpubox_vllm_extra_args",
        "list",
        "More vLLM api_server arguments; flags gpubox renders, the API key and flags that change memory the "
        "capacity planner does not model (chunked prefill, CPU offload, swap space, LoRA, a GPU block override, "
        "a draft model) are refused in any spelling.",
        default=[],
        doc_type="list of str",
        elements="str",
        check="extra_args",
        required=True,
        hint="use []",
        comment="More api_server flags, one argument per item; a flag gpubox renders, the API key or a flag that "
        "changes memory\nthe capacity planner does not model (state_checks.PLANNER_BLIND_FLAGS) is refused.",
    ),
    Row(
        "gpubox_api_key",
        "str",
        "API key clients send; from Ansible Vault (vault_gpubox_api_key), 16+ of letters, digits, ._~+/=:@,-.",
        default="{{ vault_gpubox_api_key | default('') }}",
        doc_type="str, secret",
        check="api_key",
        required=True,
        hint="set vault_gpubox_api_key in Ansible Vault",
        secret=True,
        comment="From Ansible Vault. Letters, digits and ._~+/=:@,- only, 16+ characters.",
    ),
    Row(
        "gpubox_tenants",
        "list",
        "Who may call the API: a list of {name, keys (from Ansible Vault), requests_per_s, burst, streams, body_max, "
        "models}; the front door refuses (401) any other key and limits each tenant apart; models (served model "
        "names; left out: every model) is what the tenant may use, at the gateway and at each box. [] = one tenant, "
        "default, whose key is gpubox_api_key.",
        default=[],
        doc_type="list of dict, secret",
        elements="dict",
        check="tenants",
        required=True,
        hint="use [] (one tenant, default, with gpubox_api_key) or list your tenants",
        secret=True,
        comment="Tenants of the front door (plugins/module_utils/tenants.py): each {name, keys, requests_per_s, burst, "
        "streams,\nbody_max, models}, its keys from Ansible Vault; limits left out take the defaults (20/s, burst 40, "
        "256 streams, 4m);\nmodels left out: every model.\n[] = one tenant, default, whose key is gpubox_api_key. "
        "Rotate a key: add the new one, converge, retire the old one,\nconverge (each a reload that drops no stream).",
    ),
    Row(
        "gpubox_model_root",
        "path",
        "Model store root; the live model is <root>/<model name>. Not a system directory.",
        default="/data/models",
        doc_type="absolute path",
        check="model_root",
        required=True,
        hint="use /data/models",
        flag=Flag("--model", 10, renders="fixed", source="gpubox_model_root (the published model directory)"),
        section="where things live on the box",
        comment="The live model is <root>/<name of gpubox_model_id>, a link into <root>/.versions/.",
    ),
    Row(
        "gpubox_env_prefix",
        "path",
        "Prefix of the Python environment (venv or conda) vLLM runs from; null: the stack's own ("
        + ", ".join(f"{name} {stack.env_prefix}" for name, stack in stacks.STACKS.items())
        + "), so a stack move builds beside the old environment and a move back downloads nothing. "
        "Set, it is every stack's: a move reinstalls it in place.",
        doc_type="absolute path or null",
        check="env_prefix",
        comment="The Python environment vLLM runs from (venv or conda prefix). null: the stack's own (stacks.py:\n"
        + ", ".join(f"{stack.env_prefix} for {name}" for name, stack in stacks.STACKS.items())
        + "),\nso moving a group to another stack and back keeps both environments (docs/day-two.md). A path here is\n"
        "one environment for every stack: a move reinstalls it in place and a move back downloads again.",
    ),
    Row(
        "gpubox_front_door_enabled",
        "bool",
        "nginx terminates TLS on gpubox_front_door_port in front of vLLM, which then listens on 127.0.0.1 only; "
        "readiness and the report go through it.",
        default=True,
        check="bool",
        required=True,
        hint="use true (nginx with TLS in front of vLLM)",
        section="the front door and who may reach what",
        comment="nginx (roles/front_door) terminates TLS on this port and forwards to vLLM, which then listens on\n"
        "127.0.0.1:gpubox_port only; readiness and the report go through it. false: vLLM is reached directly\n"
        "(set vllm_service_host yourself) and the firewall opens no front door port.",
    ),
    Row(
        "gpubox_front_door_port",
        "int",
        "HTTPS port of the front door (clients, readiness, the firewall); not gpubox_port.",
        default=443,
        doc_type="int 1-65535",
        check="int",
        low=1,
        high=65535,
        example="443",
        required=True,
        hint="use 443",
    ),
    Row(
        "gpubox_scrape_networks",
        "list",
        "Networks allowed to scrape /metrics (and /health) at the front door and the firewall's metrics ports; "
        "loopback always is.",
        default=[],
        doc_type="list of CIDR",
        elements="str",
        check="networks",
        required=True,
        hint="use [] (loopback only) or your Prometheus networks",
        comment="Networks (CIDR) whose Prometheus may scrape this box: the front door's /metrics and /health, and "
        "the\nfirewall's metrics ports. Loopback always may; [] means nobody else.",
    ),
    Row(
        "gpubox_in_container",
        "bool",
        "True in a container (default detected from virtualization facts); silicon-only tasks are skipped then.",
        default="{{ (ansible_facts.virtualization_role | default('')) == 'guest'\n"
        "   and (ansible_facts.virtualization_type | default('')) in ['container', 'podman', 'docker', 'lxc', "
        "'systemd-nspawn'] }}",
        section="shared switches",
        comment="The ONE condition that separates a container from a box with silicon. Tasks that need silicon\n"
        "(loading kernel modules, applying vm.* sysctls, starting nvidia-persistenced, rebooting) are skipped\n"
        "when it is true. Detected from Ansible's virtualization facts; override only to force it.",
    ),
    Row(
        "gpubox_sysfs_root",
        "str",
        "Root of the sysfs tree the GPU facts read (tests use a fake one).",
        default="/",
        comment='Root under which sys/bus/pci/devices and sys/module live ("/" on a real box; tests point it at a '
        "fake\nsysfs tree).",
    ),
    Row(
        "gpubox_etc_dir",
        "str",
        "Directory for gpubox's own configuration files on the box.",
        default="/etc/gpubox",
        comment="Where gpubox keeps its own configuration on the box.",
    ),
    Row(
        "gpubox_gpu_unhealthy_file",
        "path",
        "Exists exactly while the box's GPUs are unhealthy (roles/metrics writes it); the front door's /health "
        "answers 503 while it exists, so the gateway stops sending the box requests.",
        default="/run/gpubox-gpu-metrics/unhealthy",
        comment="Exists exactly while the box's GPUs are unhealthy (a failed nvidia-smi, a missing GPU, a fatal Xid): "
        "written\nby roles/metrics' gpubox-gpu-metrics, read by roles/front_door's /health, which answers 503 while "
        "it exists.",
    ),
    Row(
        "gpubox_gpu_check_state_file",
        "path",
        "The GPU check's verdict (JSON) that roles/gpu_tuning writes at each boot and converge; the converge saves "
        "it as the local fact gpubox_gpu_check and roles/metrics exports its peer-to-peer verdict.",
        default="/var/lib/gpubox/gpu-check.json",
        comment="The GPU check's verdict (JSON), written at each boot and converge by roles/gpu_tuning's "
        "gpubox-gpu-check, read by\nthe converge (the local fact gpubox_gpu_check) and by roles/metrics' collector "
        "(gpubox_gpu_p2p_enabled).",
    ),
    Row(
        "gpubox_unit_validator",
        "str",
        "Helper that runs systemd-analyze verify on a unit file under its unit name.",
        default="/usr/local/libexec/gpubox/verify-unit",
        comment="The helper that runs `systemd-analyze verify` on a unit before it lands (tasks/unit_validator.yml).",
    ),
    Row(
        "gpubox_nginx_check",
        "str",
        "Checker that runs nginx -t on a file for nginx's http context (front_door's and fleet_cache's validate:).",
        default="/usr/local/libexec/gpubox/nginx-check",
        comment="The checker that runs `nginx -t` on a file for nginx's http context before it lands, in a main "
        "configuration of its\nown (tasks/nginx_check.yml); roles/front_door and roles/fleet_cache validate with it.",
    ),
    Row(
        "gpubox_reboot_skip",
        "bool",
        "Do not reboot this box now even when the host layer needs it (the reason is still reported); works per host.",
        default=False,
        comment="A box that must not reboot now (the reason is still reported); host_vars may set it.",
    ),
    Row(
        "gpubox_reboot_policy",
        "str",
        "idle: reboot for gpubox's own host-layer reasons on a box that is not serving; a serving box's reboot, and "
        "one only /var/run/reboot-required asks for, is deferred to playbooks/rebuild.yml (after the drain). "
        "always: reboot for any reason now.",
        default="idle",
        choices=("idle", "always"),
        comment="When the host layer's reboot may happen (plugins/module_utils/reboot_policy.py). idle: for gpubox's "
        "own\nreasons on a box that is not serving; a serving box's reboot, and one only /var/run/reboot-required "
        "asks\nfor, is deferred (reported, kept pending) until playbooks/rebuild.yml drains the box. always: any "
        "reason,\nnow, serving or not (rebuild.yml's converge of a drained box runs with it).",
    ),
    Row(
        "gpubox_fleet_cache_url",
        "str",
        "http(s)://HOST[:PORT] of the LAN cache host (roles/fleet_cache): apt's http sources (via HOST:3142), "
        "pip's index and the model hub go through it; the box still verifies everything. '' = upstream.",
        default="",
        doc_type="URL or ''",
        check="cache_url",
        section="the LAN cache (roles/fleet_cache, issue 8)",
        comment="http(s)://HOST[:PORT] of the fleet's cache host; '' = every box goes upstream itself. Set, boxes "
        "take\napt (http sources, through HOST:3142), pip's index and the model hub through it and still verify\n"
        "everything (apt signatures, pip pins, the model's sha256 manifest; http also re-hashes the live model).",
    ),
    Row(
        "gpubox_fleet_cache_trust_first_fetch",
        "bool",
        "true: a box may fetch its model through the LAN cache with no model lock entry for it, trusting the "
        "commit and content the cache first serves; false refuses that before any change (run make lock-models).",
        default=False,
        check="bool",
        required=True,
        hint="use false and run make lock-models (it asks the hub, never the cache), or true to trust the cache",
        comment="A model lock entry is written from the hub, never from the cache: a box's fetch through the cache\n"
        "needs one first (make lock-models), unless this is true (the cache's first answer is then trusted).",
    ),
)

BY_NAME: dict[str, Row] = {row.name: row for row in ROWS}
# The desired-state facts, in table order (state_checks checks them in this order).
FACT_ROWS: tuple[Row, ...] = tuple(row for row in ROWS if row.check)
SECRET_FACTS = frozenset(row.name for row in ROWS if row.secret)

# Flags gpubox renders from its own role knobs, not from a fact (vllm_cmdline takes them as arguments).
# vllm_service_disable_log_requests (true by default): vLLM 0.7.3 logs every request unless --disable-log-requests;
# vLLM 0.32.0 has no such flag (its parser refuses it) and logs requests only with --enable-log-requests.
KNOB_FLAGS: tuple[Flag, ...] = (
    Flag("--host", 30, renders="fixed", source="vllm_service_host"),
    Flag(
        "--disable-log-requests",
        160,
        renders="switch",
        source="vllm_service_disable_log_requests",
        stacks=("pinned-0.7.3",),
    ),
    Flag(
        "--enable-log-requests",
        160,
        renders="switch",
        source="vllm_service_disable_log_requests",
        stacks=("lts-580",),
        inverted=True,
    ),
)

# Flags of vLLM 0.7.3 that a stack's release no longer has (each checked in that release's own parser: tests/vllm032),
# and what to do instead: gpubox_vllm_extra_args refuses them by name on that stack, before any change.
# Flags a stack's vLLM release no longer has, each with what to do instead: the release's record (vllm_words).
REMOVED_FLAGS: dict[str, dict[str, str]] = {
    name: dict(stack.words.removed_flags) for name, stack in stacks.STACKS.items() if stack.words.removed_flags
}


def command_line(stack: str = "") -> list[tuple[Flag, str]]:
    """Every flag gpubox renders for ``stack`` ("" = every flag of every stack), in command-line order: (flag, the
    fact's name or "" for a role knob). Two flags of one stack never share a slot."""
    flags = [(row.flag, row.name) for row in ROWS if row.flag] + [(flag, "") for flag in KNOB_FLAGS]
    for name in stacks.NAMES:
        slots = [flag.slot for flag, _fact in flags if flag.in_stack(name)]
        if len(set(slots)) != len(slots):
            raise ValueError(f"two rendered flags of stack {name} share a slot: {sorted(slots)}")
    if stack:
        flags = [item for item in flags if item[0].in_stack(stack)]
    return sorted(flags, key=lambda item: (item[0].slot, item[0].name))


def rendered_flags() -> dict[str, str]:
    """Each rendered flag of any stack and what sets it (in command-line order; the extra-args refusal reads it)."""
    return {flag.name: flag.source or name for flag, name in command_line()}


def flag_aliases() -> dict[str, str]:
    """The single-dash aliases vLLM defines for rendered flags, and the flag each stands for."""
    return {alias: flag.name for flag, _name in command_line() for alias in flag.aliases}


def inventory_names() -> dict[str, str]:
    """The capacity planner's input keys and the fact that sets each."""
    return {row.planner: row.name for row in ROWS if row.planner}
