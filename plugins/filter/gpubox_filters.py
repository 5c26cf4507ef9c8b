"""Jinja2 filters of the gpubox collection: thin wrappers over plugins/module_utils.

    {{ host | gpubox.gpubox.preflight(config) }}          -> {errors, warnings, plan, table}
    {{ vars | gpubox.gpubox.state_errors }}               -> problems of the desired state ([] when valid)
    {{ model | gpubox.gpubox.plan(gpu, serving[, engine]) }} -> memory plan of vLLM's start-up (engine v0: 0.7.3, v1)
    {{ plan | gpubox.gpubox.plan_table }}                 -> the plan as a text table
    {{ journal | gpubox.gpubox.vllm_startup }}            -> vLLM's start-up KV figures (weights, KV GiB, tokens)
    {{ measured | gpubox.gpubox.kv_report_line(plan, pin) }} -> the report's line: measured vs planned, the pin
    {{ state | gpubox.gpubox.kv_pin_decision(fact, checksum, measured, now) }} -> keep/drop/write the box's KV pin
    {{ fact | gpubox.gpubox.kv_pin_env }}                 -> GPUBOX_KV_CACHE_PIN=--kv-cache-memory-bytes=N
    {{ state | gpubox.gpubox.kv_pin_argument }}           -> "$GPUBOX_KV_CACHE_PIN" where the box pins its KV cache
    {{ model_id | gpubox.gpubox.expected_model(config) }} -> the model facts preflight plans from
    {{ config_json | gpubox.gpubox.config_mismatches(model_id, config) }}
    {{ state | gpubox.gpubox.vllm_args(host) }}           -> vLLM 0.7.3 api_server arguments
    {{ args | gpubox.gpubox.systemd_args }}               -> one ExecStart=/Environment= string
    {{ nets | gpubox.gpubox.network_errors('name') }}     -> problems of a CIDR list (or ports, port_rules) knob
    {{ nets | gpubox.gpubox.networks_by_family }}         -> {ipv4: [...], ipv6: [...]} (normalized)
    {{ text | gpubox.gpubox.ssh_connection }}             -> {client, port} of SSH_CONNECTION, or {}
    {{ nets | gpubox.gpubox.lockout_errors(addr, 'name') }} -> [] when nets admit the controller's address
    {{ boot_id | gpubox.gpubox.reboot_decision(own_reasons=..., ...) }} -> the reboot gate's record
    {{ record | gpubox.gpubox.reboot_message }}           -> the gate's one line
    {{ dpkg_query_stdout | gpubox.gpubox.dpkg_installed }} -> {name: version} of the packages on disk
    {{ packages | gpubox.gpubox.kernel_module_plan(policy, secure_boot, signed, branch) }}
                                                          -> what keeps a nvidia module for every kernel
    {{ packages | gpubox.gpubox.driver_branch_plan(distribution, release, branch, version, signed, flavour) }}
                                                          -> the driver move (purge, install, hold, reboot; problems)
    {{ knob | gpubox.gpubox.driver_snapshot(stack, distribution, version, service, suites, components, keyring,
                                            packages) }} -> the archive snapshot of the driver packages (its files,
                                                          its look-up script; problems)
    {{ policy | gpubox.gpubox.driver_snapshot_foreign(origin, uri) }} -> other sources on the snapshot's host
    {{ gpubox_tenants | gpubox.gpubox.tenant_key_map(gpubox_api_key) }} -> [[regex, tenant], ...] (SECRET: no_log)
    {{ gpubox_tenants | gpubox.gpubox.tenant_keys(gpubox_api_key) }}    -> [[key, tenant], ...] (SECRET: no_log)

The logic (and its tests) lives in module_utils; errors that are the user's are raised as
AnsibleFilterError naming the variable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.gpubox.gpubox.plugins.module_utils import (
    capacity_planner,
    driver_branch,
    driver_snapshot,
    kernel_modules,
    kv_pin,
    model_catalog,
    net_checks,
    preflight_checks,
    reboot_policy,
    state_checks,
    tenants,
    vllm_cmdline,
)
from ansible_collections.gpubox.gpubox.plugins.module_utils import vllm_startup as startup


def plan(model: dict, gpu: dict, serving: dict, engine: str = capacity_planner.DEFAULT_ENGINE) -> dict:
    """Plan vLLM's memory for an engine (v0: vLLM 0.7.3; v1: the lts stack's); errors come back in the result."""
    return capacity_planner.plan(model, gpu, serving, engine)


def catalog_model(model_id: str) -> dict:
    """Catalog facts for a ModelScope id; unknown ids fail naming gpubox_model_id and the known ids."""
    try:
        return model_catalog.catalog_model(model_id)
    except model_catalog.UnknownModelError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def expected_model(model_id: str, model_config: dict | None = None) -> dict:
    """The model facts preflight plans from: gpubox_model_config when given, else the catalog entry."""
    try:
        return model_catalog.expected_model(model_id, model_config)
    except (model_catalog.UnknownModelError, ValueError) as exc:
        raise AnsibleFilterError(str(exc)) from exc


def config_mismatches(config_json: dict, model_id: str, model_config: dict | None = None) -> list[str]:
    """Where a downloaded config.json disagrees with the facts preflight planned from (empty: agrees)."""
    return model_catalog.config_mismatches(expected_model(model_id, model_config), config_json)


def vllm_startup(journal: Any) -> dict[str, Any]:
    """vLLM's start-up memory figures in a journal excerpt (module_utils.vllm_startup.measured)."""
    return startup.measured(journal)


def kv_report_line(measured: Any, plan: Any, pin: Any = None) -> str:
    """The report's line: the plan's KV cache against what vLLM measured, and the value to pin (or the box's pin)."""
    return startup.compared(plan, measured if isinstance(measured, dict) else {}, pin)


def kv_pin_decision(state: Any, fact: Any, unit_checksum: Any, measured: Any = None, now: str = "") -> dict[str, Any]:
    """Keep, drop or write the box's own KV cache pin (module_utils.kv_pin.decide)."""
    return kv_pin.decide(state, fact, unit_checksum, measured, now)


def kv_pin_env(fact: Any) -> str:
    """The pin's environment file line (module_utils.kv_pin.env_line)."""
    return kv_pin.env_line(fact)


def kv_pin_argument(state: Any) -> str:
    """The unit's pin argument ($GPUBOX_KV_CACHE_PIN) where the box pins its KV cache, else "" (kv_pin.argument)."""
    return kv_pin.argument(state)


def plan_table(result: dict[str, Any]) -> str:
    """A fixed-width text table of a plan, followed by its errors and warnings."""
    return capacity_planner.plan_table(result)


def preflight(host: dict, config: dict) -> dict:
    """Check a box against its desired state: {errors, warnings, plan, table}. Bad input never raises."""
    return preflight_checks.preflight(host, config)


def state_errors(values: Mapping[str, Any]) -> list[str]:
    """Every problem of the desired state (the gpubox_* facts), one line each naming the variable."""
    return state_checks.validate(values).errors


def vllm_args(
    state: Mapping[str, Any],
    host: str = "0.0.0.0",
    disable_log_requests: bool = True,
    refuse_request_chat_template: bool = False,
) -> list[str]:
    """vLLM 0.7.3 api_server arguments from the desired state (gpubox_* facts) and the role's knobs."""
    try:
        return vllm_cmdline.vllm_args(state, host, disable_log_requests, refuse_request_chat_template)
    except vllm_cmdline.VllmProfileError as exc:
        raise AnsibleFilterError(f"gpubox.gpubox.vllm_args: {exc}") from exc


def systemd_args(args: Sequence[Any], variables: bool = True) -> str:
    try:
        return vllm_cmdline.systemd_quote(args, variables)
    except vllm_cmdline.VllmProfileError as exc:
        raise AnsibleFilterError(f"gpubox.gpubox.systemd_args: {exc}") from exc


_NET_KINDS = {"networks": net_checks.networks, "ports": net_checks.ports, "port_rules": net_checks.port_rules}


def network_errors(value: Any, name: str, kind: str = "networks") -> list[str]:
    """Problems of a role's knob of ``kind`` networks (CIDR list), ports or port_rules: [] when valid."""
    try:
        _NET_KINDS[kind](name, value)
    except net_checks.NetworkError as exc:
        return [str(exc)]
    except KeyError:
        raise AnsibleFilterError(f"gpubox.gpubox.network_errors: kind must be one of {sorted(_NET_KINDS)}") from None
    return []


def networks_by_family(value: Any, name: str = "networks") -> dict[str, list[str]]:
    """Normalized networks split into ipv4 and ipv6 (validate.yml has refused bad ones before)."""
    try:
        return net_checks.split_families(net_checks.networks(name, value))
    except net_checks.NetworkError as exc:
        raise AnsibleFilterError(f"gpubox.gpubox.networks_by_family: {exc}") from exc


def ssh_connection(value: Any) -> dict[str, Any]:
    """{client, port} of OpenSSH's SSH_CONNECTION as the box saw it, or {} (another connection)."""
    return net_checks.ssh_connection(value)


def lockout_errors(value: Any, client: Any, name: str) -> list[str]:
    """Problems of a network knob that would not admit ``client`` (the controller's address): [] when it does."""
    return net_checks.lockout_errors(name, value, client)


def reboot_decision(boot_id: Any, **inputs: Any) -> dict[str, Any]:
    """The reboot gate's record: {boot_id, reasons, decision, skip_causes, skipped_by, deferred_by, policy}."""
    try:
        return reboot_policy.reboot_decision(str(boot_id), **inputs)
    except reboot_policy.RebootPolicyError as exc:
        raise AnsibleFilterError(f"gpubox.gpubox.reboot_decision: {exc}") from exc


def reboot_message(record: Mapping[str, Any]) -> str:
    return reboot_policy.reboot_message(dict(record))


def kernel_module_plan(
    packages: Any, policy: str | None = None, secure_boot: bool = False, signed: bool = False, branch: str = "535"
) -> dict:
    """Packages that keep a nvidia module for every installed kernel; policy: `apt-cache policy` output."""
    candidates = None if policy is None else kernel_modules.parse_policy(str(policy))
    return kernel_modules.kernel_module_plan(
        list(packages), candidates, secure_boot=bool(secure_boot), signed_modules=bool(signed), branch=str(branch)
    )


def dpkg_installed(text: Any) -> dict[str, str]:
    """name -> version of the packages on disk, from ``dpkg-query --show`` in module_utils/dpkg.FORMAT."""
    return driver_branch.dpkg_installed(str(text or ""))


def driver_branch_plan(
    packages: Any,
    distribution: str,
    release: str,
    branch: str,
    version: str,
    signed: bool = False,
    flavour: str = "",
) -> dict:
    """The driver move from the installed packages, name -> version (dpkg_installed); a refusal is in problems.

    plugins/module_utils/driver_branch.py decides."""
    return driver_branch.plan_facts(
        dict(packages or {}),
        str(distribution),
        str(release),
        str(branch),
        str(version),
        signed_modules=bool(signed),
        kernel_flavour=str(flavour or ""),
    )


def driver_snapshot_plan(
    knob: Any,
    stack: Mapping[str, Any],
    distribution: str,
    version: str,
    service: str,
    suites: Sequence[str],
    components: Sequence[str],
    keyring: str,
    packages: Sequence[str],
) -> dict:
    """The archive snapshot the driver packages come from (plugins/module_utils/driver_snapshot.py decides)."""
    return driver_snapshot.decide(
        knob,
        dict(stack or {}),
        str(distribution),
        str(version),
        str(service or ""),
        list(suites or []),
        list(components or []),
        str(keyring or ""),
        list(packages or []),
    )


def driver_snapshot_foreign(policy: Any, origin: str, uri: str) -> list[str]:
    """Package files of `apt-cache policy` on the snapshot's host that are not the snapshot's own."""
    return driver_snapshot.foreign_sources(str(policy or ""), str(origin), str(uri))


def _tenants(value: Any, api_key: Any, who: str) -> list[tenants.Tenant]:
    try:
        return tenants.parse(value, api_key)
    except tenants.TenantError as exc:  # the lines name positions and fields, never a key
        raise AnsibleFilterError(f"gpubox.gpubox.{who}: " + "; ".join(exc.problems)) from None


def tenant_key_map(value: Any, api_key: Any) -> list[list[str]]:
    """nginx's map of Authorization to the tenant: [regular expression, tenant name] per tenant. Holds the keys."""
    return [list(line) for line in tenants.nginx_key_map(_tenants(value, api_key, "tenant_key_map"))]


def tenant_keys(value: Any, api_key: Any) -> list[list[str]]:
    """Every key and its tenant, [key, name], in the inventory's order (HAProxy's map file). Holds the keys."""
    return [[key, t.name] for t in _tenants(value, api_key, "tenant_keys") for key in t.keys]


class FilterModule:
    """gpubox filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "plan": plan,
            "catalog_model": catalog_model,
            "expected_model": expected_model,
            "config_mismatches": config_mismatches,
            "plan_table": plan_table,
            "vllm_startup": vllm_startup,
            "kv_report_line": kv_report_line,
            "kv_pin_decision": kv_pin_decision,
            "kv_pin_env": kv_pin_env,
            "kv_pin_argument": kv_pin_argument,
            "preflight": preflight,
            "state_errors": state_errors,
            "vllm_args": vllm_args,
            "systemd_args": systemd_args,
            "network_errors": network_errors,
            "networks_by_family": networks_by_family,
            "ssh_connection": ssh_connection,
            "lockout_errors": lockout_errors,
            "reboot_decision": reboot_decision,
            "reboot_message": reboot_message,
            "kernel_module_plan": kernel_module_plan,
            "driver_branch_plan": driver_branch_plan,
            "dpkg_installed": dpkg_installed,
            "driver_snapshot": driver_snapshot_plan,
            "driver_snapshot_foreign": driver_snapshot_foreign,
            "tenant_key_map": tenant_key_map,
            "tenant_keys": tenant_keys,
        }
