# shellcheck shell=bash
# Making the stack's images on a machine that may have no registry, no buildx and no Compose v2.
# Sourced by scripts/docker-up.sh (the supported way to start the stack there) and
# scripts/docker-e2e.sh (the test command's compose check); not a command of its own.
#
# The caller defines `say MESSAGE` and `die MESSAGE` and sets CACHE (a scratch/cache folder) and
# PROJECT (the compose project: names of throwaway builder containers, `cid_of`).
#
# Images, each cached by tag + a key label (rebuilt only when the key changes):
#   debian:bookworm-slim              debootstrap --variant=minbase bookworm, `docker import`ed
#   mxbridge-local/synapse:1.163.2    FROM that base: python3 + venv + pip install matrix-synapse
#   mxbridge-local/rust:1.95-bookworm FROM that base: Debian's C toolchain + this machine's Rust
#                                     toolchain and CA bundle (stand-in for rust:1.95-bookworm)

# Cache keys: bump a version string to force a rebuild of that image.
BASE_TAG="debian:bookworm-slim"
BASE_KEY="mxbridge-base-bookworm-minbase-v1"
SYNAPSE_VERSION="1.163.2"
SYNAPSE_TAG="mxbridge-local/synapse:${SYNAPSE_VERSION}"
SYNAPSE_KEY_VERSION="mxbridge-synapse-${SYNAPSE_VERSION}-v1"
RUST_TAG="mxbridge-local/rust:1.95-bookworm"

apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# shellcheck disable=SC2034 # COMPOSE_V2 is for the callers
# find_compose [COMMAND]: sets COMPOSE (an array) and COMPOSE_V2 (1 or 0) to COMMAND (e.g. a
# standalone v2 binary) if given, else the Compose v2 plugin, else docker-compose (v1).
# Returns 1 when there is none.
find_compose() {
    COMPOSE_V2=0
    if [ -n "${1:-}" ]; then
        read -r -a COMPOSE <<<"$1"
        "${COMPOSE[@]}" version 2>/dev/null | grep -qiE 'v2|version 2' && COMPOSE_V2=1
    elif docker compose version >/dev/null 2>&1; then
        COMPOSE=(docker compose)
        COMPOSE_V2=1
    elif command -v docker-compose >/dev/null 2>&1; then
        COMPOSE=(docker-compose)
        docker-compose version --short 2>/dev/null | grep -q '^2' && COMPOSE_V2=1
    else
        return 1
    fi
    return 0
}

cid_of() { # the (possibly stopped) container of a compose service of $PROJECT
    docker ps -a -q --filter "label=com.docker.compose.project=$PROJECT" \
        --filter "label=com.docker.compose.service=$1" | sed -n 1p
}
image_key() { docker image inspect -f '{{ index .Config.Labels "mxbridge.cache-key" }}' "$1" 2>/dev/null || true; }
image_exists() { docker image inspect "$1" >/dev/null 2>&1; }
# image_available TAG: present, or pulled now (fails fast where there is no registry).
image_available() { image_exists "$1" || docker pull -q "$1" >/dev/null 2>&1; }

# wait_healthy SECONDS SERVICE...: every service's container healthy (or dies saying which not).
wait_healthy() {
    local limit=$1 s cid st deadline
    shift
    deadline=$(($(date +%s) + limit))
    for s in "$@"; do
        while :; do
            cid="$(cid_of "$s")"
            st="$([ -n "$cid" ] && docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$cid" 2>/dev/null || echo missing)"
            [ "$st" = healthy ] && break
            case "$st" in exited | dead) die "service $s stopped while waiting for it to be healthy" ;; esac
            [ "$(date +%s)" -lt "$deadline" ] || die "service $s not healthy after ${limit}s (state: $st)"
            sleep 1
        done
    done
}

# ------------------------------------------------------------------------------------------------
# debian:bookworm-slim from Debian packages (debootstrap), cached by tag + key.
detect_mirror() {
    python3 - <<'PY'
import glob, re
cands = []
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for block in re.split(r"\n\s*\n", open(path, encoding="utf-8", errors="replace").read()):
        fields = {}
        for line in block.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            k, v = line.split(":", 1)
            fields[k.strip().lower()] = v.split()
        if "deb" in fields.get("types", []) and "bookworm" in fields.get("suites", []):
            cands += fields.get("uris", [])
for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        continue
    for line in lines:
        parts = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(parts) >= 3 and parts[0] == "deb" and parts[2] == "bookworm":
            cands.append(parts[1])
print(cands[0] if cands else "http://deb.debian.org/debian")
PY
}

build_base() {
    local mirror rootfs
    mirror="$(detect_mirror)"
    if ! command -v debootstrap >/dev/null 2>&1; then
        [ "$(id -u)" = 0 ] || die "making $BASE_TAG needs debootstrap and root (sudo apt-get install debootstrap, then run this as root)"
        apt_install debootstrap
    fi
    [ "$(id -u)" = 0 ] || die "making $BASE_TAG with debootstrap needs root"
    rootfs="$CACHE/rootfs-bookworm"
    rm -rf "$rootfs"
    say "debootstrap --variant=minbase bookworm from $mirror"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -20 "$CACHE/debootstrap.log"; die "debootstrap failed (log: $CACHE/debootstrap.log)"; }
    # Slim it down like the official -slim image: no docs/man/locales, no apt lists, and dpkg
    # excludes so later installs stay slim too.
    rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
        "$rootfs"/usr/share/locale/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
        "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/* "$rootfs"/etc/resolv.conf \
        "$rootfs"/etc/hostname
    mkdir -p "$rootfs/etc/dpkg/dpkg.cfg.d" "$rootfs/etc/apt/apt.conf.d"
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
    cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";
APT::Install-Recommends "false";
EOF
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" \
        >"$rootfs/etc/apt/sources.list"
    tar --numeric-owner -C "$rootfs" -c . | docker import \
        --change "LABEL mxbridge.cache-key=$BASE_KEY" \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' - "$BASE_TAG" >/dev/null
    rm -rf "$rootfs"
}

# ensure_base_image [pull]: $BASE_TAG exists afterwards. An existing image not made here is used
# as it is; with `pull`, a registry is tried before debootstrap.
ensure_base_image() {
    local key
    key="$(image_key "$BASE_TAG")"
    if [ "$key" = "$BASE_KEY" ]; then
        say "$BASE_TAG: cached ($BASE_KEY)"
    elif image_exists "$BASE_TAG" && [ -z "$key" ]; then
        say "$BASE_TAG: using the existing (not locally made) image"
    elif [ "${1:-}" = pull ] && docker pull -q "$BASE_TAG" >/dev/null 2>&1; then
        say "$BASE_TAG: pulled"
    else
        say "$BASE_TAG: building from Debian packages (debootstrap)"
        build_base
    fi
}

# ------------------------------------------------------------------------------------------------
# $SYNAPSE_TAG FROM the base: Debian's python3 + a venv with matrix-synapse from PyPI. Built with
# `docker run` + `docker commit` so the host's CA bundle and pip cache can be mounted for the
# install (an egress that re-signs TLS) without ending up in the image.
ensure_synapse_image() {
    local base_id key ca pip_cache builder mounts
    base_id="$(docker image inspect -f '{{.Id}}' "$BASE_TAG")"
    key="${SYNAPSE_KEY_VERSION}-${base_id#sha256:}"
    key="${key:0:80}"
    if [ "$(image_key "$SYNAPSE_TAG")" = "$key" ]; then
        say "$SYNAPSE_TAG: cached"
        return 0
    fi
    say "$SYNAPSE_TAG: building (pip install matrix-synapse==$SYNAPSE_VERSION)"
    ca="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
    pip_cache="$CACHE/pip-cache" # our own; mounted outside /root so nothing below deletes it
    mkdir -p "$pip_cache"
    builder="$PROJECT-synapse-build"
    docker rm -f "$builder" >/dev/null 2>&1 || true
    mounts=(-v "$pip_cache:/run/pip-cache")
    [ -f "$ca" ] && mounts+=(-v "$ca:/run/host-ca.crt:ro")
    docker run --name "$builder" "${mounts[@]}" "$BASE_TAG" sh -euc "
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates >/dev/null
        python3 -m venv /opt/synapse
        if [ -f /run/host-ca.crt ]; then export PIP_CERT=/run/host-ca.crt; fi
        /opt/synapse/bin/pip install -q --disable-pip-version-check --cache-dir /run/pip-cache 'matrix-synapse==$SYNAPSE_VERSION'
        /opt/synapse/bin/python -c 'import synapse; print(\"synapse\", synapse.__version__)'
        groupadd --system --gid 991 synapse
        useradd --system --uid 991 --gid 991 --home-dir /data --no-create-home synapse
        install -d -o 991 -g 991 /data
        apt-get clean; rm -rf /var/lib/apt/lists/* /tmp/*
        find /opt/synapse -name __pycache__ -prune -exec rm -rf {} +
    " >"$CACHE/synapse-build.log" 2>&1 \
        || { tail -30 "$CACHE/synapse-build.log"; docker rm -f "$builder" >/dev/null; die "synapse image build failed (log: $CACHE/synapse-build.log)"; }
    docker commit \
        --change "LABEL mxbridge.cache-key=$key" \
        --change 'ENV PATH=/opt/synapse/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'WORKDIR /data' \
        --change 'EXPOSE 8008' \
        --change 'ENTRYPOINT []' \
        --change 'CMD ["python3", "-m", "synapse.app.homeserver", "--config-path", "/data/homeserver.yaml"]' \
        "$builder" "$SYNAPSE_TAG" >/dev/null
    docker rm -f "$builder" >/dev/null
}

# ------------------------------------------------------------------------------------------------
# find_buildkit: defines `bk_build ARGS...` (a `docker build` through BuildKit, loading the image
# into the engine) and returns 0, or returns 1 when this machine has no BuildKit client: the
# buildx plugin, or a docker CLI older than 23 (whose `DOCKER_BUILDKIT=1 docker build` needs no
# plugin; Debian's /usr/bin/docker may be one next to a newer docker on the PATH).
find_buildkit() {
    local bin
    if docker buildx version >/dev/null 2>&1; then
        bk_build() { docker buildx build --load "$@"; }
        return 0
    fi
    for bin in docker /usr/bin/docker; do
        command -v "$bin" >/dev/null 2>&1 || continue
        if [ "$("$bin" version -f '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)" -lt 23 ] 2>/dev/null; then
            BK_DOCKER="$(command -v "$bin")"
            bk_build() { DOCKER_BUILDKIT=1 "$BK_DOCKER" build "$@"; }
            return 0
        fi
    done
    return 1
}

# ensure_rust_image: $RUST_TAG, a local stand-in for rust:1.95-bookworm: the base image, Debian's
# C toolchain, this machine's Rust toolchain and its CA bundle.
ensure_rust_image() {
    local sysroot ca base_id key builder
    command -v rustc >/dev/null 2>&1 || die "no rustc: the local stand-in for rust:1.95-bookworm copies this machine's Rust toolchain"
    sysroot="$(rustc --print sysroot)"
    ca="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
    base_id="$(docker image inspect -f '{{.Id}}' "$BASE_TAG")"
    key="mxbridge-rust-v1-$(rustc -V | tr -c 'a-zA-Z0-9.\n' '-')-$(sha256sum "$ca" | cut -c1-12)-${base_id#sha256:}"
    key="${key:0:120}"
    if [ "$(image_key "$RUST_TAG")" = "$key" ]; then
        say "$RUST_TAG: cached"
        return 0
    fi
    say "$RUST_TAG: building (Debian's gcc/cmake + this machine's $(rustc -V | cut -d' ' -f1-2))"
    builder="$PROJECT-rust-build"
    docker rm -f "$builder" >/dev/null 2>&1 || true
    docker run --name "$builder" -v "$sysroot:/run/toolchain:ro" -v "$ca:/run/host-ca.crt:ro" "$BASE_TAG" sh -euc '
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends ca-certificates gcc g++ libc6-dev make cmake \
            pkg-config perl binutils >/dev/null
        cat /run/host-ca.crt > /etc/ssl/certs/ca-certificates.crt
        mkdir -p /usr/local/rust /usr/local/cargo
        cp -a /run/toolchain/bin /run/toolchain/lib /usr/local/rust/
        /usr/local/rust/bin/cargo --version
        apt-get clean; rm -rf /var/lib/apt/lists/* /tmp/*
    ' >"$CACHE/rust-build.log" 2>&1 \
        || { tail -30 "$CACHE/rust-build.log"; docker rm -f "$builder" >/dev/null; die "builder image failed (log: $CACHE/rust-build.log)"; }
    docker commit \
        --change "LABEL mxbridge.cache-key=$key" \
        --change 'ENV CARGO_HOME=/usr/local/cargo' \
        --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV CARGO_HTTP_CAINFO=/etc/ssl/certs/ca-certificates.crt' \
        "$builder" "$RUST_TAG" >/dev/null
    docker rm -f "$builder" >/dev/null
}

# ------------------------------------------------------------------------------------------------
# stage_prebuilt BIN_DIR CTX: the build context of docker/prebuilt.Dockerfile (compose.local.yaml)
# in CTX: BIN_DIR's agent and surface without debug info, and the runtime files of docker/.
# A binary that did not change keeps its file (and so the image layer cache).
stage_prebuilt() {
    local bin_dir=$1 ctx=$2 repo b
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    mkdir -p "$ctx/bin"
    for b in agent surface; do
        [ -x "$bin_dir/$b" ] || die "no binary $bin_dir/$b"
        objcopy --strip-debug "$bin_dir/$b" "$ctx/bin/$b.tmp" 2>/dev/null || cp "$bin_dir/$b" "$ctx/bin/$b.tmp"
        if cmp -s "$ctx/bin/$b.tmp" "$ctx/bin/$b"; then rm -f "$ctx/bin/$b.tmp"; else mv "$ctx/bin/$b.tmp" "$ctx/bin/$b"; fi
    done
    cp "$repo/docker/prebuilt.Dockerfile" "$repo/docker/runtime-setup.sh" "$repo/docker/entrypoint.sh" \
        "$repo/docker/healthcheck.sh" "$ctx/"
}

# remove_replaced_images OLD_IDS TAG...: drops the images the tags pointed to before a rebuild
# (repeat runs must not fill the disk); an image a container still uses stays.
remove_replaced_images() {
    local old_ids=$1 new_ids id
    shift
    new_ids="$(docker image inspect -f '{{.Id}}' "$@" 2>/dev/null || true)"
    for id in $old_ids; do
        grep -q "$id" <<<"$new_ids" || docker rmi "$id" >/dev/null 2>&1 || true
    done
}
