# One image for every Sluice process (and etcd in docker-compose.yml).
# It runs the same install.sh as CI and `make`: Debian packages, the project venv, the Iceberg jars.
FROM debian:bookworm-slim

ARG DEBIAN_FRONTEND=noninteractive
ENV LANG=C.UTF-8 TZ=UTC PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

# Only what install.sh needs to run at all; it installs everything else itself.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3.11 python3.11-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/sluice
COPY . .
RUN PYTHON=python3.11 ./install.sh \
 && rm -rf /var/lib/apt/lists/* /root/.cache/pip

ENV PATH=/opt/sluice/.venv/bin:$PATH
# Data and configs live outside the source tree (volumes and compose configs).
RUN mkdir -p /var/lib/sluice /etc/sluice
VOLUME ["/var/lib/sluice"]

ENTRYPOINT ["sluice"]
CMD ["--help"]
