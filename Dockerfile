# syntax=docker/dockerfile:1
#
# bastion, the MCP security gateway.
#
#   docker build -t mcp-bastion .
#   docker run --rm -p 8080:8080 -v "$PWD/bastion.yaml:/etc/bastion/bastion.yaml:ro" mcp-bastion
#
# Two stages: the builder turns the source into a wheel and installs it (with its dependencies) into a virtualenv;
# the final image is python:3.11-slim plus that virtualenv, the demo upstreams and a health probe. No compiler, no
# pip cache and no source tree reach the final image. See docs/deploy.md.

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# Set to "false" to leave out the MCP Python SDK, which only the bundled demo upstreams need.
ARG WITH_DEMO=true

# tini, the init the final image runs as PID 1 (see ENTRYPOINT). Its statically linked build is copied from here,
# so the final stage stays free of apt and its lists.
RUN apt-get update \
 && apt-get install -y --no-install-recommends "tini=0.19.*" \
 && rm -rf /var/lib/apt/lists/* \
 && /usr/bin/tini-static --version

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src

# The wheel is built by the base image's pip (with build isolation), so no build tool lands in the venv. The venv
# lives at the same path in both stages because its scripts carry absolute shebangs. Bytecode is compiled here, so a
# read-only root filesystem costs nothing at start-up.
RUN python -m pip wheel --no-deps --no-cache-dir --wheel-dir /wheels . \
 && python -m venv /opt/bastion/venv \
 && /opt/bastion/venv/bin/pip install --no-cache-dir /wheels/*.whl \
 && if [ "$WITH_DEMO" = "true" ]; then /opt/bastion/venv/bin/pip install --no-cache-dir "mcp>=2.3,<3"; fi \
 && /opt/bastion/venv/bin/python -m compileall -q /opt/bastion/venv \
 && /opt/bastion/venv/bin/bastion --version

# ---------------------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="mcp-bastion" \
      org.opencontainers.image.description="Security gateway for the Model Context Protocol" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.documentation="docs/deploy.md"

# uid/gid 10001: outside the range of users a host is likely to have, so a mounted volume never ends up owned by
# a real account. -l keeps useradd from growing /var/log/lastlog for a high uid.
RUN groupadd --system --gid 10001 bastion \
 && useradd --system -l --uid 10001 --gid 10001 --home-dir /var/lib/bastion --no-create-home \
        --shell /usr/sbin/nologin bastion \
 && mkdir -p /etc/bastion /var/lib/bastion \
 && chown 10001:10001 /var/lib/bastion

COPY --from=builder /opt/bastion/venv /opt/bastion/venv
COPY --from=builder /usr/bin/tini-static /usr/bin/tini
COPY deploy/docker/healthcheck.py /opt/bastion/healthcheck.py
COPY examples/demo /opt/bastion/examples/demo

ENV PATH="/opt/bastion/venv/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/bastion \
    BASTION_CONFIG=/etc/bastion/bastion.yaml \
    BASTION_LOG_FORMAT=json \
    BASTION_PORT=8080

# The only place bastion writes (file audit sinks, local state). Everything else can be read-only; /tmp is the
# runtime's business (a tmpfs in the compose file and an emptyDir in the Kubernetes manifests).
VOLUME ["/var/lib/bastion"]
WORKDIR /var/lib/bastion
USER 10001:10001
EXPOSE 8080

HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/opt/bastion/healthcheck.py"]

# tini is PID 1 because bastion spawns processes (stdio upstreams, and whatever those spawn): an orphaned
# grandchild is re-parented to PID 1, and only an init reaps it instead of leaving a zombie. tini forwards SIGTERM
# to bastion alone (no -g): bastion then stops accepting, lets in-flight calls finish within --grace seconds, and
# the lifespan closes upstreams in its own order (stdin EOF, SIGTERM, SIGKILL) and flushes the audit sinks before
# the process exits 0; tini exits with bastion's status.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "bastion"]
CMD ["serve", "--config", "/etc/bastion/bastion.yaml"]
