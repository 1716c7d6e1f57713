"""The peers ``sidebyside.py`` measures bastion against, installed on first use and started on free ports.

Pinned versions, so that figures from different days compare. Installs go to ``bench/.cache`` (gitignored) and are
reused while the pin is unchanged:

- the official TypeScript MCP SDK (npm), the upstream; ``upstream_ts.mjs`` is copied next to its ``node_modules``,
  because Node resolves an ES module's imports from the module's own directory;
- FastMCP (PyPI), in a virtualenv of its own, since it is no dependency of bastion; ``fastmcp_proxy.py`` runs in it;
- nginx, the Debian package, with ``apt-get`` when no ``nginx`` binary is found (it needs root, as apt does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from loadgen import BENCH, BenchError

CACHE = BENCH / ".cache"
MCP_SDK_VERSION = "1.32.2"  # @modelcontextprotocol/sdk on npm
ZOD_VERSION = "4.6.7"  # the SDK's schema library (its peer dependency), pinned with it
FASTMCP_VERSION = "4.2.3"  # fastmcp on PyPI
NGINX_PACKAGE = "nginx"


def _run(args: list[str], *, cwd: Path | None = None, what: str) -> None:
    """``what`` says what the command does ("installing X"), in the progress line and in the error."""
    print(f"{what}: {' '.join(args)}", file=sys.stderr, flush=True)
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if done.returncode != 0:
        raise BenchError(f"{what} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")


def ts_upstream_dir() -> Path:
    """A directory holding the pinned SDK in ``node_modules`` and a fresh copy of ``upstream_ts.mjs``."""
    where = CACHE / f"ts-sdk-{MCP_SDK_VERSION}"
    installed = where / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json"
    if not installed.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise BenchError("npm not found: the TypeScript upstream needs Node.js and npm")
        where.mkdir(parents=True, exist_ok=True)
        (where / "package.json").write_text(
            '{"name": "bastion-bench-ts-upstream", "private": true, "type": "module", "dependencies": '
            f'{{"@modelcontextprotocol/sdk": "{MCP_SDK_VERSION}", "zod": "{ZOD_VERSION}"}}}}\n')
        _run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=where,
             what=f"installing @modelcontextprotocol/sdk {MCP_SDK_VERSION}")
    shutil.copyfile(BENCH / "upstream_ts.mjs", where / "upstream_ts.mjs")
    return where


def ts_upstream_command(port: int) -> list[str]:
    node = shutil.which("node")
    if node is None:
        raise BenchError("node not found: the TypeScript upstream needs Node.js")
    return [node, str(ts_upstream_dir() / "upstream_ts.mjs"), "--host", "127.0.0.1", "--port", str(port)]


def fastmcp_python() -> Path:
    """The interpreter of a virtualenv holding the pinned FastMCP."""
    venv = CACHE / f"fastmcp-{FASTMCP_VERSION}"
    python = venv / "bin" / "python"
    marker = venv / ".installed"  # written last: a venv whose install was interrupted is made again
    if not marker.exists():
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)], what="making a virtualenv for FastMCP")
        _run([str(python), "-m", "pip", "install", "--quiet", f"fastmcp=={FASTMCP_VERSION}"],
             what=f"installing fastmcp {FASTMCP_VERSION}")
        marker.write_text(FASTMCP_VERSION + "\n")
    return python


def fastmcp_proxy_command(port: int, upstream_url: str) -> list[str]:
    return [str(fastmcp_python()), str(BENCH / "fastmcp_proxy.py"), "--upstream", upstream_url, "--host",
            "127.0.0.1", "--port", str(port)]


def nginx_binary() -> str:
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
    if found is not None:
        return found
    apt = shutil.which("apt-get")
    if apt is None:
        raise BenchError("nginx not found and no apt-get to install it with")
    _run([apt, "update", "-qq"], what="updating the package lists")
    _run([apt, "install", "-y", "-qq", NGINX_PACKAGE], what=f"installing the Debian package {NGINX_PACKAGE}")
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(found, os.X_OK):
        raise BenchError(f"{NGINX_PACKAGE} installed, but no nginx binary found")
    return found


def nginx_config(work: Path, *, port: int, upstream_port: int) -> Path:
    """A reverse proxy with keep-alive connections to the upstream: the floor of any HTTP proxy.

    One process (``master_process off``, one event loop), so that the CPU read from its pid is all of nginx's
    work; no access log, as bastion's audit is switched off in its cheapest configuration too.
    """
    root = work / "nginx"
    root.mkdir(parents=True, exist_ok=True)
    temps = "\n".join(f"  {name}_temp_path {root / name};" for name in
                      ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    config = root / "nginx.conf"
    config.write_text(f"""daemon off;
master_process off;
worker_processes 1;
pid {root / "nginx.pid"};
error_log {root / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
{temps}
  keepalive_requests 1000000;
  upstream mcp {{
    server 127.0.0.1:{upstream_port};
    keepalive 64;
    keepalive_requests 1000000;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://mcp;
      proxy_http_version 1.1;
      proxy_set_header Host $http_host;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
""")
    return config


def nginx_command(config: Path) -> list[str]:
    return [nginx_binary(), "-c", str(config), "-p", str(config.parent)]
