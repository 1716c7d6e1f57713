"""Container health probe: exit 0 when bastion's /healthz answers 200, 1 otherwise.

The slim image has no curl or wget, so the Dockerfile's HEALTHCHECK runs this with the image's own Python. It
needs nothing but the standard library and never raises: any failure is "unhealthy".

    BASTION_HEALTHCHECK_URL   full URL to probe (default http://127.0.0.1:$BASTION_PORT/healthz)
    BASTION_PORT              bastion's port when the URL is not given (default 8080)
"""

from __future__ import annotations

import os
import sys
import urllib.request


def probe_url(environ: dict[str, str]) -> str:
    explicit = environ.get("BASTION_HEALTHCHECK_URL")
    if explicit:
        return explicit
    return f"http://127.0.0.1:{environ.get('BASTION_PORT') or '8080'}/healthz"


def main() -> int:
    url = probe_url(dict(os.environ))
    if not url.startswith(("http://", "https://")):
        print(f"unhealthy: not an http(s) URL: {url}", file=sys.stderr)
        return 1
    try:
        with urllib.request.urlopen(url, timeout=3) as response:  # noqa: S310 - scheme checked above
            ok = response.status == 200
    except Exception as exc:  # every failure means unhealthy
        print(f"unhealthy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
