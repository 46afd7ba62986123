"""The checks of scripts/k8s-check.sh for one kustomization (its header says what they are).

Usage: k8s_check.py K8S_VERSION FOLDER RENDERER RENDERED
RENDERER is "files" (render here) or the kustomize command that wrote RENDERED.
"""
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


def ident(doc):
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


# --- the kustomization lists every resource file and no template -------------------------------
kustomization = (load(os.path.join(root, "kustomization.yaml")) or [{}])[0]
listed = kustomization.get("resources") or []
patch_files = [p.get("path") for p in kustomization.get("patches") or []]
files = sorted(f for f in os.listdir(root)
               if f.endswith((".yaml", ".yml")) and not f.startswith("kustomization."))
templates = [f for f in files if ".example." in f]
for f in files:
    if f not in templates:
        check(f in listed or f in patch_files, f"{root}/kustomization.yaml does not list {f}")
for f in listed:
    path = os.path.join(root, f)
    check(os.path.isfile(path) or os.path.isfile(os.path.join(path, "kustomization.yaml")),
          f"{root}/kustomization.yaml lists {f}, which does not exist")
    check(f not in templates, f"{root}/kustomization.yaml lists the template {f} (apply would overwrite real values)")
for f in patch_files:
    check(f is not None and os.path.isfile(os.path.join(root, f)),
          f"{root}/kustomization.yaml patches with {f}, which does not exist")


# --- without kustomize: the subset of it these manifests use ------------------------------------
# Resources are files or kustomization folders; patches are strategic merge patches (a mapping
# merges, null removes a field, a list of named items merges by name, `$patch: delete` removes
# the resource).
def merge(base, patch):
    if not isinstance(base, dict) or not isinstance(patch, dict):
        if isinstance(base, list) and isinstance(patch, list) and all(
                isinstance(i, dict) and "name" in i for i in base + patch):
            out = [dict(i) for i in base]
            for item in patch:
                at = next((n for n, i in enumerate(out) if i["name"] == item["name"]), None)
                if at is None:
                    out.append(item)
                else:
                    out[at] = merge(out[at], item)
            return out
        return patch
    out = dict(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v) if k in out else v
    return out


def render_files(folder):
    k = (load(os.path.join(folder, "kustomization.yaml")) or [{}])[0]
    docs = []
    for r in k.get("resources") or []:
        path = os.path.normpath(os.path.join(folder, r))
        if os.path.isdir(path):
            docs += render_files(path)
        elif os.path.isfile(path):
            docs += [(path, d) for d in load(path)]
    for p in k.get("patches") or []:
        path = os.path.join(folder, p.get("path") or "")
        for patch in load(path) if os.path.isfile(path) else []:
            target = next((n for n, (_, d) in enumerate(docs) if ident(d) == ident(patch)), None)
            if not check(target is not None, f"{path}: patches {ident(patch)}, which no resource is"):
                continue
            if patch.get("$patch") == "delete":
                del docs[target]
            else:
                src, doc = docs[target]
                docs[target] = (f"{src} + {path}", merge(doc, patch))
    return docs


# --- the documents: what `kubectl apply -k` would send, then the templates ----------------------
if renderer != "files":
    applied = [(f"{renderer} {root}", d) for d in load(rendered)]
else:
    applied = render_files(root)
template_docs = [(f"{root}/{f}", d) for f in templates for d in load(os.path.join(root, f))]


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

    def settings_of(what, container):
        """Every variable the container gets, and its value when known."""
        out = {}
        for src in container.get("envFrom") or []:
            ref = (src.get("configMapRef") or {}).get("name")
            if ref is not None:
                cm = configmaps.get(ref)
                if check(cm is not None, f"{what}: envFrom names ConfigMap/{ref}, which is not in the kustomization"):
                    out.update(cm.get("data") or {})
        for e in container.get("env") or []:
            if "value" in e:
                check(e["name"] not in SECRETS, f"{what}: {e['name']} has a literal value; use {e['name']}_FILE")
            elif e["name"] in SECRETS:
                check("configMapKeyRef" not in (e.get("valueFrom") or {}),
                      f"{what}: {e['name']} comes from a ConfigMap; it is a secret")
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
    workloads = [("StatefulSet", n, d) for n, d in by_kind.get("StatefulSet", {}).items()]
    workloads += [("Deployment", n, d) for n, d in by_kind.get("Deployment", {}).items()]
    for kind, name, sts in workloads:
        what = f"{kind}/{name}"
        spec = sts["spec"]
        pod = spec["template"]["spec"]
        templates_by_name = {t["metadata"]["name"]: t for t in spec.get("volumeClaimTemplates") or []}
        pod_volumes = {v["name"]: v for v in pod.get("volumes") or []}
        for c in (pod.get("initContainers") or []) + pod["containers"]:
            for probe in ("readinessProbe", "livenessProbe"):
                check(probe in c, f"{what}: container {c['name']} has no {probe}")
            program = program_of(c)
            if not check(program is not None, f"{what}: container {c['name']} runs neither mxbridge/agent nor mxbridge/surface"):
                continue
            known, secrets = programs[program]
            env = settings_of(what, c)
            for var in env:
                ok = var in known or var in EXTRA_ENV or (var.endswith("_FILE") and var[:-5] in secrets)
                check(ok, f"{what}: {var} is not a setting of the {program}")
            workspace = env.get("WORKSPACE_ROOT") or "/workspace"
            ws_vol = mount_source(what, c, workspace)
            ws_claim = ((pod_volumes.get(ws_vol) or {}).get("persistentVolumeClaim") or {}).get("claimName")
            if check(ws_claim is not None, f"{what}: {workspace} (WORKSPACE_ROOT) is not on a shared claim"):
                pvc = claims.get(ws_claim)
                if check(pvc is not None, f"{what}: the workspace claim {ws_claim} is not in the kustomization"):
                    check(pvc["spec"].get("accessModes") == ["ReadWriteMany"],
                          f"PersistentVolumeClaim/{ws_claim}: the workspace must be ReadWriteMany")
            database = program == "agent" and ("AGENT_DATABASE_URL" in env or "AGENT_DATABASE_URL_FILE" in env)
            if kind == "Deployment":
                # Replicas of a Deployment share no disk and come and go: only a stateless agent.
                check(database, f"{what}: only agents with AGENT_DATABASE_URL_FILE (state in PostgreSQL) may be a Deployment; "
                      "an embedded store needs a StatefulSet with a claim per pod")
            elif not database:
                state = env.get(STATE_VAR[program]) or DEFAULT_STATE[program]
                check(not (state == workspace or state.startswith(workspace.rstrip("/") + "/")),
                      f"{what}: {STATE_VAR[program]} {state} is inside the workspace")
                st_vol = mount_source(what, c, state)
                tmpl = templates_by_name.get(st_vol)
                if check(tmpl is not None, f"{what}: {STATE_VAR[program]} {state} is not on a volumeClaimTemplate of its own"):
                    check(tmpl["spec"].get("accessModes") in (["ReadWriteOnce"], ["ReadWriteOncePod"]),
                          f"{what}: the state claim {st_vol} must be ReadWriteOnce")
            port = (env.get("AGENT_BIND") or "127.0.0.1:8700").rsplit(":", 1)[1]
            if program == "surface":
                check(kind == "StatefulSet" and spec.get("replicas") == 1,
                      f"{what}: a surface must be a StatefulSet with replicas: 1 (one /sync consumer per bot account)")
                surfaces.append((what, env.get("AGENT_URL") or ""))
            elif kind == "StatefulSet":
                svc = services.get(spec.get("serviceName"))
                if check(svc is not None and svc["spec"].get("clusterIP") == "None",
                         f"{what}: serviceName must name a headless Service in the kustomization"):
                    agents += [f"ws://{name}-{i}.{spec['serviceName']}:{port}" for i in range(spec.get("replicas", 1))]
            else:
                labels = spec["template"]["metadata"].get("labels") or {}
                balanced = [n for n, svc in services.items()
                            if svc["spec"].get("clusterIP") != "None" and svc["spec"].get("selector")
                            and all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())]
                if check(len(balanced) == 1, f"{what}: one load-balanced Service must select its pods (found {balanced})"):
                    agents.append(f"ws://{balanced[0]}:{port}")
    for name, url in surfaces:
        have = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        check(sorted(have) == sorted(agents),
              f"{name}: AGENT_URL must be every agent pod or agent Service: {','.join(agents)} (has {url!r})")
    for name, hpa in by_kind.get("HorizontalPodAutoscaler", {}).items():
        ref = hpa["spec"]["scaleTargetRef"]
        target = by_kind.get(ref.get("kind"), {}).get(ref.get("name"))
        check(target is not None, f"HorizontalPodAutoscaler/{name}: scales {ref.get('kind')}/{ref.get('name')}, which is not in the kustomization")
        check(ref.get("kind") == "Deployment" and target is not None and not any(
            program_of(c) == "surface" for c in target["spec"]["template"]["spec"]["containers"]),
            f"HorizontalPodAutoscaler/{name}: only the stateless agents' Deployment may be scaled automatically")

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
