#!/usr/bin/env bash
# Checks the Kubernetes manifests offline, in a few seconds: deploy/k8s (the base: agents as a
# StatefulSet with their state on per-pod claims) and deploy/k8s-database (its overlay: state in
# PostgreSQL, agents as a Deployment with a HorizontalPodAutoscaler). For each:
#   * the kustomization renders (`kustomize build` or `kubectl kustomize` when either is
#     installed; otherwise scripts/k8s_check.py applies the subset of kustomize they use), lists
#     every resource and patch file, and lists no template (*.example.yaml);
#   * every document, the templates included, validates STRICTLY (unknown fields are errors)
#     against the OpenAPI schemas of one pinned Kubernetes version, bundled in the PyPI package
#     kubernetes-validate (no network needed once it is installed);
#   * the project's rules: one surface replica per bot account, always a StatefulSet; state dirs
#     on per-pod ReadWriteOnce claims, never on the workspace, unless the agent's state is in
#     PostgreSQL (only such agents may be a Deployment, and only they may be autoscaled); the
#     workspace claim is ReadWriteMany; every container has readiness and liveness probes; every
#     variable set is one the binaries read
#     (surface/src/config/vars.rs, agent/src/config/vars.rs); secrets only as *_FILE, never as
#     literal values or in a ConfigMap; the only Secrets are templates holding the placeholder;
#     every surface's AGENT_URL names every agent pod, or the one Service balancing a Deployment.
# Exits nonzero on any failure; the last line is a one-line summary.
# The validator's virtualenv is cached in $MXBRIDGE_CACHE (default ~/.cache/mxbridge).
# MXBRIDGE_K8S_RENDER=files skips kustomize/kubectl and reads the listed files.
set -euo pipefail
cd "$(dirname "$0")/.."

VALIDATOR_VERSION=1.37.0
# The oldest Kubernetes the manifests promise to work on (every field used is in its API).
K8S_VERSION=1.30
K8S_DIR=deploy/k8s

export MXBRIDGE_CACHE="${MXBRIDGE_CACHE:-$HOME/.cache/mxbridge}"
mkdir -p "$MXBRIDGE_CACHE"
VENV="$MXBRIDGE_CACHE/k8s-venv-$VALIDATOR_VERSION"
if ! "$VENV/bin/python" -c 'import kubernetes_validate' 2>/dev/null; then
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q --disable-pip-version-check \
    "kubernetes-validate==$VALIDATOR_VERSION"
fi

renderer=files
if [ "${MXBRIDGE_K8S_RENDER:-}" != files ]; then
  if command -v kustomize >/dev/null; then
    renderer="kustomize build"
  elif command -v kubectl >/dev/null; then
    renderer="kubectl kustomize"
  fi
fi

# Each kustomization: the base (embedded state, agents as a StatefulSet) and its overlay with
# the state in PostgreSQL (agents as a Deployment).
status=0
for dir in "$K8S_DIR" deploy/k8s-database; do
  rendered="$(mktemp /tmp/mxbridge-k8s.XXXXXX)"
  if [ "$renderer" != files ] && ! $renderer "$dir" >"$rendered"; then
    echo "k8s-check: FAILED: $renderer $dir cannot render the kustomization"
    status=1
  else
    "$VENV/bin/python" scripts/k8s_check.py "$K8S_VERSION" "$dir" "$renderer" "$rendered" || status=1
  fi
  rm -f "$rendered"
done
exit "$status"
