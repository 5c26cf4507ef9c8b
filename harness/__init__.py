"""gpubox's test harness: the simulated edges and the helpers that the tests, the benches, the molecule
scenarios and `make demo` share. TEST ONLY: nothing here is installed on a real box.

- ``fakegpu``: the replaying ``nvidia-smi`` and the fake sysfs (the GPU is the one simulated thing), and
  what the tests that drive them share (the replay's environment, a bin directory with the replay);
- ``hub``: the ModelScope-compatible test hub and the tiny model it serves;
- ``aptrepo``: the test CUDA apt repository (built from real wheels, served on loopback), and signed archives
  of Ubuntu's shape for the driver's dated archive snapshot (``aptrepo/dated.py``);
- ``engine_standin``: the engine stand-in (fixed TTFT and ITL, no model) and its SSE client;
- ``stream_load``: the streaming load client of molecule/fleet and the benches;
- ``live_proxies``: the front door (nginx) and the gateway (HAProxy) on loopback from the roles' files;
- ``front_door_log``: lines of the front door's access log (the tenant collector's input);
- ``ansible_vars``: one host's variables as Ansible resolves them, a module run through Ansible, one
  ansible-playbook run over one host per case, and a playbook run against a running scenario.

The scripts that a scenario copies into a box (``fakegpu/nvidia-smi``, ``fakegpu/make_sysfs.py``,
``hub/server.py``, ``aptrepo/serve.py``, ``engine_standin/standin.py``, ``engine_standin/sse_client.py``,
``stream_load.py``) stay standalone: standard library only, runnable by path. The checkout's venv
imports the package through the .pth file `make venv` writes (the repository root), so no caller edits
sys.path.
"""
