# Canopy: `canopy serve --http` (MCP at /mcp, REST at /api/v1) over a mounted folder of documents.
#
#   docker build -t canopy .
#   docker run --rm -p 8765:8765 -v "$PWD/docs:/docs:ro" -v canopy-index:/index \
#     -v "$PWD/tokens.jsonl:/config/tokens.jsonl:ro" \
#     -e CANOPY_AUTH__TOKENS_FILE=/config/tokens.jsonl canopy
#
# /docs: the documents (read-only is enough: the index lives in /index, a volume, so it
# survives the container and the next start only indexes what changed). With no index yet the
# server answers at once and builds it meanwhile. Any `canopy serve` option can follow the
# image name (e.g. --watch, --workers 2). The provider comes from the environment:
# CANOPY_LLM_BASE_URL / CANOPY_LLM_MODEL / CANOPY_LLM_API_KEY (none: the builtin offline one).
# Serving on 0.0.0.0 needs token verification (a token file as above, or [auth] jwt_* in
# /docs/canopy.toml), or --insecure-no-auth for a trusted network.

ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV VIRTUAL_ENV=/opt/canopy \
    PATH=/opt/canopy/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A virtual environment: the same steps on the official python images and on a distribution's
# own python (which refuses system-wide pip installs).
RUN python3 -m venv /opt/canopy

WORKDIR /src
# The package and the demo corpus it installs as data files (pyproject.toml); nothing else.
COPY pyproject.toml README.md ./
COPY canopy ./canopy
COPY indexer ./indexer
COPY server ./server
COPY acl ./acl
COPY prompts ./prompts
COPY examples/docs ./examples/docs
# EXTRAS: the wings' extras to install beside the core (pyproject.toml); "publish" lets the
# image publish generations and serve them as a replica (PDF and DOCX are read by the core: the
# old "docs" extra is empty). The optional secret `pip_cert` is a CA bundle for a
# TLS-intercepting proxy between the build and PyPI (docker build --secret id=pip_cert,src=...).
ARG EXTRAS=publish
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    pip install --no-cache-dir ".[${EXTRAS}]" && rm -rf /src

# An unprivileged user that owns /index, so a named volume mounted there is writable.
RUN groupadd --gid 10001 canopy \
    && useradd --uid 10001 --gid canopy --home-dir /index --no-create-home canopy \
    && mkdir -p /docs /index && chown canopy:canopy /index
USER canopy
WORKDIR /index
VOLUME ["/index"]
EXPOSE 8765

ENTRYPOINT ["canopy", "serve", "/docs", "--index-dir", "/index", "--http", "--host", "0.0.0.0", "--port", "8765"]
