# One image for every service of docker-compose.yml: replicas (sdpaxos serve), schedulers and
# the certificate init step (sdpaxos cert init).
FROM python:3.11-slim
# iproute2: tc, for the optional kernel-level WAN emulation (deploy/entrypoint.sh)
RUN apt-get update && apt-get install -y --no-install-recommends iproute2 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY consensus ./consensus
COPY cluster_state ./cluster_state
COPY bench ./bench
# the k8s extra: the scheduler extender (sdpaxos extender) talks to Kubernetes through it
RUN pip install --no-cache-dir '.[k8s]'
COPY deploy /etc/sdpaxos
# Everything runs as an unprivileged user. The directories its volumes mount on belong to it
# in the image, so new volumes do too: the write-ahead log (/var/lib/sdpaxos), the
# certificates (/etc/sdpaxos/tls, read-only but for the init step) and the CA's key
# (/etc/sdpaxos/ca, the init step's alone). Without root, tc netem is unavailable and the
# transport emulates WAN delays itself (deploy/entrypoint.sh falls back to it).
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/sdpaxos \
        --shell /usr/sbin/nologin sdpaxos \
    && mkdir -p /var/lib/sdpaxos /etc/sdpaxos/tls /etc/sdpaxos/ca \
    && chown sdpaxos:sdpaxos /var/lib/sdpaxos /etc/sdpaxos/tls /etc/sdpaxos/ca \
    && chmod 0700 /etc/sdpaxos/ca
USER sdpaxos:sdpaxos
ENTRYPOINT ["/etc/sdpaxos/entrypoint.sh"]
CMD ["--help"]
