"""What stack_engines.Engine talks to inside a stack's engine venv: vLLM imported once, each command in a fork of it.

    python fork_server.py        (one JSON request a line on stdin, one JSON answer a line on stdout)

Importing a release's OpenAI app costs some 5-7 s of CPU on the 2-core machine (vLLM 0.32.0: 6.9 s, 0.7.3: 5.4 s);
a process per command paid it each time. Here the parent imports the modules every command needs (the release's
argument parser and app builder, FastAPI's TestClient) and nothing of gpubox's, and forks a child per request: the
child starts from that imported state alone (no app built, no request guard imported, no parser run), runs
``in_engine.main(argv)`` or a script, and exits, so no command sees what another did. A request is
``{"argv": [...], "code": str | null, "stdin": str | null}`` (code null: in_engine.py's command line); the answer is
``{"rc": int, "stdout": str, "stderr": str}``. A child still running after ``timeout`` seconds is killed (rc -9).
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import tempfile
import time
import traceback

TIMEOUT = 600.0


def preload() -> None:
    """The release's parser, app builder and test client, where in_engine.py finds them (no app built)."""
    import in_engine

    in_engine.parser_parts()
    try:
        import vllm.entrypoints.launchers.app
    except ImportError:
        import vllm.entrypoints.openai.api_server  # noqa: F401
    import fastapi.testclient  # noqa: F401


def child(request: dict, out: int, err: int) -> None:
    """In the fork: stdout and stderr to their files, stdin from the request, then the command; never returns."""
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), write_through=True)
    sys.stdin = io.StringIO(request.get("stdin") or "")
    argv = [str(a) for a in request.get("argv", [])]
    rc = 0
    try:
        if request.get("code") is not None:
            sys.argv = ["-c", *argv]
            exec(compile(request["code"], "<script>", "exec"), {"__name__": "__main__"})
        else:
            import in_engine

            sys.argv = ["in_engine.py", *argv]
            in_engine.main(argv)
    except SystemExit as stop:
        rc = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int) and stop.code is not None:
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def serve_one(request: dict) -> dict:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            child(request, out.fileno(), err.fileno())
        deadline = time.monotonic() + float(request.get("timeout") or TIMEOUT)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                rc = -9
                break
            time.sleep(0.02)
        answers = []
        for f in (out, err):
            f.seek(0)
            answers.append(f.read().decode("utf-8", "replace"))
    return {"rc": rc, "stdout": answers[0], "stderr": answers[1]}


def main() -> int:
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything the imports print goes to stderr, never into the protocol
    preload()
    protocol.write(json.dumps({"ready": True}) + "\n")
    protocol.flush()
    for line in sys.stdin:
        if line.strip():
            protocol.write(json.dumps(serve_one(json.loads(line))) + "\n")
            protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
