"""The stacks (gpubox_stack, plugins/module_utils/stacks.py) and what the roles read of them (issue 33, item 1).

The default stack must render exactly what the roles rendered before stacks existed: the values below are the
ones roles/nvidia_driver, roles/cuda_toolkit and roles/python_env carried in their defaults and vars files
(git history: the commit before this test), rendered here by Ansible's own variable manager and templar.
lts-580 is the control: the same expressions render its values, so the test would see a stack that is ignored.
"""

from __future__ import annotations

import datetime
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks, state_checks
from harness import markdown
from harness.ansible_vars import render

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("gpubox", "nvidia_driver", "cuda_toolkit", "python_env")
UBUNTU = {"distribution": "Ubuntu", "distribution_major_version": "22"}
DEBIAN = {"distribution": "Debian", "distribution_major_version": "12"}
EXPRESSIONS = {
    "branch": "__nvidia_driver_branch",
    "driver_version": "__nvidia_driver_version_default",
    "cuda": "__cuda_toolkit_version",
    "requirements": "__python_env_requirements_src",
    "constraints": "__python_env_constraints_src",
    "hash_lock": "__python_env_hashes_src",
    "conda_python": "__python_env_python_version",
    "venv_python": "__python_env_system_python",
    "venv_packages": "__python_env_packages.venv",
}


def rendered(facts: dict[str, str], stack: str | None = None, **extra: Any) -> dict[str, Any]:
    """The EXPRESSIONS for a host of gpu_2x3090 on ``facts``' distribution, as the roles' tasks see them: the
    distribution's vars files as include_vars loads them, role_path as python_env's."""
    distro = f"{facts['distribution']}-{facts['distribution_major_version']}.yml"
    extra_vars: dict[str, Any] = {"ansible_facts": facts, "role_path": str(ROOT / "roles" / "python_env")}
    for role in ("nvidia_driver", "python_env"):
        extra_vars.update(yaml.safe_load((ROOT / "roles" / role / "vars" / distro).read_text()))
    extra_vars.update(extra)
    if stack is not None:
        extra_vars["gpubox_stack"] = stack
    expression = "{" + ", ".join(f"'{key}': {value}" for key, value in EXPRESSIONS.items()) + "}"
    out = render("unit-gpu_2x3090", expression, roles=ROLES, extra_vars=extra_vars, groups=("gpu_2x3090",))
    files = ROOT / "roles" / "python_env" / "files"
    for key in ("requirements", "constraints", "hash_lock"):
        out[key] = str(Path(out[key]).relative_to(files)) if out[key].startswith(str(files)) else out[key]
    return out


# What the roles rendered before stacks existed (roles/nvidia_driver/vars/<distro>.yml, its branch default "535",
# roles/cuda_toolkit's "12.2", roles/python_env's pin files, its conda "3.10" and the distro's python3).
BEFORE = {
    "Ubuntu": {
        "branch": "535",
        "driver_version": "535.274.02-0ubuntu0.22.04.1",
        "cuda": "12.2",
        "requirements": "requirements-vllm-0.7.3.txt",
        "constraints": "constraints-vllm-0.7.3.txt",
        "hash_lock": "constraints-vllm-0.7.3.hashes.txt",
        "conda_python": "3.10",
        "venv_python": "/usr/bin/python3",
        "venv_packages": ["python3", "python3-venv", "ca-certificates"],
    },
}
BEFORE["Debian"] = {**BEFORE["Ubuntu"], "driver_version": "535.261.03-1"}


@pytest.mark.parametrize("facts", [UBUNTU, DEBIAN], ids=["ubuntu-22.04", "debian-12"])
def test_the_default_stack_renders_what_the_roles_rendered_before_stacks(facts: dict[str, str]) -> None:
    assert rendered(facts) == BEFORE[facts["distribution"]]
    assert rendered(facts, "pinned-0.7.3") == BEFORE[facts["distribution"]]


def test_control_lts_580_renders_its_own_values() -> None:
    assert rendered(UBUNTU, "lts-580") == {
        "branch": "580",
        "driver_version": "580.178.04-0ubuntu0.22.04.1",
        "cuda": "13.0",
        "requirements": "requirements-vllm-0.32.0.txt",
        "constraints": "constraints-vllm-0.32.0.txt",
        "hash_lock": "constraints-vllm-0.32.0.hashes.txt",
        "conda_python": "3.11",
        # vLLM 0.32.0 needs Python >= 3.11: Ubuntu 22.04's python3 is 3.10, so the archive's python3.11
        "venv_python": "/usr/bin/python3.11",
        "venv_packages": ["python3.11", "python3.11-venv", "ca-certificates"],
    }
    debian = rendered(DEBIAN, "lts-580")
    assert debian["venv_python"] == "/usr/bin/python3"  # Debian 12's python3 is 3.11
    assert debian["driver_version"] == ""  # no R580 in bookworm: the driver role asks for nvidia_driver_version


def test_role_knobs_still_override_the_stack() -> None:
    out = rendered(
        UBUNTU,
        "lts-580",
        nvidia_driver_branch="570",
        cuda_toolkit_version="12.8",
        python_env_python_version="3.12",
        python_env_constraints_file="/srv/pins/constraints.txt",
    )
    assert (out["branch"], out["cuda"], out["conda_python"]) == ("570", "12.8", "3.12")
    assert out["constraints"] == "/srv/pins/constraints.txt"
    assert out["hash_lock"] == "/srv/pins/constraints.hashes.txt"


@pytest.mark.parametrize("bad", ["lts-570", "pinned", "", "LTS-580", 580])
def test_a_bad_stack_name_is_one_line_naming_the_fact_and_the_allowed_values(bad: Any) -> None:
    _value, error = state_checks.check("gpubox_stack", bad)
    assert error is not None
    assert error.startswith("gpubox_stack ")
    for name in stacks.NAMES:
        assert name in error
    if bad == "":
        assert "is not set" in error  # '' reads as unset: the fact is required


def test_a_stack_name_with_spaces_from_extra_vars_is_read() -> None:
    assert state_checks.check("gpubox_stack", " lts-580 ") == ("lts-580", None)


def test_the_desired_state_names_the_stack_the_roles_read() -> None:
    state = state_checks.validate({"gpubox_stack": "lts-580"}).public()
    assert state["gpubox_stack_info"] == stacks.info("lts-580")
    assert state["gpubox_stack_info"]["engine"] == "v1"
    bad = state_checks.validate({"gpubox_stack": "nope"}).public()
    assert bad["gpubox_stack_info"] is None
    assert any(line.startswith("gpubox_stack must be one of") for line in bad["errors"])


def test_every_stack_names_files_that_exist_and_an_engine() -> None:
    files = ROOT / "roles" / "python_env" / "files"
    for stack in stacks.STACKS.values():
        for name in (stack.requirements, stack.constraints, stack.hash_lock, stack.advisories):
            assert (files / name).is_file(), f"{stack.name}: {name}"
        assert stack.engine in stacks.ENGINES
        assert f"vllm=={stack.vllm}" in (files / stack.requirements).read_text()
        constraints = (files / stack.constraints).read_text()
        assert f"\nvllm=={stack.vllm}\n" in constraints and f"\ntorch=={stack.torch}\n" in constraints
    assert stacks.STACKS[stacks.DEFAULT].engine == "v0" and stacks.STACKS["lts-580"].engine == "v1"


def test_support_ends_are_read_as_dates() -> None:
    r535 = stacks.STACKS["pinned-0.7.3"].support[0]
    assert r535.last_day() == datetime.date(2026, 6, 30)
    assert r535.state(datetime.date(2026, 6, 30)).endswith("supported until 2026-06")
    assert "ENDED 2026-06" in r535.state(datetime.date(2026, 7, 1))
    r580 = stacks.STACKS["lts-580"].support[0]
    assert r580.last_day() == datetime.date(2028, 6, 30)
    ubuntu = stacks.STACKS["lts-580"].support[1]
    assert ubuntu.last_day() == datetime.date(2027, 4, 1)
    assert "no upstream support" in stacks.STACKS["pinned-0.7.3"].support[2].state(datetime.date(2026, 1, 1))


def test_summary_lines_name_the_stack_its_support_and_its_open_advisories() -> None:
    lines = stacks.summary_lines("pinned-0.7.3", datetime.date(2026, 12, 4))
    assert lines[0].startswith("stack pinned-0.7.3: driver R535")
    assert "NVIDIA driver R535: support ENDED 2026-06" in "\n".join(lines)
    open_line = lines[-1]
    assert "open advisories (accepted, unfixed): " in open_line
    assert int(open_line.split(": ")[1].split(" ")[0]) == stacks.open_advisories(stacks.STACKS["pinned-0.7.3"]) > 0
    lts = stacks.summary_lines("lts-580", datetime.date(2026, 12, 4))
    assert "NVIDIA driver R580 (LTSB): supported until 2028-06" in "\n".join(lts)
    assert "open advisories (accepted, unfixed): 0 " in lts[-1]


# --- models only a newer stack serves (issue 33, item 3's catalog part) ----------------------------------------------


def test_a_model_only_the_new_stack_serves_is_refused_on_the_pinned_stack_naming_the_stack_that_serves_it() -> None:
    from ansible_collections.gpubox.gpubox.plugins.module_utils import model_catalog

    assert model_catalog.min_vllm("Qwen/Qwen3-8B") == "0.8.4"
    errors = state_checks.validate({"gpubox_model_id": "Qwen/Qwen3-8B", "gpubox_stack": "pinned-0.7.3"}).errors
    refusal = [line for line in errors if line.startswith("gpubox_model_id 'Qwen/Qwen3-8B' needs vLLM >= 0.8.4")]
    assert len(refusal) == 1, errors
    assert "gpubox_stack pinned-0.7.3 runs vLLM 0.7.3" in refusal[0]
    assert "set gpubox_stack: lts-580 (vLLM 0.32.0)" in refusal[0]


def test_control_the_same_model_on_lts_580_and_an_old_model_on_either_stack_are_not_refused() -> None:
    for model, stack in (("Qwen/Qwen3-8B", "lts-580"), ("Qwen/Qwen2.5-14B-Instruct", "pinned-0.7.3")):
        errors = state_checks.validate({"gpubox_model_id": model, "gpubox_stack": stack}).errors
        assert not [line for line in errors if "needs vLLM" in line], (model, stack, errors)


def test_the_plan_refuses_the_model_by_name_before_planning(capsys: pytest.CaptureFixture[str]) -> None:
    import plan as plan_tool

    argv = ["-l", "gpu_2x3090", "-e", "gpubox_model_id=Qwen/Qwen3-8B", "-e", "gpubox_served_model_name=qwen3"]
    assert plan_tool.main(argv) == 1
    out, err = capsys.readouterr()
    assert "nothing planned" in err and "gpubox_model_id 'Qwen/Qwen3-8B' needs vLLM >= 0.8.4" in err
    assert "set gpubox_stack: lts-580" in err and "budget per GPU" not in out
    assert plan_tool.main([*argv, "-e", "gpubox_stack=lts-580"]) == 0  # control: the stack that serves it plans it
    assert "budget per GPU" in capsys.readouterr().out


# --- the command line per stack (issue 33, item 2) ---------------------------------------------------------------


def _state(stack: str, **facts: Any) -> dict[str, Any]:
    from test_vllm_args import group_state

    return group_state("gpu_2x3090", {"gpubox_stack": stack, **facts})


def test_each_stack_renders_its_releases_request_logging_flag() -> None:
    from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_cmdline import vllm_args

    pinned, lts = _state("pinned-0.7.3"), _state("lts-580")
    assert "--disable-log-requests" in vllm_args(pinned) and "--enable-log-requests" not in vllm_args(pinned)
    assert "--disable-log-requests" not in vllm_args(lts) and "--enable-log-requests" not in vllm_args(lts)
    assert "--enable-log-requests" in vllm_args(lts, disable_log_requests=False)
    assert "--disable-log-requests" not in vllm_args(pinned, disable_log_requests=False)
    # every other argument is the same on both stacks
    strip = {"--disable-log-requests", "--enable-log-requests"}
    assert [a for a in vllm_args(pinned) if a not in strip] == [a for a in vllm_args(lts) if a not in strip]


@pytest.mark.parametrize(
    "arg", ["--num-scheduler-steps", "--use-v2-block-manager", "--use_v2_block_manager", "--guided-decoding-backend"]
)
def test_flags_the_new_release_removed_are_refused_by_name_on_its_stack_only(arg: str) -> None:
    extra = [arg, "8"] if arg == "--num-scheduler-steps" else [arg, "outlines"] if "guided" in arg else [arg]
    lts = state_checks.validate({"gpubox_stack": "lts-580", "gpubox_vllm_extra_args": extra}).errors
    refused = [
        line for line in lts if line.startswith(f"gpubox_vllm_extra_args: {arg!r} does not exist in vLLM 0.32.0")
    ]
    assert len(refused) == 1, lts
    pinned = state_checks.validate({"gpubox_stack": "pinned-0.7.3", "gpubox_vllm_extra_args": extra}).errors
    assert not [line for line in pinned if "gpubox_vllm_extra_args" in line], pinned  # control: 0.7.3 has it


def test_the_removed_log_flag_is_refused_on_both_stacks_as_a_rendered_knob() -> None:
    for stack in stacks.NAMES:
        errors = state_checks.validate({"gpubox_stack": stack, "gpubox_vllm_extra_args": ["--disable-log-requests"]})
        assert any("vllm_service_disable_log_requests" in line for line in errors.errors), (stack, errors.errors)


def test_a_quantization_method_the_stacks_vllm_lacks_is_refused_by_name() -> None:
    lts = state_checks.validate({"gpubox_stack": "lts-580", "gpubox_model_quantization": "gguf"}).errors
    assert any(
        line.startswith("gpubox_model_quantization 'gguf' is not a quantization method of vLLM 0.32.0") for line in lts
    )
    pinned = state_checks.validate({"gpubox_stack": "pinned-0.7.3", "gpubox_model_quantization": "gguf"}).errors
    assert not [line for line in pinned if "gpubox_model_quantization" in line], pinned
    ok = state_checks.validate({"gpubox_stack": "lts-580", "gpubox_model_quantization": "awq_marlin"}).errors
    assert not [line for line in ok if "gpubox_model_quantization" in line], ok


def test_the_docs_flag_table_says_which_stacks_have_each_flag() -> None:
    spec = importlib.util.spec_from_file_location("gen_schema", ROOT / "tools" / "gen_schema.py")
    gen_schema = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_schema)
    table = gen_schema.flag_table()  # the docs table lives with the generator that writes it
    assert "| `--disable-log-requests` | vllm_service_disable_log_requests | rendered | no such flag |" in table
    assert (
        "| `--enable-log-requests` | vllm_service_disable_log_requests (inverted) | no such flag | rendered |" in table
    )
    assert "| `--num-scheduler-steps` | `gpubox_vllm_extra_args` | exists | refused: " in table
    assert table in (ROOT / "docs" / "deploy.md").read_text()


@pytest.mark.parametrize(
    ("stack", "extra", "expected"),
    [
        (None, {}, ["--driver-branch", "535"]),
        ("lts-580", {}, ["--driver-branch", "580"]),
        ("lts-580", {"metrics_gpu_fatal_xids": [48, 79]}, ["--driver-branch", "580", "--fatal-xids", "48,79"]),
        # the branch the driver role installed (its fact) wins over the stack's: the harness's Debian 535 under lts-580
        ("lts-580", {"ansible_facts": {"ansible_local": {"gpubox_driver": {"branch": "535"}}}},
         ["--driver-branch", "535"]),
        (None, {"ansible_facts": {"ansible_local": {"gpubox_driver": {"branch": "580"}}}}, ["--driver-branch", "580"]),
    ],
)  # fmt: skip
def test_the_gpu_collector_judges_xids_by_the_catalog_of_the_installed_driver_branch(
    stack: str | None, extra: dict[str, Any], expected: list[str]
) -> None:
    """roles/metrics' collector gets the installed driver's branch, the stack's before the driver role ran
    (gpu_metrics.fatal_xids per branch: R580 adds the GSP and recovery Xids); metrics_gpu_fatal_xids, when set,
    still names the fatal set itself."""
    from ansible.template import trust_as_template

    from harness.ansible_vars import templar_for

    extra_vars = {"ansible_managed": "test", **extra, **({"gpubox_stack": stack} if stack else {})}
    templar, _ = templar_for("unit-gpu_2x3090", roles=("gpubox", "metrics"), extra_vars=extra_vars,
                             groups=("gpu_2x3090",))  # fmt: skip
    text = (ROOT / "roles" / "metrics" / "templates" / "gpubox-gpu-metrics.service.j2").read_text()
    exec_start = next(line for line in templar.template(trust_as_template(text)).splitlines()
                      if line.startswith("ExecStart="))  # fmt: skip
    argv = exec_start.split()
    options = [arg for i, arg in enumerate(argv) if arg in ("--driver-branch", "--fatal-xids")
               for arg in (arg, argv[i + 1])]  # fmt: skip
    assert options == expected


def test_day_two_lists_every_stacks_support_dates_from_the_table() -> None:
    table = stacks.support_table()
    rows = [line for line in table.splitlines()[2:]]
    assert len(rows) == sum(len(stack.support) for stack in stacks.STACKS.values())
    assert "| `pinned-0.7.3` | NVIDIA driver R535 | 2026-06 |" in table
    assert "| `lts-580` | NVIDIA driver R580 (LTSB) | 2028-06 |" in table
    assert table in (ROOT / "docs" / "day-two.md").read_text()


def support_problems(rows: list[dict[str, str]]) -> list[str]:
    """What the support dates table lacks: each stack's driver branch and vLLM release, a row each that names the
    stack, with the date the stack table states (stacks.SupportEnd; "not published" where it has none)."""
    found = [f"{row['part']}: no date or no source" for row in rows if not row["supported until"] or not row["source"]]
    for name, stack in stacks.STACKS.items():
        for prefix in (f"NVIDIA driver R{stack.driver_branch} ", f"vLLM {stack.vllm}"):
            row = next((row for row in rows if row["part"] == prefix or row["part"].startswith(prefix)), None)
            end = next((end.until for end in stack.support if end.part.startswith(prefix.strip())), "")
            if row is None:
                found.append(f"{name}: no row for {prefix.strip()}")
            elif f"`{name}`" not in row["where gpubox uses it"]:
                found.append(f"{name}: the row of {prefix.strip()} does not name the stack")
            elif not row["supported until"].startswith(end or "not published"):
                found.append(f"{name}: {prefix.strip()} is supported until {end or 'not published'} in stacks.py")
    return found


def test_day_two_support_dates_cover_every_stacks_driver_branch_and_vllm_release() -> None:
    rows = markdown.table((ROOT / "docs" / "day-two.md").read_text(), "## Support dates")
    assert support_problems(rows) == []
    parts = {row["part"]: row["supported until"] for row in rows}
    assert parts["NVIDIA driver R620 (long-term branch)"] == "2029-09"
    assert [part for part in parts if part.startswith(("ansible-core 2.19", "Python 3.11"))] == [
        "ansible-core 2.19",
        "Python 3.11",
    ]


def test_control_the_support_dates_check_finds_a_missing_branch_a_wrong_date_and_a_missing_source() -> None:
    rows = markdown.table((ROOT / "docs" / "day-two.md").read_text(), "## Support dates")
    without = [row for row in rows if not row["part"].startswith("NVIDIA driver R580")]
    assert support_problems(without) == ["lts-580: no row for NVIDIA driver R580"]
    moved = [{**row, "supported until": "2029-06"} if row["part"].startswith("NVIDIA driver R580") else row
             for row in rows]  # fmt: skip
    assert support_problems(moved) == ["lts-580: NVIDIA driver R580 is supported until 2028-06 in stacks.py"]
    other = [{**row, "where gpubox uses it": "no stack"} if row["part"] == "vLLM 0.7.3" else row for row in rows]
    assert support_problems(other) == ["pinned-0.7.3: the row of vLLM 0.7.3 does not name the stack"]
    unsourced = [{**row, "source": ""} if row["part"] == "Python 3.12" else row for row in rows]
    assert support_problems(unsourced) == ["Python 3.12: no date or no source"]


def test_the_serving_scenario_runs_the_supported_stacks_command_line_over_the_test_images_driver() -> None:
    """molecule/serving's box is on lts-580, whose vLLM (0.32.0) is the CPU engine's release: the command line it
    renders is that stack's (tests/engines parses it with 0.32.0's parser), not the pinned stack's. Its driver and
    CUDA stay the test image's (Debian 12 carries no 580), named by the harness's group vars."""
    from test_vllm_args import scenario_render, scenario_vllm_argv

    host = "gpubox-m-serving"
    state = scenario_render("serving", host, "query('gpubox.gpubox.desired_state') | first")
    assert state["errors"] == [] and state["gpubox_stack"] == "lts-580", state["errors"]
    assert state["gpubox_stack_info"]["vllm"] == "0.32.0"
    argv = scenario_vllm_argv("serving", host)
    assert "--enable-log-requests" in argv and "--disable-log-requests" not in argv, argv  # 0.32.0's spelling
    assert argv[argv.index("--model") + 1] == state["gpubox_model_dir"]
    driver = scenario_render("serving", host, "[__nvidia_driver_branch, __cuda_toolkit_version]",
                             ("gpubox", "nvidia_driver", "cuda_toolkit"))  # fmt: skip
    assert driver == ["535", "12.2"]
