"""Lines of the front door's access log, as nginx writes them with log_format gpubox_front_door (the tenant
collector's input; roles/front_door/templates/gpubox-front-door.conf.j2 defines the format)."""

from __future__ import annotations


def line(tenant: str = "team-a", status: int = 200, request: str = "POST /v1/completions HTTP/1.1") -> str:
    """One access-log line of ``tenant``'s request answered with ``status``."""
    return (
        f'192.0.2.7 - - [04/Dec/2026:06:32:24 +0000] "{request}" {status} 512 "-" "curl/7.81.0" '
        f"tenant={tenant} conn=127.0.0.2\n"
    )
