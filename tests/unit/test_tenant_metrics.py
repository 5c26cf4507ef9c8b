"""plugins/module_utils/tenant_metrics.py and roles/metrics/files/gpubox-tenant-metrics: the front door's access log
counted per tenant and status class, incrementally, across rotation as Debian's logrotate does it (rename to .1,
then a new file), truncation and half-written lines, with counters that never go down. The collector runs as a
subprocess over real files; the real nginx writes the log in tests/integration/test_tenant_metrics_live.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import tenant_metrics
from ansible_collections.gpubox.gpubox.plugins.module_utils.node_textfile import parse_samples
from harness import ansible_vars
from harness.front_door_log import line

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR = ROOT / "roles" / "metrics" / "files" / "gpubox-tenant-metrics"
LIB = ROOT / "plugins" / "module_utils"


# --- the parser ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (line(), ("team-a", 200)),
        (line("-", 401), ("", 401)),
        (line("ops", 429), ("ops", 429)),
        (line("a_b-9", 502), ("a_b-9", 502)),
        # nginx writes a '"' inside the request as \x22: the fields stay apart.
        (line(request="GET /v1/x\\x22 200 1 \\x22-\\x22 HTTP/1.1"), ("team-a", 200)),
        (line(request="-", status=400, tenant="-"), ("", 400)),
    ],
)
def test_a_front_door_line_gives_its_tenant_and_status(text: str, expected: tuple[str, int]) -> None:
    request = tenant_metrics.parse_line(text)
    assert request is not None and (request.tenant, request.status) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage\n",
        # nginx's plain "combined" format (no tenant, no conn): not the front door's.
        '192.0.2.7 - - [04/Dec/2026:06:32:24 +0000] "GET / HTTP/1.1" 200 5 "-" "curl"\n',
        line("Team-A"),  # not a tenant's name (upper case)
        line("(none)"),
        line("-x"),
        line("a" * 33),
        line(status=999),
        line().replace(" 512 ", " -1 "),
        line().replace("conn=127.0.0.2", "conn="),
        line() + "trailing",
        line().replace("tenant=team-a", 'tenant=team-a" injected'),
    ],
)
def test_a_line_of_another_shape_is_not_guessed_at(text: str) -> None:
    assert tenant_metrics.parse_line(text) is None


def test_the_no_tenant_label_cannot_be_a_tenants_name() -> None:
    from ansible_collections.gpubox.gpubox.plugins.module_utils import tenants

    problems = tenants.problems([{"name": tenant_metrics.NO_TENANT, "keys": ["k" * 20]}])
    assert problems and "name" in problems[0]


# --- counting, rotation, truncation -------------------------------------------------------------------------------


class Files:
    """A log and its .1 on disk, moved as logrotate moves them, read as the collector reads them."""

    def __init__(self, tmp: Path) -> None:
        self.log = tmp / "access.log"
        self.log.write_text("")
        self.state = tenant_metrics.State()

    def write(self, text: str, path: Path | None = None) -> None:
        with open(path or self.log, "a") as fh:
            fh.write(text)

    def run(self) -> tenant_metrics.State:
        handles: dict[str, tuple] = {}
        for which, path in (("current", self.log), ("rotated", Path(f"{self.log}.1"))):
            try:
                fh = open(path, "rb")  # noqa: SIM115 - closed below
            except FileNotFoundError:
                handles[which] = (None, None)
                continue
            st = os.fstat(fh.fileno())
            handles[which] = (fh, tenant_metrics.FileId(st.st_dev, st.st_ino, st.st_size))

        def read(which: str, start: int) -> bytes:
            fh, ident = handles[which]
            fh.seek(start)
            return fh.read(ident.size - start)

        tenant_metrics.advance(self.state, handles["current"][1], handles["rotated"][1], read)
        for fh, _ in handles.values():
            if fh:
                fh.close()
        self.state = tenant_metrics.load_state(json.loads(json.dumps(self.state.as_json())))  # through the file
        return self.state

    def rotate(self) -> None:
        """logrotate with delaycompress: .1 is compressed away as .2.gz (here: removed), the log renamed to .1, a
        new empty log created in its place."""
        rotated = Path(f"{self.log}.1")
        if rotated.exists():
            rotated.unlink()
        self.log.rename(rotated)
        self.log.write_text("")


def test_counts_per_tenant_and_class_and_refused_keys(tmp_path: Path) -> None:
    files = Files(tmp_path)
    files.write(line("team-a", 200) * 3 + line("team-b", 429) + line("-", 401) * 2 + line("-", 404) + "junk\n")
    state = files.run()
    assert state.requests == {"team-a": {"2xx": 3}, "team-b": {"4xx": 1}, "": {"4xx": 3}}
    assert (state.refused_keys, state.unparsed, state.restarts) == (2, 1, 0)


def test_a_line_is_what_ends_in_a_newline_and_nothing_else() -> None:
    # nginx escapes control bytes as \xNN; raw ones (a damaged log) make one unparsed line, not several.
    data = (line().rstrip("\n") + "\r\x85\x1c junk\n" + line()).encode("latin-1")
    lines, used = tenant_metrics.complete_lines(data + b"half")
    assert used == len(data) and len(lines) == 2
    state = tenant_metrics.State()
    tenant_metrics.count_lines(state, lines)
    assert (state.unparsed, state.requests) == (1, {"team-a": {"2xx": 1}})


def test_each_run_reads_only_what_arrived_since_the_last(tmp_path: Path) -> None:
    files = Files(tmp_path)
    files.write(line() * 2)
    files.run()
    assert files.run().requests == {"team-a": {"2xx": 2}}  # nothing new: nothing added
    files.write(line(status=500))
    assert files.run().requests == {"team-a": {"2xx": 2, "5xx": 1}}


def test_a_half_written_line_waits_for_its_end(tmp_path: Path) -> None:
    files = Files(tmp_path)
    whole = line("team-b", 200)
    files.write(line() + whole[:30])
    state = files.run()
    assert state.requests == {"team-a": {"2xx": 1}} and state.unparsed == 0
    files.write(whole[30:])
    assert files.run().requests == {"team-a": {"2xx": 1}, "team-b": {"2xx": 1}}
    assert files.state.unparsed == 0


def test_a_rotation_finishes_the_old_file_in_dot_1_before_the_new_one(tmp_path: Path) -> None:
    files = Files(tmp_path)
    files.write(line() * 2)
    files.run()
    files.write(line() * 3)  # not read yet when logrotate renames the file
    files.rotate()
    files.write(line("-", 401), Path(f"{files.log}.1"))  # nginx writes to .1 until its USR1 reopen
    files.write(line("team-b", 200))
    state = files.run()
    assert state.requests == {"team-a": {"2xx": 5}, "team-b": {"2xx": 1}, "": {"4xx": 1}}
    assert state.restarts == 0
    files.write(line("-", 401), Path(f"{files.log}.1"))  # a late line in .1, after the run: read by the next
    files.write(line("team-b", 200))
    state = files.run()
    assert state.requests == {"team-a": {"2xx": 5}, "team-b": {"2xx": 2}, "": {"4xx": 2}}
    files.rotate()  # the next day: .1 goes (compressed to .2.gz), the log becomes .1
    files.write(line("team-b", 200))
    assert files.run().requests == {"team-a": {"2xx": 5}, "team-b": {"2xx": 3}, "": {"4xx": 2}}
    assert files.state.restarts == 0 and files.state.refused_keys == 2


def test_a_truncated_log_is_read_from_its_start_and_no_counter_goes_down(tmp_path: Path) -> None:
    files = Files(tmp_path)
    files.write(line() * 4)
    files.run()
    files.log.write_text(line("team-b", 200))  # copytruncate, or an operator's `: > log`, then one request
    state = files.run()
    assert state.requests == {"team-a": {"2xx": 4}, "team-b": {"2xx": 1}} and state.restarts == 1


def test_a_log_replaced_with_the_old_one_gone_is_a_restart(tmp_path: Path) -> None:
    files = Files(tmp_path)
    files.write(line() * 2)
    files.run()
    files.log.unlink()
    files.log.write_text(line("team-b", 200))
    state = files.run()
    assert state.requests == {"team-a": {"2xx": 2}, "team-b": {"2xx": 1}} and state.restarts == 1


def test_a_missing_log_counts_nothing_and_loses_nothing(tmp_path: Path) -> None:
    files = Files(tmp_path)
    files.write(line())
    files.run()
    files.rotate()
    files.log.unlink()  # rotated, and nginx has not reopened yet (no new file)
    files.write(line(), Path(f"{files.log}.1"))
    assert files.run().requests == {"team-a": {"2xx": 2}} and files.state.restarts == 0
    files.log.write_text(line())
    assert files.run().requests == {"team-a": {"2xx": 3}} and files.state.restarts == 0


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"version": 2},
        {"version": 1, "requests": []},
        {"version": 1, "requests": {"team-a": {"2xx": -1}}},
        {"version": 1, "requests": {"team-a": {"2xx": True}}},
        {"version": 1, "requests": {"Bad Name": {"2xx": 1}}},
        {"version": 1, "requests": {"team-a": {"6xx": 1}}},
        {"version": 1, "requests": {}, "current": {"dev": 1}},
        {"version": 1, "requests": {}, "unparsed": "3"},
    ],
)
def test_a_state_this_version_did_not_write_is_refused_naming_the_field(data: object) -> None:
    with pytest.raises(tenant_metrics.StateError):
        tenant_metrics.load_state(data)


def test_the_textfile_holds_every_counter_and_promtool_reads_it(tmp_path: Path) -> None:
    files = Files(tmp_path)
    files.write(line("team-a", 200) + line("-", 401) + "junk\n")
    text = tenant_metrics.render(files.run(), True, 1764830000.5)
    samples = {(name, tuple(sorted(labels.items()))): value for name, labels, value in parse_samples(text)}
    assert samples[("gpubox_front_door_requests_total", (("code", "2xx"), ("tenant", "team-a")))] == "1"
    assert samples[("gpubox_front_door_requests_total", (("code", "4xx"), ("tenant", "(none)")))] == "1"
    assert samples[("gpubox_front_door_refused_keys_total", ())] == "1"
    assert samples[("gpubox_front_door_log_lines_unparsed_total", ())] == "1"
    assert samples[("gpubox_front_door_log_readable", ())] == "1"
    # With the box's served model (the collector's --model): every request sample carries it.
    labelled = [lab for name, lab, _ in parse_samples(tenant_metrics.render(files.run(), True, 1.0, "qwen14b"))
                if name == "gpubox_front_door_requests_total"]  # fmt: skip
    assert labelled and all(lab["model"] == "qwen14b" for lab in labelled), labelled
    promtool = os.environ.get("GPUBOX_PROMTOOL") or shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: make promtool (GPUBOX_PROMTOOL names it)")
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr + text


# --- the collector, as the timer runs it ---------------------------------------------------------------------------


def collect(tmp_path: Path, log: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    argv = [sys.executable, str(COLLECTOR), "--lib", str(LIB), "--log", str(log), "--out", str(tmp_path / "t.prom")]
    return subprocess.run([*argv, "--state-dir", str(state), *extra], capture_output=True, text=True, check=False)


def counts(tmp_path: Path) -> dict[tuple[str, tuple], str]:
    text = (tmp_path / "t.prom").read_text()
    return {(name, tuple(sorted(labels.items()))): value for name, labels, value in parse_samples(text)}


def test_the_collector_counts_across_runs_and_a_rotation(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text(line() * 2 + line("-", 401))
    assert collect(tmp_path, log).returncode == 0
    with open(log, "a") as fh:
        fh.write(line())
    log.rename(f"{log}.1")
    log.write_text(line("team-b", 503))
    out = collect(tmp_path, log)
    assert out.returncode == 0 and out.stderr == ""
    got = counts(tmp_path)
    assert got[("gpubox_front_door_requests_total", (("code", "2xx"), ("tenant", "team-a")))] == "3"
    assert got[("gpubox_front_door_requests_total", (("code", "5xx"), ("tenant", "team-b")))] == "1"
    assert got[("gpubox_front_door_refused_keys_total", ())] == "1"
    assert (tmp_path / "state" / "state.json").stat().st_mode & 0o777 == 0o600


def test_an_unreadable_log_is_counted_and_said_and_the_counts_stay(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text(line() * 2)
    assert collect(tmp_path, log).returncode == 0
    log.rename(tmp_path / "elsewhere")
    out = collect(tmp_path, log)
    assert out.returncode == 0 and "cannot open it" in out.stderr and "Traceback" not in out.stderr
    got = counts(tmp_path)
    assert got[("gpubox_front_door_requests_total", (("code", "2xx"), ("tenant", "team-a")))] == "2"
    assert got[("gpubox_front_door_log_readable", ())] == "0"
    assert got[("gpubox_front_door_log_read_errors_total", ())] == "1"


def test_a_broken_state_stops_the_run_with_the_fix_and_writes_nothing(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text(line())
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "state.json").write_text('{"version": 1, "requests": {"team-a": {"2xx": -5}}}')
    out = collect(tmp_path, log)
    assert out.returncode == 2 and "remove it to count again" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "t.prom").exists()


def test_an_unwritable_textfile_directory_is_named_before_anything_is_written(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text(line())
    state = tmp_path / "state"
    state.mkdir()
    argv = [sys.executable, str(COLLECTOR), "--lib", str(LIB), "--log", str(log), "--state-dir", str(state)]
    out = subprocess.run([*argv, "--out", str(tmp_path / "nope" / "t.prom")], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("gpubox-tenant-metrics: --out ")
    assert not (state / "state.json").exists()


# --- the role: its knob refused before any change, the collector wanted only with the front door's log ----------

PLAYBOOK = """
- hosts: boxes
  gather_facts: false
  tasks:
    - ansible.builtin.setup:  # as write.yml reads the local facts, from a directory of .fact files
        filter: ansible_local
        fact_path: "{{ box_fact_path }}"
    - ansible.builtin.include_role:
        name: metrics
        tasks_from: validate
        public: true
    - name: wanted
      ansible.builtin.debug:
        msg: "wanted={{ __metrics_tenant_wanted | bool }} log={{ __metrics_tenant_log }}"
"""


BAD_INTERVALS: list[object] = [4, 3601, "often"]
FACT = {"gpubox_front_door": {"access_log": "/var/log/nginx/gpubox-front-door.access.log"}}
WANTED: list[tuple[dict, str]] = [
    ({"box_local": FACT}, "wanted=True log=/var/log/nginx/gpubox-front-door.access.log"),
    ({}, "wanted=False log="),  # the front door has not run yet: no fact, no log to read
    ({"box_local": FACT, "gpubox_front_door_enabled": False}, "wanted=False"),
    ({"box_local": FACT, "metrics_tenant_enabled": False}, "wanted=False"),
]


@pytest.fixture(scope="module")
def role(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One ansible-playbook run over one local host per case: interval<i> (BAD_INTERVALS[i]), wanted<i>
    (WANTED[i], its local facts in a directory of its own)."""
    tmp = tmp_path_factory.mktemp("tenant-metrics-role")
    cases = {f"interval{i}": {"metrics_tenant_interval_sec": v} for i, v in enumerate(BAD_INTERVALS)}
    cases |= {f"wanted{i}": dict(box_vars) for i, (box_vars, _) in enumerate(WANTED)}
    boxes = {}
    for name, box_vars in cases.items():
        facts = tmp / name / "facts.d"
        facts.mkdir(parents=True)
        for fact_name, fact in box_vars.pop("box_local", {}).items():
            (facts / f"{fact_name}.fact").write_text(json.dumps(fact))
        local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        boxes[name] = {**local, **box_vars, "box_fact_path": str(facts)}
    runs = ansible_vars.run_playbook({"all": {"children": {"boxes": {"hosts": boxes}}}}, PLAYBOOK, tmp)
    assert set(boxes) <= set(runs), f"hosts without a result: {set(boxes) - set(runs)}"
    return runs


@pytest.mark.parametrize("value", BAD_INTERVALS)
def test_a_bad_interval_is_refused_naming_the_variable(role: dict[str, dict[str, Any]], value: object) -> None:
    run = role[f"interval{BAD_INTERVALS.index(value)}"]
    failed = ansible_vars.first_failure(run)
    assert failed is not None and "metrics_tenant_interval_sec" in failed.get("msg", ""), run["results"]
    assert not any(r["task"] == "wanted" for r in run["results"]), "a task ran after the refusal"


@pytest.mark.parametrize(("box_vars", "expected"), WANTED)
def test_the_collector_is_wanted_only_where_the_front_door_named_its_log(
    role: dict[str, dict[str, Any]], box_vars: dict, expected: str
) -> None:
    run = role[f"wanted{WANTED.index((box_vars, expected))}"]
    assert ansible_vars.first_failure(run) is None, run["results"]
    said = [r["msg"] for r in run["results"] if r["task"] == "wanted"]
    assert len(said) == 1 and expected in said[0], said
