"""gpubox's test harness: the simulated edges and the helpers that the tests, the benches, the molecule
scenarios and `make demo` share. TEST ONLY: nothing here is installed on a real box.

- ``fakegpu``: the replaying ``nvidia-smi`` and the fake sysfs (the GPU is the one simulated thing);
- ``hub``: the ModelScope-compatible test hub and the tiny model it serves;
- ``aptrepo``: the test CUDA apt repository (built from real wheels, served on loopback);
- ``engine_standin``: the engine stand-in (fixed TTFT and ITL, no model) and its SSE client;
- ``stream_load``: the streaming load client of molecule/fleet and the benches;
- ``live_proxies``: the front door (nginx) and the gateway (HAProxy) on loopback from the roles' files;
- ``ansible_vars``: one host's variables as Ansible resolves them, and a module run through Ansible.

The scripts that a scenario copies into a box (``fakegpu/nvidia-smi``, ``fakegpu/make_sysfs.py``,
``hub/server.py``, ``aptrepo/serve.py``, ``engine_standin/standin.py``, ``engine_standin/sse_client.py``,
``stream_load.py``) stay standalone: standard library only, runnable by path. The checkout's venv
imports the package through the .pth file `make venv` writes (the repository root), so no caller edits
sys.path.
"""
