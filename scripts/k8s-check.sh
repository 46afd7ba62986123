#!/usr/bin/env bash
# Checks the Kubernetes manifests in deploy/k8s offline, in a few seconds:
#   * the kustomization renders (`kustomize build` or `kubectl kustomize` when either is
#     installed; otherwise the files its `resources:` lists are read as they are), lists every
#     resource file, and lists no template (*.example.yaml);
#   * every document, the templates included, validates STRICTLY (unknown fields are errors)
#     against the OpenAPI schemas of one pinned Kubernetes version, bundled in the PyPI package
#     kubernetes-validate (no network needed once it is installed);
#   * the project's rules: one surface replica per bot account; state dirs on per-pod
#     ReadWriteOnce claims, never on the workspace; the workspace claim is ReadWriteMany; every
#     container has readiness and liveness probes; every variable set is one the binaries read
#     (surface/src/config/vars.rs, agent/src/config/vars.rs); secrets only as *_FILE, never as
#     literal values or in a ConfigMap; the only Secrets are templates holding the placeholder;
#     every surface's AGENT_URL names every agent pod.
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

rendered="$(mktemp /tmp/mxbridge-k8s.XXXXXX)"
trap 'rm -f "$rendered"' EXIT
renderer=files
if [ "${MXBRIDGE_K8S_RENDER:-}" != files ]; then
  if command -v kustomize >/dev/null; then
    renderer="kustomize build"
  elif command -v kubectl >/dev/null; then
    renderer="kubectl kustomize"
  fi
fi
if [ "$renderer" != files ]; then
  if ! $renderer "$K8S_DIR" >"$rendered"; then
    echo "k8s-check: FAILED: $renderer $K8S_DIR cannot render the kustomization"
    exit 1
  fi
fi

"$VENV/bin/python" - "$K8S_VERSION" "$K8S_DIR" "$renderer" "$rendered" <<'PY'
import base64
import os
import re
import sys

import yaml
from kubernetes_validate import utils as kv
from kubernetes_validate.version import __version__ as validator_version

k8s_version, root, renderer, rendered = sys.argv[1:5]
PLACEHOLDER = "change-me"
problems = []
checks = 0


def check(ok, message):
    global checks
    checks += 1
    if not ok and message not in problems:
        problems.append(message)
        print("FAIL", message)
    return ok


def load(path):
    try:
        with open(path) as f:
            return [d for d in yaml.safe_load_all(f) if d]
    except yaml.YAMLError as e:
        check(False, f"{path}: not YAML: {' '.join(str(e).split())}")
        return []


# --- the kustomization lists every resource file and no template -------------------------------
kustomization = (load(os.path.join(root, "kustomization.yaml")) or [{}])[0]
listed = kustomization.get("resources") or []
files = sorted(f for f in os.listdir(root)
               if f.endswith((".yaml", ".yml")) and not f.startswith("kustomization."))
templates = [f for f in files if ".example." in f]
for f in files:
    if f not in templates:
        check(f in listed, f"{root}/kustomization.yaml does not list {f}")
for f in listed:
    check(os.path.isfile(os.path.join(root, f)), f"{root}/kustomization.yaml lists {f}, which does not exist")
    check(f not in templates, f"{root}/kustomization.yaml lists the template {f} (apply would overwrite real values)")

# --- the documents: what `kubectl apply -k` would send, then the templates ----------------------
if renderer != "files":
    applied = [(f"{renderer} {root}", d) for d in load(rendered)]
else:
    applied = [(f"{root}/{f}", d) for f in listed if os.path.isfile(os.path.join(root, f))
               for d in load(os.path.join(root, f))]
template_docs = [(f"{root}/{f}", d) for f in templates for d in load(os.path.join(root, f))]


def ident(doc):
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


for source, doc in applied + template_docs:
    try:
        kv.validate(doc, k8s_version, strict=True)
        check(True, "")
    except kv.ValidationError as e:
        path = ".".join(str(p) for p in e.path) or "(top)"
        check(False, f"{source}: {ident(doc)}: {path}: {e.message}")
    except (kv.SchemaNotFoundError, kv.InvalidSchemaError) as e:
        check(False, f"{source}: {ident(doc)}: {e.message}")

# --- project rules -------------------------------------------------------------------------------
# (After the schema check: a document the schemas refused may not have the shape read here.)
def project_rules():
    def read_vars(path):
        text = open(path).read()
        found = re.findall(r'Var::(new|secret)\(\s*"([A-Z0-9_]+)"', text)
        return {name for _, name in found}, {name for kind, name in found if kind == "secret"}

    programs = {
        "surface": read_vars("surface/src/config/vars.rs"),
        "agent": read_vars("agent/src/config/vars.rs"),
    }
    SECRETS = programs["surface"][1] | programs["agent"][1]
    EXTRA_ENV = {"RUST_LOG", "NO_COLOR", "TMPDIR"}  # read by the runtime, not by the config tables

    docs = [d for _, d in applied]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), {})[d["metadata"]["name"]] = d
    configmaps = by_kind.get("ConfigMap", {})
    claims = by_kind.get("PersistentVolumeClaim", {})
    services = by_kind.get("Service", {})

    for name, cm in configmaps.items():
        for key in (cm.get("data") or {}):
            check(key not in SECRETS, f"ConfigMap/{name}: {key} is a secret; mount it as a file and set {key}_FILE")

    def program_of(container):
        image = container.get("image", "")
        return next((p for p in programs if f"mxbridge/{p}" in image), None)

    def settings_of(sts, container):
        """Every variable the container gets, and its value when known."""
        out = {}
        for src in container.get("envFrom") or []:
            ref = (src.get("configMapRef") or {}).get("name")
            if ref is not None:
                cm = configmaps.get(ref)
                if check(cm is not None, f"StatefulSet/{sts}: envFrom names ConfigMap/{ref}, which is not in the kustomization"):
                    out.update(cm.get("data") or {})
        for e in container.get("env") or []:
            if "value" in e:
                check(e["name"] not in SECRETS, f"StatefulSet/{sts}: {e['name']} has a literal value; use {e['name']}_FILE")
            elif e["name"] in SECRETS:
                check("configMapKeyRef" not in (e.get("valueFrom") or {}),
                      f"StatefulSet/{sts}: {e['name']} comes from a ConfigMap; it is a secret")
            out[e["name"]] = e.get("value")
        return out

    def mount_source(sts, container, path):
        """The volume name mounted at `path` or above it (longest match)."""
        best = None
        for m in container.get("volumeMounts") or []:
            mp = m["mountPath"].rstrip("/")
            if path == mp or path.startswith(mp + "/"):
                if best is None or len(mp) > len(best[0]):
                    best = (mp, m["name"])
        return best and best[1]

    DEFAULT_STATE = {"surface": "/var/lib/surface", "agent": "/var/lib/agent"}
    STATE_VAR = {"surface": "SURFACE_STATE_DIR", "agent": "AGENT_STATE_DIR"}
    agents, surfaces = [], []
    for name, sts in by_kind.get("StatefulSet", {}).items():
        spec = sts["spec"]
        pod = spec["template"]["spec"]
        templates_by_name = {t["metadata"]["name"]: t for t in spec.get("volumeClaimTemplates") or []}
        pod_volumes = {v["name"]: v for v in pod.get("volumes") or []}
        for c in (pod.get("initContainers") or []) + pod["containers"]:
            for probe in ("readinessProbe", "livenessProbe"):
                check(probe in c, f"StatefulSet/{name}: container {c['name']} has no {probe}")
            program = program_of(c)
            if not check(program is not None, f"StatefulSet/{name}: container {c['name']} runs neither mxbridge/agent nor mxbridge/surface"):
                continue
            known, secrets = programs[program]
            env = settings_of(name, c)
            for var in env:
                ok = var in known or var in EXTRA_ENV or (var.endswith("_FILE") and var[:-5] in secrets)
                check(ok, f"StatefulSet/{name}: {var} is not a setting of the {program}")
            workspace = env.get("WORKSPACE_ROOT") or "/workspace"
            state = env.get(STATE_VAR[program]) or DEFAULT_STATE[program]
            ws_vol = mount_source(name, c, workspace)
            ws_claim = ((pod_volumes.get(ws_vol) or {}).get("persistentVolumeClaim") or {}).get("claimName")
            if check(ws_claim is not None, f"StatefulSet/{name}: {workspace} (WORKSPACE_ROOT) is not on a shared claim"):
                pvc = claims.get(ws_claim)
                if check(pvc is not None, f"StatefulSet/{name}: the workspace claim {ws_claim} is not in the kustomization"):
                    check(pvc["spec"].get("accessModes") == ["ReadWriteMany"],
                          f"PersistentVolumeClaim/{ws_claim}: the workspace must be ReadWriteMany")
            check(not (state == workspace or state.startswith(workspace.rstrip("/") + "/")),
                  f"StatefulSet/{name}: {STATE_VAR[program]} {state} is inside the workspace")
            st_vol = mount_source(name, c, state)
            tmpl = templates_by_name.get(st_vol)
            if check(tmpl is not None, f"StatefulSet/{name}: {STATE_VAR[program]} {state} is not on a volumeClaimTemplate of its own"):
                check(tmpl["spec"].get("accessModes") in (["ReadWriteOnce"], ["ReadWriteOncePod"]),
                      f"StatefulSet/{name}: the state claim {st_vol} must be ReadWriteOnce")
            if program == "surface":
                check(spec.get("replicas") == 1,
                      f"StatefulSet/{name}: a surface must have replicas: 1 (one /sync consumer per bot account), not {spec.get('replicas')}")
                surfaces.append((name, env.get("AGENT_URL") or ""))
            else:
                port = (env.get("AGENT_BIND") or "127.0.0.1:8700").rsplit(":", 1)[1]
                svc = services.get(spec.get("serviceName"))
                if check(svc is not None and svc["spec"].get("clusterIP") == "None",
                         f"StatefulSet/{name}: serviceName must name a headless Service in the kustomization"):
                    agents += [f"ws://{name}-{i}.{spec['serviceName']}:{port}" for i in range(spec.get("replicas", 1))]
    for name, url in surfaces:
        have = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        check(sorted(have) == sorted(agents),
              f"StatefulSet/{name}: AGENT_URL must list every agent pod: {','.join(agents)} (has {url!r})")

    check("Secret" not in by_kind, "the kustomization applies a Secret; create Secrets with kubectl, keep only *.example.yaml templates")
    for source, doc in template_docs:
        if doc.get("kind") != "Secret":
            continue
        values = dict(doc.get("stringData") or {})
        for k, v in (doc.get("data") or {}).items():
            values[k] = base64.b64decode(v).decode(errors="replace")
        for k, v in values.items():
            check(v == PLACEHOLDER, f"{source}: {ident(doc)}: {k} holds a value; a template holds only {PLACEHOLDER!r}")


try:
    project_rules()
except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
    check(False, f"project rules stopped at a malformed document ({type(e).__name__}: {e})")

n_docs = len(applied) + len(template_docs)
where = f"{n_docs} documents ({renderer}), kubernetes-validate {validator_version}, Kubernetes {k8s_version} strict"
if problems:
    print(f"k8s-check: FAILED: {len(problems)} of {checks} checks failed; {where}")
    sys.exit(1)
print(f"k8s-check: OK: {checks} checks passed; {where}")
PY
