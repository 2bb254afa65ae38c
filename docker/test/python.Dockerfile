# Test-only stand-in for python:3.12-slim (see README.md): Debian's Python 3.
ARG BASE
FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python-is-python3 \
    && rm -rf /var/lib/apt/lists/*
CMD ["python3"]
