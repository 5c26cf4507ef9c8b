"""Lookup plugin: the checked desired state of the current host (every gpubox_* fact)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: desired_state
author: gpubox developers (!UNKNOWN)
short_description: The checked desired state of a gpubox
description:
  - Reads every fact of the desired state (the gpubox_* variables listed in
    plugins/module_utils/state_checks.py, defaulted in the gpubox role) from the current variables,
    checks each with the one validator, and returns the normalized values without the API key
    (C(gpubox_api_key_set) says whether it is valid), the derived C(gpubox_model_name) and
    C(gpubox_model_dir), and C(errors), one line per problem naming the variable and the fix.
  - Reads the model lock (C(gpubox_model_lock_file), on the controller) and adds
    C(gpubox_model_commit), the commit to serve (the revision when it is a commit, else its lock
    entry, else null), C(gpubox_model_fetch_revision), what the model store asks the hub for, and
    C(gpubox_model_content_sha256), the content the entry pins; an entry that pins no content is an
    error naming its line unless C(gpubox_model_accept_unpinned) is true.
  - Adds C(gpubox_model_checkpoints), every checkpoint the model store publishes, each with the same readings
    of the lock (C(model_id), C(revision), C(name), C(commit), C(fetch_revision), C(content_sha256),
    C(cache_fetch_refusal)) and C(kind) (C(model), or C(draft) for the second checkpoint of
    C(gpubox_speculative_config)), C(fact) (its local fact) and C(config) (its config.json facts, if given).
  - Adds C(gpubox_model_cache_fetch_refusal), null or why the box may not fetch its model yet (through the
    LAN cache, C(gpubox_fleet_cache_url), with no lock entry for it, unless
    C(gpubox_fleet_cache_trust_first_fetch) is true). Not one of C(errors), since C(make lock-models), which
    writes that entry, runs with it; the model store's input checks (preflight, the role) refuse it.
  - Adds C(gpubox_fleet_cache) (C(apt_proxy), C(pypi_index), C(model_endpoint), all empty without a
    LAN cache) derived from C(gpubox_fleet_cache_url), and refuses a cache URL that names a host of
    the C(gpu_boxes) group (its inventory name or C(ansible_host)).
  - Adds C(gpubox_stack_info), the row of C(gpubox_stack) in plugins/module_utils/stacks.py (driver branch and
    versions, CUDA toolkit, Python, pin files, advisories, engine), null when the stack name is not one of the table.
  - Use it with C(query(...) | first); it takes no terms.
options:
  _terms:
    description: Not used.
    required: false
"""

EXAMPLES = r"""
- name: Show the model directory vLLM will serve
  ansible.builtin.debug:
    msg: "{{ (query('gpubox.gpubox.desired_state') | first).gpubox_model_dir }}"
"""

RETURN = r"""
_raw:
  description: One mapping of the normalized facts, the derived paths and C(errors).
  type: list
  elements: dict
"""

from ansible.plugins.lookup import LookupBase  # noqa: E402 - after the documentation, as Ansible plugins are laid out

from ansible_collections.gpubox.gpubox.plugins.module_utils import (  # noqa: E402
    lock_file,
    speculative_config,
    state_checks,
)


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}
        raw, template_errors = {}, []
        for name in state_checks.FACTS:
            if name not in variables:
                continue
            try:
                raw[name] = self._templar.template(variables[name])
            except Exception as exc:
                raw[name] = state_checks.UNSET
                template_errors.append(f"{name} could not be templated: {exc}")
        public = state_checks.validate(raw).public()
        public["errors"] = template_errors + public["errors"] + self._lock(public) + self._cache_host(public, variables)
        return [public]

    def _cache_host(self, public, variables):
        """A LAN cache (gpubox_fleet_cache_url) on one of the inventory's GPU boxes is refused."""
        url = public.get("gpubox_fleet_cache_url")
        if not url:
            return []
        hostvars = variables.get("hostvars") or {}
        boxes = {}
        for host in (variables.get("groups") or {}).get("gpu_boxes", []):
            try:
                address = self._templar.template(hostvars[host].get("ansible_host", host))
            except Exception:
                address = host
            boxes[host] = [address]
        problem = state_checks.fleet_cache_host_problem(url, boxes)
        return [problem] if problem else []

    @staticmethod
    def _lock(public):
        """Add gpubox_model_commit (the commit to serve: the revision when it is a commit, else its entry
        in gpubox_model_lock_file, else None) and gpubox_model_fetch_revision (what the store asks the
        hub for), and gpubox_model_checkpoints: the same for every checkpoint the model store publishes (the
        served model, then a speculative draft or EAGLE head); return the lock file's problems. The lock is read
        here, on the controller."""
        path = public.get("gpubox_model_lock_file")
        errors, entries = [], {}
        if path:
            try:
                entries = lock_file.read_lock(path)
            except lock_file.LockError as exc:
                errors.append(f"gpubox_model_lock_file: {exc}")
        checkpoints, read = [], not errors
        speculative = public.get("gpubox_speculative_config")
        for kind, fact, model_id, revision, config in (
            ("model", "gpubox_model", public.get("gpubox_model_id"), public.get("gpubox_model_revision"),
             public.get("gpubox_model_config")),
            ("draft", "gpubox_model_draft", *(
                (speculative.get("model"), speculative.get("revision"), speculative.get("config"))
                if speculative_config.is_draft(speculative) else (None, None, None))),
        ):  # fmt: skip
            if isinstance(model_id, str) and isinstance(revision, str):
                checkpoints.append(LookupModule._checkpoint(public, entries, read, errors, model_id, revision, path))
                checkpoints[-1].update(kind=kind, fact=fact, config=config)
        main = checkpoints[0] if checkpoints and checkpoints[0]["kind"] == "model" else {}
        public["gpubox_model_commit"] = main.get("commit")
        # Why a fetch through the LAN cache may not start yet (no lock entry for it), or None.
        public["gpubox_model_cache_fetch_refusal"] = next(
            (c["cache_fetch_refusal"] for c in checkpoints if c["cache_fetch_refusal"]), None
        )
        public["gpubox_model_fetch_revision"] = main.get("fetch_revision", public.get("gpubox_model_revision"))
        # The content the lock pins (model_store refuses any other, whatever the channel), or None.
        public["gpubox_model_content_sha256"] = main.get("content_sha256")
        public["gpubox_model_checkpoints"] = checkpoints
        return errors

    @staticmethod
    def _checkpoint(public, entries, read, errors, model_id, revision, path):
        """One checkpoint's reading of the lock (``read``: the lock file was read): its commit, what to fetch, its
        pinned content, why a fetch through the LAN cache may not start; an entry that pins no content is added to
        ``errors``."""
        unpinned = None
        if path and read:
            unpinned = lock_file.unpinned_problem(
                entries, model_id, revision, public.get("gpubox_model_accept_unpinned") is True, path
            )
            if unpinned:
                errors.append(f"gpubox_model_lock_file: {unpinned}")
        commit = lock_file.locked_commit(entries, model_id, revision)
        refusal = (
            lock_file.cache_fetch_problem(
                entries,
                model_id,
                revision,
                public.get("gpubox_fleet_cache_url"),
                public.get("gpubox_fleet_cache_trust_first_fetch") is True,
                path or "",
            )
            if read and not unpinned
            else None
        )
        return {
            "model_id": model_id,
            "revision": revision,
            "name": model_id.rsplit("/", 1)[-1],
            "commit": commit,
            "fetch_revision": commit or revision,
            "content_sha256": lock_file.locked_content(entries, model_id, revision),
            "cache_fetch_refusal": refusal,
        }
