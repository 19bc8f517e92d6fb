# The polyc compile service: `polyc serve` on port 8000, cache in /var/cache/polyc.
#
#   docker build -t polyc .
#   docker run -p 8000:8000 -v polyc-cache:/var/cache/polyc polyc
#   # replicas sharing one Redis:
#   docker run -p 8000:8000 -e POLYC_CACHE_URL=redis://redis:6379/0 polyc
#
# Generated code is built with -march=native for the host the service runs on: the
# cache key covers the CPU's features, so replicas on different CPUs never share objects.
FROM python:3.11-slim

# gcc (with libgomp for -fopenmp) builds the generated C at run time
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libgomp1 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md ./
COPY polyc ./polyc
RUN pip install --no-cache-dir . && rm -rf /src

RUN useradd --create-home --uid 10001 polyc \
    && mkdir -p /var/cache/polyc && chown polyc /var/cache/polyc
USER polyc
WORKDIR /home/polyc
ENV POLYC_CACHE_DIR=/var/cache/polyc \
    PYTHONUNBUFFERED=1
VOLUME ["/var/cache/polyc"]
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=3s --start-period=20s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"

# --host 0.0.0.0: reachable from outside the container (the default is loopback only)
CMD ["polyc", "serve", "--host", "0.0.0.0", "--port", "8000"]
