# One image for every service of docker-compose.yml: replicas (sdpaxos serve) and schedulers.
FROM python:3.11-slim
# iproute2: tc, for the optional kernel-level WAN emulation (deploy/entrypoint.sh)
RUN apt-get update && apt-get install -y --no-install-recommends iproute2 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY consensus ./consensus
COPY cluster_state ./cluster_state
COPY bench ./bench
RUN pip install --no-cache-dir .
COPY deploy /etc/sdpaxos
ENTRYPOINT ["/etc/sdpaxos/entrypoint.sh"]
CMD ["--help"]
