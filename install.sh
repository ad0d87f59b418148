#!/usr/bin/env bash
# One install script for a fresh machine, used by `make demo`, `make test`, .ci/run and the
# Dockerfile: Debian packages, then a project venv (.venv) with the pinned requirements and
# Sluice itself (editable, under the `sluice` namespace), then Sluice's native core (native/,
# Rust + PyO3, built by maturin; crates pinned in native/Cargo.lock, fetched at install only).
set -euo pipefail
cd "$(dirname "$0")"

APT_PACKAGES=(
  etcd-server etcd-client            # registry, TSO window, checkpoints
  mariadb-server mariadb-client      # capture source, MySQL sink, outbox
  redis-server                       # pump benchmark baseline
  sysbench                           # realistic OLTP load
  default-jdk-headless maven         # Spark; Maven fetches the pinned Iceberg runtime jar; javac
                                     # builds Sluice's one JVM class (spark_sink/java)
  procps psmisc                      # ps/pkill in tests and cluster status
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "install.sh: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# The Spark sink's JVM jars, pinned, from Maven Central into jars/ (spark.jars points there);
# nothing is downloaded at run time. The Iceberg runtime must match pyspark's minor version.
JARS=(
  org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0
  org.xerial:sqlite-jdbc:3.54.1.0
)
mkdir -p jars
for a in "${JARS[@]}"; do
  IFS=: read -r _g art ver <<<"$a"
  if [ ! -f "jars/$art-$ver.jar" ]; then
    echo "install.sh: mvn dependency:copy $a"
    mvn -q -B dependency:copy -Dartifact="$a" -DoutputDirectory="$PWD/jars" -Dmdep.overWriteIfNewer=true
  fi
done

stamp=.venv/.requirements.sha
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
  .venv/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi

# Sluice's one JVM class (spark_sink/java: Hadoop's local filesystem without a chmod process per
# file created), compiled against pyspark's Hadoop client jar into jars/sluice-hadoop.jar;
# rebuilt only when its source changes.
java_stamp=.venv/.java.sha
java_want=$(cat $(find spark_sink/java -name '*.java' | sort) | sha256sum | cut -d' ' -f1)
if [ "$(cat "$java_stamp" 2>/dev/null)" != "$java_want" ] || [ ! -f jars/sluice-hadoop.jar ]; then
  hadoop_api=$(ls .venv/lib/python*/site-packages/pyspark/jars/hadoop-client-api-*.jar | head -1)
  rm -rf build/java && mkdir -p build/java
  javac -nowarn --release 17 -d build/java -cp "$hadoop_api" $(find spark_sink/java -name '*.java')
  jar cf jars/sluice-hadoop.jar -C build/java .
  echo "$java_want" > "$java_stamp"
  echo "install.sh: built jars/sluice-hadoop.jar (spark_sink/java)"
fi

# The native core (native/): rebuilt only when its sources change (stamp = hash of the crate's
# files), so a second run costs nothing. cargo keeps its incremental state in native/target.
native_stamp=.venv/.native.sha
native_want=$(cd native && cat Cargo.toml Cargo.lock pyproject.toml $(find src -type f | sort) | sha256sum | cut -d' ' -f1)
if [ "$(cat "$native_stamp" 2>/dev/null)" != "$native_want" ] || ! .venv/bin/python -c "import sluice_native" 2>/dev/null; then
  command -v cargo >/dev/null || { [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"; }
  command -v cargo >/dev/null || { echo "install.sh: cargo (the Rust toolchain) is needed to build native/" >&2; exit 1; }
  t0=$(date +%s)
  rm -rf native/target/wheels
  .venv/bin/maturin build --quiet --release --locked --manifest-path native/Cargo.toml \
    --interpreter .venv/bin/python --out native/target/wheels
  .venv/bin/pip install -q --disable-pip-version-check --no-deps --force-reinstall native/target/wheels/*.whl
  echo "$native_want" > "$native_stamp"
  echo "install.sh: built the native core (native/) in $(( $(date +%s) - t0 )) s"
fi
