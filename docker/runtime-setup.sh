#!/bin/sh
# Shared set-up of the agent and surface runtime images (used by ../Dockerfile and
# prebuilt.Dockerfile, so the two cannot drift apart).
#
# * one non-root user `bridge` with the SAME uid/gid (10001:10001) in both images, so the agent and
#   the surface can read and write each other's files in the shared /workspace volume;
# * /workspace and the state directories exist in the image, owned by that uid with the setgid bit
#   and group write, so a fresh named volume mounted there inherits that ownership (Docker copies
#   the image's directory metadata into an empty named volume on first mount).
set -eu
BRIDGE_UID="${BRIDGE_UID:-10001}"
BRIDGE_GID="${BRIDGE_GID:-10001}"

export DEBIAN_FRONTEND=noninteractive
apt-get update
# ca-certificates: TLS to a homeserver / OpenAI-compatible endpoint. Nothing else is needed:
# the binaries only link against glibc.
apt-get install -y --no-install-recommends ca-certificates
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/log/apt/* /var/log/dpkg.log

groupadd --system --gid "$BRIDGE_GID" bridge
useradd --system --uid "$BRIDGE_UID" --gid "$BRIDGE_GID" --home-dir /var/lib/bridge \
    --no-create-home --shell /usr/sbin/nologin bridge
for d in /workspace /var/lib/agent /var/lib/surface /var/lib/bridge; do
    install -d -o "$BRIDGE_UID" -g "$BRIDGE_GID" -m 2775 "$d"
done

# No setuid or setgid program is needed by either process (they run as 10001 and never change
# user): take the bits away, so nothing in the image can gain privileges.
find / -xdev -perm /6000 -type f -exec chmod ug-s {} + 2>/dev/null || true
