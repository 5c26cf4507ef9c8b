#!/usr/bin/env python3
"""TEST ONLY: day two of the model on one box (issue 12 items 4-6), each step asserted.

    day2_model_suite.py --phase fresh|day2 --box CONTAINER --inventory DIR --project REPO --lock LOCKFILE --out DIR

Two phases around the box's first converge, which is the crash suite's (molecule/serving/converge.yml):
--phase fresh is step 0 on the fresh box; --phase day2 the rest on the converged, verified box. There
the test hub in the box (harness/hub/server.py) is given a second commit of the model (the
tiny model made with another seed, --commit-dir) and a branch file, so that its branch `master` can
move from commit A to commit B as an upstream push would. Against the box:
  0. site.yml --check --diff on the fresh box: no task fails, nothing is written (no lock entry, no
     vLLM unit, nothing published).
  1. after the first converge (site.yml, fresh): it serves A and wrote master -> A into the lock;
     site.yml --check --diff on the converged box: changed=0.
  2. the hub's master moves to B; `site.yml --tags model,service`: still A (locked), nothing
     fetched, changed=0.
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


def changed_tasks(log: str) -> list[str]:
    """The names of the tasks an ansible-playbook log reports as changed (or would change, in check mode)."""
    found, task = [], ""
    for line in log.splitlines():
        if line.startswith("TASK ["):
            task = line[6:].split("]", 1)[0]
        elif line.startswith("changed:") and task and task not in found:
            found.append(task)
    return found


class Suite:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.out = args, Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.lines: list[str] = []
        self.failures: list[str] = []

    # -- the box ----------------------------------------------------------------------------------
    def sh(self, script: str, check: bool = True) -> str:
        proc = subprocess.run(
            ["podman", "exec", self.args.box, "bash", "-c", script], capture_output=True, text=True, timeout=300
        )
        if check and proc.returncode != 0:
            raise SystemExit(f"in the box: {script}\n{proc.stdout}\n{proc.stderr}")
        return proc.stdout

    def hub(self, path: str) -> dict:
        code = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8090{path}').read().decode())"
        return json.loads(self.sh(f'python3 -c "{code}"'))

    def log_mark(self) -> int:
        return int(self.sh(f"wc -l < {HUB_LOG}").strip() or 0)

    def file_gets(self, mark: int) -> list[dict]:
        lines = self.sh(f"tail -n +{mark + 1} {HUB_LOG}").splitlines()
        entries = [json.loads(line) for line in lines if line.strip()]
        return [e for e in entries if e["method"] == "GET" and "FilePath=" in e["path"]]

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
    def give_hub_a_second_commit(self) -> tuple[str, str]:
        """Commit B: the tiny model with another seed (other weights, same shape), served beside A."""
        made = self.out / "model-b"
        shutil.rmtree(made, ignore_errors=True)
        subprocess.run([sys.executable, str(HUB / "make_tiny_model.py"), str(made), "--seed", "2"], check=True)
        self.sh(f"rm -rf {HUB_DIR}/model-b")
        subprocess.run(["podman", "cp", str(made), f"{self.args.box}:{HUB_DIR}/model-b"], check=True)
        unit = self.sh("systemctl cat gpubox-sim-hub.service")
        exec_lines = re.search(r"^ExecStart=(.*?)(?<!\\)$", unit, re.M | re.S).group(1)
        dropin = (
            "[Service]\nExecStart=\n"
            f"ExecStart={exec_lines} --commit-dir {HUB_DIR}/model-b --branch-file {BRANCH_FILE}\n"
        )
        self.sh(
            f"mkdir -p /etc/systemd/system/gpubox-sim-hub.service.d && cat > "
            f"/etc/systemd/system/gpubox-sim-hub.service.d/commits.conf <<'EOF'\n{dropin}EOF\n"
            f"rm -f {BRANCH_FILE}; systemctl daemon-reload; systemctl restart gpubox-sim-hub.service"
        )
        for _ in range(60):
            try:
                health = self.hub("/_health")["Data"]
                break
            except (SystemExit, ValueError):
                time.sleep(1)
        else:
            raise SystemExit("the test hub did not come back with two commits")
        a = health["commit"]
        (b,) = [c for c in health["commits"] if c != a]
        self.note(f"hub: master -> A {a}; B {b}")
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
        # The hub's master is A (the commit the first converge resolved), B waits beside it.
        a, b = self.give_hub_a_second_commit()
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

        # 2. Upstream pushes B to master: the lock holds, nothing is fetched, nothing changes.
        self.sh(f"echo {b} > {BRANCH_FILE}")
        self.check(self.hub("/_health")["Data"]["commit"] == b, "the hub's master now names B")
        mark = self.log_mark()
        rc, recap, _ = self.play("2-pinned", "site.yml", *tags)
        self.check(rc == 0 and recap.get("changed") == 0, "with master moved upstream, a re-run changes nothing")
        self.check(self.file_gets(mark) == [] and self.fact()["commit"] == a, "still A, no file fetched")

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

        return self.finish()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("--box", "--inventory", "--project", "--lock", "--out"):
        ap.add_argument(name, required=True)
    ap.add_argument("--phase", required=True, choices=("fresh", "day2"))
    return Suite(ap.parse_args()).run()


if __name__ == "__main__":
    os.environ.setdefault("ANSIBLE_FORCE_COLOR", "0")
    sys.exit(main())
