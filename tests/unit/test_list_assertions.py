"""tools/list_assertions.py: every assertion of the suite, one line each, the same list on every run."""

from __future__ import annotations

import yaml

import list_assertions as la

PLAYBOOK = """
- name: A play
  hosts: all
  vars:
    limit: !unsafe "{{ 3 }}"
  tasks:
    - name: Outer block
      block:
        - name: Two things hold
          ansible.builtin.assert:
            that:
              - a == 1
              - >-
                b is
                defined
        - name: Wait for it
          ansible.builtin.uri:
            url: http://x
          until: r.status == 200
          failed_when: [r.status >= 500, "'boom' in r.content"]
      rescue:
        - ansible.builtin.fail:
            msg: no
          when: c | bool
    - name: Run anyway
      ansible.builtin.command: "true"
      failed_when: false
    - name: Not an assertion
      ansible.builtin.debug:
        msg: until it works
"""


def test_each_assertion_of_a_playbook_is_found() -> None:
    got = list(la.yaml_assertions(yaml.load(PLAYBOOK, Loader=la._Loader)))
    assert got == [
        ("Two things hold", "a == 1"),
        ("Two things hold", "b is defined"),
        ("Wait for it", "failed_when: r.status >= 500"),
        ("Wait for it", "failed_when: 'boom' in r.content"),
        ("Wait for it", "until: r.status == 200"),
        ("(unnamed ansible.builtin.fail)", "fail when: c | bool"),
        ("Run anyway", "failed_when: false"),
    ]


def test_python_tests_asserts_and_checks_are_found() -> None:
    source = """
import pytest

def helper(x):
    assert x, "x"

class TestThing:
    def test_a(self, host):
        assert host.file("/etc/x").exists

def test_b():
    self.check(rc == 0,
               "converges")
"""
    got = [a.line() for a in la.python_assertions(source, "molecule/s/tests/test_x.py", "s")]
    f = "molecule/s/tests/test_x.py"
    assert got == [
        f"s\t{f}\t{f}::helper\tassert x",
        f"s\t{f}\t{f}::TestThing::test_a\ttest function",
        f"s\t{f}\t{f}::TestThing::test_a\tassert host.file('/etc/x').exists",
        f"s\t{f}\t{f}::test_b\ttest function",
        f"s\t{f}\t{f}::test_b\tself.check(rc == 0, 'converges')",
    ]
    # Outside a test_*.py file a function named test... is no pytest test.
    assert la.python_assertions("def test_x():\n    pass\n", "molecule/s/suite.py", "s") == []


def test_the_suite_lists_known_assertions_and_the_same_list_twice() -> None:
    lines = la.list_assertions()
    assert lines == la.list_assertions() == sorted(lines)
    assert all(line.count("\t") == 3 for line in lines)
    # An assert task in a scenario file, a task file it includes, and a shared playbook it runs.
    expected = [
        ("fleet", "molecule/fleet/side_effect.yml",
         "(c) Every box was rebuilt, no stream failed or was cut, and the busiest box stayed within the load bound",
         "fleet_rebuild_c.rc == 0"),
        ("fleet", "molecule/fleet/tasks/converge_wave.yml", "Check the convergence of wave {{ _wave_index + 1 }}",
         "_wave_run.rc == 0"),
        ("day2_driver", "molecule/shared/create.yml", "Ensure the test apt repository has been built",
         "aptrepo | length > 0"),
    ]  # fmt: skip
    for row in expected:
        assert "\t".join(row) in lines, row
    # A testinfra test and a unit test, by file::function.
    host_layer = "molecule/day2_driver/fresh_tests/test_host_layer.py"
    assert f"day2_driver\t{host_layer}\t{host_layer}::test_cuda_toolkit_from_the_cuda_repo\ttest function" in lines
    me = "tests/unit/test_list_assertions.py"
    assert f"unit\t{me}\t{me}::test_the_suite_lists_known_assertions_and_the_same_list_twice\ttest function" in lines
    # python_env_conda replaces the shared prepare with none (its molecule.yml): not listed for it. The shared
    # prepare's one assertion is the hub's wait, in the task file it includes.
    wait = "molecule/shared/tasks/wait_http.yml"
    conda = ("python_env_conda\tmolecule/shared/prepare.yml", f"python_env_conda\t{wait}")
    assert not [x for x in lines if x.startswith(conda)]
    assert [x for x in lines if x.startswith(f"day2_driver\t{wait}")]
