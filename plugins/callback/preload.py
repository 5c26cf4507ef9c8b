# Copyright: gpubox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: preload
type: aggregate
short_description: Load this collection's controller-side plugins once, before the first task
description:
  - Ansible runs every task of every host in a worker process forked from the controller, and a worker
    loads the filter, lookup and action plugins its task needs itself. For a collection's plugins that
    means reading and compiling their Python and the module_utils they import (Ansible's collection
    loader keeps no bytecode), about 0.2 s of CPU for this collection's filters, in every worker of
    every task that uses one.
  - This callback loads them once in the controller process when the playbook starts, so that every
    worker inherits them already loaded. It prints nothing and changes nothing else.
  - Enabled in the repository's ansible.cfg (callbacks_enabled).
requirements:
  - enabled in callbacks_enabled
"""

from pathlib import Path  # noqa: E402 - after the documentation, as Ansible plugins are laid out

from ansible.plugins.callback import CallbackBase  # noqa: E402
from ansible.plugins.loader import action_loader, filter_loader, lookup_loader, test_loader  # noqa: E402

COLLECTION = "gpubox.gpubox"
# A name no plugin has: looking it up makes the Jinja2 plugin loaders read every file of the collection's
# filter and test directories (a collection's filters are found by scanning its files), which is the load.
_NO_SUCH_PLUGIN = f"{COLLECTION}.__gpubox_preload__"


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = f"{COLLECTION}.preload"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook) -> None:
        plugins = Path(__file__).resolve().parent.parent
        for kind, loader in (("filter", filter_loader), ("test", test_loader)):
            if (plugins / kind).is_dir():  # the loader raises for a kind the collection has no directory of
                loader.get(_NO_SUCH_PLUGIN)
        for path in sorted((plugins / "lookup").glob("*.py")):
            lookup_loader.get(f"{COLLECTION}.{path.stem}")
        for path in sorted((plugins / "action").glob("*.py")):
            action_loader.get(f"{COLLECTION}.{path.stem}", class_only=True)
