#!/usr/bin/env bash
# Lint, render and validate the Helm chart deploy/helm/prescale, offline.
#
# - `helm lint --strict` and `helm template` run through Helm's own Go SDK (v4), shipped as a
#   prebuilt library in the PyPI wheel `helm-python-sdk` (no helm binary, no download outside
#   the package registries).
# - Every rendered manifest is validated against the Kubernetes OpenAPI schemas (strict: unknown
#   fields are errors) of the oldest Kubernetes the chart supports and of the newest one
#   packaged, with PyPI's `kubernetes-validate`; CRD kinds (cert-manager, ServiceMonitor) get
#   structural checks here. Then cross-object checks: selectors, ports, Secrets, security
#   context, RBAC limited to an allow-list, one-APIService warning, and so on.
# - Scenarios: default values, every optional feature enabled, TLS with an existing Secret +
#   mTLS, a minimal install, and values that must be rejected.
# - The examples' HPA (autoscaling/v2) is validated the same way, and examples/metrics.yaml is
#   checked against externalMetrics' shape.
#
# Installs what it needs into a virtualenv (PRESCALE_CHART_VENV, default
# ~/.cache/prescale/chart-venv) the first time. Exits non-zero on any problem.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_SDK_VERSION=0.2.2          # helm-python-sdk: Helm v4.2.3's Go SDK
KUBE_VALIDATE_VERSION=1.37.0    # kubernetes-validate: schemas for Kubernetes 1.25 … 1.37
VENV="${PRESCALE_CHART_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/prescale/chart-venv}"

if ! "$VENV/bin/python" - <<EOF 2>/dev/null
import importlib.metadata as m
assert m.version("helm-python-sdk") == "$HELM_SDK_VERSION"
assert m.version("kubernetes-validate") == "$KUBE_VALIDATE_VERSION"
EOF
then
    echo "check-chart: installing helm-python-sdk $HELM_SDK_VERSION and kubernetes-validate $KUBE_VALIDATE_VERSION into $VENV" >&2
    if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -m ensurepip --version >/dev/null 2>&1; then
        (apt-get update -qq && apt-get install -y -qq python3-venv) >/dev/null
    fi
    rm -rf "$VENV"; mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check \
        "helm-python-sdk==$HELM_SDK_VERSION" "kubernetes-validate==$KUBE_VALIDATE_VERSION" pyyaml
fi

exec "$VENV/bin/python" - "$@" <<'PY'
import copy
import json
import os
import re
import shutil
import subprocess
import sys

import helm_python as helm
import kubernetes_validate as kv
import yaml

CHART = os.environ.get("PRESCALE_CHART_DIR", "deploy/helm/prescale")
NAMESPACE = "prescale"
RELEASE = "prescale"
KUBE_VERSIONS = ["1.27.0", kv.latest_version()]
PRESCALE_BIN = os.environ.get(
    "PRESCALE_BIN", os.path.join(os.environ.get("CARGO_TARGET_DIR") or "target", "debug", "prescale"))
checked_metadata = 0

problems = []


def problem(scenario, msg):
    problems.append(f"[{scenario}] {msg}")


# ---------------------------------------------------------------------------- scenarios
ALL_FEATURES = {
    "replicaCount": 3,
    "logLevel": "info,prescale=debug",
    "extraArgs": ["--idle-drop-seconds=900"],
    "extraEnv": [{"name": "RABBITMQ_URL", "valueFrom": {"secretKeyRef": {"name": "rabbitmq", "key": "url"}}}],
    "envFrom": [{"secretRef": {"name": "prescale-aws"}}],
    "extraVolumes": [{"name": "kafka-ca", "secret": {"secretName": "kafka-ca"}}],
    "extraVolumeMounts": [{"name": "kafka-ca", "mountPath": "/etc/kafka-ca", "readOnly": True}],
    "imagePullSecrets": [{"name": "regcred"}],
    "image": {"digest": "sha256:" + "0" * 64},
    "service": {"headless": True, "annotations": {"a": "b"}, "labels": {"team": "ml"}},
    "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/prescale"}},
    "rbac": {"karpenter": {"enabled": True, "resizeNodePools": True}},
    "tls": {"enabled": True, "certManager": {"enabled": True, "extraDnsNames": ["prescale.example.internal"]}},
    "externalMetrics": {
        "enabled": True,
        "metrics": [
            {"name": "llama-queue", "metadata": {"rabbitmqHostFromEnv": "RABBITMQ_URL",
                                                 "rabbitmqQueueName": "llama", "rabbitmqPerReplica": 20}},
        ],
    },
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"},
                       "metricRelabelings": [{"action": "drop", "regex": "go_.*", "sourceLabels": ["__name__"]}]},
    "history": {"prometheus": "http://prometheus-operated.monitoring:9090", "lookback": "7d"},
    "networkPolicy": {"enabled": True, "keda": {"podSelector": {"matchLabels": {"app": "keda-operator"}}},
                      "extraIngress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": "http"}]}]},
    "grafanaDashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "Platform"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"},
                       "alertLabels": {"team": "ml-platform"}, "lateShare": 0.1},
    "podAnnotations": {"x": "y"},
    "podLabels": {"tier": "control"},
    "priorityClassName": "system-cluster-critical",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
}
SCENARIOS = {
    "default": {},
    "all-features": ALL_FEATURES,
    "tls-secret-mtls": {"tls": {"enabled": True, "secretName": "prescale-tls", "clientAuth": True,
                                "clientCASecretName": "keda-client-ca"}},
    "external-metrics-secret": {"externalMetrics": {"enabled": True, "tlsSecretName": "prescale-metrics-tls",
                                                    "requestheaderAllowedNames": ["front-proxy-client", "aggregator"], "apiService": {"caBundle": "TFMwdExTMUNSVWRKVGc9PQ=="},
                                                    "metrics": [{"name": "llama_sqs", "metadata": {"sqsQueueURL": "https://sqs.eu-west-1.amazonaws.com/123456789012/q",
                                                                                   "sqsAwsRegion": "eu-west-1"}}]}},
    "cert-manager-own-issuer": {"tls": {"enabled": True, "certManager": {"enabled": True,
                                "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}},
    "external-metrics-cert-manager-only": {"tls": {"certManager": {"enabled": True}},
                                           "externalMetrics": {"enabled": True, "metrics": [
                                               {"name": "llama-queue", "labels": {"model": "llama"},
                                                "metadata": {"vllmEndpoints": "http://10.0.0.1:8000", "warmupSeconds": "auto"}}]}},
    "headroom-namespaces": {"headroom": {"namespaces": ["ml", "media", "ml"]}},
    "minimal": {"replicaCount": 1, "headroom": {"enabled": False}, "leaderElection": {"enabled": False},
                "rbac": {"karpenter": {"enabled": False}}},
    "no-rbac": {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "existing"}},
}
# Values the chart must refuse (render fails with a message containing the needle).
MUST_FAIL = {
    "external-metrics-without-cert": ({"externalMetrics": {"enabled": True}}, "needs a serving certificate"),
    "tls-without-secret": ({"tls": {"enabled": True}}, "tls.secretName"),
    "mtls-without-tls": ({"tls": {"clientAuth": True}}, "tls.clientAuth needs tls.enabled"),
    "apiservice-without-ca": ({"externalMetrics": {"enabled": True, "tlsSecretName": "s"}}, "caBundle"),
    "uppercase-metric": ({"tls": {"certManager": {"enabled": True}},
                          "externalMetrics": {"enabled": True, "metrics": [{"name": "LlamaQueue", "metadata": {"a": "b"}}]}}, "lowercase"),
    "positive-priority": ({"headroom": {"priorityClass": {"value": 10}}}, "negative"),
    "alerts-without-their-scrape": ({"prometheusRule": {"enabled": True}}, "prometheusRule.job"),
    # values.schema.json: a misspelt key or a wrong type is refused, not silently ignored.
    "misspelt-key": ({"prometheusRule": {"enabeld": True}}, "enabeld"),
    "wrong-type": ({"replicaCount": "two"}, "replicaCount"),
    "unknown-pull-policy": ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
}

# RBAC allow-list: (apiGroup, resource) -> verbs prescale may ever be granted (least privilege).
ALLOWED_CLUSTER = {
    ("keda.sh", "scaledobjects"): {"get", "list", "watch"},
    ("apps", "deployments"): {"get", "list", "watch"},
    ("apps", "statefulsets"): {"get", "list", "watch"},
    ("", "pods"): {"list", "watch"},
    ("", "nodes"): {"list", "watch"},
    ("discovery.k8s.io", "endpointslices"): {"list", "watch"},
    ("karpenter.sh", "nodepools"): {"list", "watch", "patch"},
    ("karpenter.sh", "nodeclaims"): {"list", "watch"},
    ("karpenter.sh", "nodepools/scale"): {"get", "update", "patch"},
    ("external.metrics.k8s.io", "*"): {"get", "list"},  # the HPA reader role, bound to kube-system/horizontal-pod-autoscaler only
}
ALLOWED_NAMESPACED = {
    ("", "pods"): {"get", "create", "update", "patch", "delete"},
    ("coordination.k8s.io", "leases"): {"get", "create", "update"},
}
# Cluster-scoped rules that must name their objects (resourceNames).
ALLOWED_NAMED = {("scheduling.k8s.io", "priorityclasses"): {"get"}}
ALLOWED_BUILTIN_ROLES = {"system:auth-delegator", "extension-apiserver-authentication-reader"}


def deep_merge(base, over):
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def render(chart, values):
    files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs, notes = [], ""
    for path, text in sorted(files.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        if not path.endswith((".yaml", ".yml")):
            continue
        for d in yaml.safe_load_all(text):
            if d is not None:
                docs.append((path, d))
    return docs, notes


# ---------------------------------------------------------------------------- per-object checks
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_crd_kind(sc, d):
    """Structural checks for kinds whose schema is not in the Kubernetes OpenAPI."""
    kind, spec = d["kind"], d.get("spec") or {}
    if d["apiVersion"] == "cert-manager.io/v1" and kind == "Certificate":
        for f in ("secretName", "issuerRef"):
            if f not in spec:
                problem(sc, f"Certificate {d['metadata']['name']}: spec.{f} missing")
        if not spec.get("isCA") and not spec.get("dnsNames"):
            problem(sc, f"Certificate {d['metadata']['name']}: no dnsNames")
        allowed = {"secretName", "issuerRef", "dnsNames", "duration", "renewBefore", "privateKey", "usages", "isCA", "commonName"}
        if set(spec) - allowed:
            problem(sc, f"Certificate: unknown spec fields {set(spec) - allowed}")
        if not spec.get("issuerRef", {}).get("name"):
            problem(sc, "Certificate: issuerRef.name empty")
    elif d["apiVersion"] == "cert-manager.io/v1" and kind == "Issuer":
        if len(spec) != 1 or not ({"selfSigned", "ca"} & set(spec)):
            problem(sc, f"Issuer {d['metadata']['name']}: expected exactly one of selfSigned/ca")
    elif d["apiVersion"] == "monitoring.coreos.com/v1" and kind == "ServiceMonitor":
        if not spec.get("selector", {}).get("matchLabels"):
            problem(sc, "ServiceMonitor: empty selector")
        for ep in spec.get("endpoints", []):
            allowed = {"port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels", "relabelings", "metricRelabelings"}
            if set(ep) - allowed:
                problem(sc, f"ServiceMonitor endpoint: unknown fields {set(ep) - allowed}")
            if not isinstance(ep.get("honorLabels"), bool):
                problem(sc, "ServiceMonitor endpoint: honorLabels must render as a boolean")
    elif d["apiVersion"] == "monitoring.coreos.com/v1" and kind == "PrometheusRule":
        if not spec.get("groups"):
            problem(sc, "PrometheusRule: no groups")
        for g in spec.get("groups") or []:
            for r in g.get("rules") or []:
                if set(r) - {"alert", "expr", "for", "labels", "annotations"}:
                    problem(sc, f"PrometheusRule {r.get('alert')}: unknown fields {set(r) - {'alert', 'expr', 'for', 'labels', 'annotations'}}")
                if not r.get("alert") or not r.get("expr"):
                    problem(sc, f"PrometheusRule: a rule without alert or expr: {r}")
                if (r.get("labels") or {}).get("severity") not in ("critical", "warning"):
                    problem(sc, f"PrometheusRule {r.get('alert')}: severity must be critical or warning")
                if not {"summary", "description"} <= set(r.get("annotations") or {}):
                    problem(sc, f"PrometheusRule {r.get('alert')}: summary and description annotations needed")
    else:
        problem(sc, f"no schema and no structural check for {d['apiVersion']} {kind}")


def validate_schema(sc, d):
    for ver in KUBE_VERSIONS:
        try:
            kv.validate(d, ver, strict=True)
        except kv.SchemaNotFoundError:
            check_crd_kind(sc, d)
            return
        except kv.ValidationError as e:
            path = "/".join(str(p) for p in e.path)
            problem(sc, f"{d['kind']} {d['metadata'].get('name')}: Kubernetes {ver} schema: {path}: {e.message}")


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


# The `prescale serve` flags the chart may render.
SERVE_FLAGS = {"--grpc-addr", "--http-addr", "--tls-cert", "--tls-key", "--tls-client-ca", "--idle-drop-seconds",
               "--log-format", "--external-metrics-addr", "--external-metrics-config", "--external-metrics-cert",
               "--external-metrics-key", "--requestheader-allowed-names", "--requestheader-client-ca-file",
               "--client-ca-file", "--history-prometheus", "--history-lookback"}


def check_serve_flags():
    """When the binary is built, every flag the chart may render is one its `serve --help`
    lists (chart and binary agree). Once, not per scenario: it does not depend on the values."""
    if not os.access(PRESCALE_BIN, os.X_OK):
        return
    helptext = subprocess.run([PRESCALE_BIN, "serve", "--help"], text=True, capture_output=True).stdout
    for flag in sorted(SERVE_FLAGS):
        if flag not in ("--log-format",) and flag not in helptext:
            problem("serve flags", f"{flag}: not a flag of {PRESCALE_BIN} serve")


def check_scenario(sc, values, docs, notes):
    merged = values
    seen = set()
    by_kind = {}
    for path, d in docs:
        for f in ("apiVersion", "kind", "metadata"):
            if f not in d:
                problem(sc, f"{path}: {f} missing")
        if "metadata" not in d:
            continue
        md = d["metadata"]
        key = (d["apiVersion"], d["kind"], md.get("namespace"), md.get("name"))
        if key in seen:
            problem(sc, f"duplicate object {key}")
        seen.add(key)
        name = md.get("name", "")
        if not DNS1123.match(name.replace(":", "-")) or len(name) > 253:
            problem(sc, f"{d['kind']}: bad name {name!r}")
        for lk, lv in (md.get("labels") or {}).items():
            if not isinstance(lv, str):
                problem(sc, f"{d['kind']} {name}: label {lk} is not a string")
        validate_schema(sc, d)
        by_kind.setdefault(d["kind"], []).append(d)

    deps = by_kind.get("Deployment", [])
    if len(deps) != 1:
        problem(sc, f"expected 1 Deployment, got {len(deps)}")
        return
    dep = deps[0]
    pod = dep["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    pspec = pod["spec"]
    c = pspec["containers"][0]
    if not labels_match(dep["spec"]["selector"]["matchLabels"], pod_labels):
        problem(sc, "Deployment selector does not match its pod labels")
    if dep["spec"]["replicas"] != merged["replicaCount"]:
        problem(sc, "replicas != replicaCount")
    # Security posture.
    psc, csc = pspec.get("securityContext", {}), c.get("securityContext", {})
    if psc.get("runAsNonRoot") is not True or csc.get("runAsNonRoot") is not True:
        problem(sc, "prescale must run as non-root")
    if csc.get("readOnlyRootFilesystem") is not True:
        problem(sc, "readOnlyRootFilesystem must be true")
    if csc.get("allowPrivilegeEscalation") is not False:
        problem(sc, "allowPrivilegeEscalation must be false")
    if csc.get("capabilities", {}).get("drop") != ["ALL"] or csc.get("capabilities", {}).get("add"):
        problem(sc, "capabilities must drop ALL and add none")
    if (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        problem(sc, "seccompProfile must be RuntimeDefault")
    # A NetworkPolicy selects prescale's pods and admits only through ports the container has.
    port_names = {p["name"] for p in c.get("ports", [])}
    for np in by_kind.get("NetworkPolicy", []):
        if not labels_match(np["spec"]["podSelector"]["matchLabels"], pod_labels):
            problem(sc, "NetworkPolicy does not select prescale's pods")
        for rule in np["spec"].get("ingress", []):
            for p in rule.get("ports", []):
                if isinstance(p.get("port"), str) and p["port"] not in port_names:
                    problem(sc, f"NetworkPolicy admits port {p['port']}, which the container does not name")
        admitted = {p["port"] for r in np["spec"].get("ingress", []) for p in r.get("ports", [])}
        for needed in ("grpc", "http") + (("https-metrics",) if merged["externalMetrics"]["enabled"] else ()):
            if needed not in admitted:
                problem(sc, f"NetworkPolicy shuts out port {needed}, which prescale serves")
    # Probes.
    if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz":
        problem(sc, "readinessProbe must GET /readyz")
    if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
        problem(sc, "livenessProbe must GET /healthz")
    if not c.get("resources", {}).get("requests"):
        problem(sc, "container has no resource requests")
    if not pspec.get("topologySpreadConstraints") and not pspec.get("affinity"):
        problem(sc, "no topology spread / anti-affinity")
    # Arguments: only flags `prescale serve` has (plus the external metrics ones when enabled).
    args = c.get("args", [])
    if args[:1] != ["serve"]:
        problem(sc, f"args must start with serve: {args}")
    for a in args[1:]:
        flag = a.split("=", 1)[0]
        if flag.startswith("--") and flag not in SERVE_FLAGS and a not in merged.get("extraArgs", []):
            problem(sc, f"unknown serve flag {a}")
    tls_on = merged["tls"]["enabled"]
    if tls_on != any(a.startswith("--tls-cert=") for a in args):
        problem(sc, "--tls-cert present iff tls.enabled")
    if bool(merged["tls"]["clientAuth"]) != any(a.startswith("--tls-client-ca=") for a in args):
        problem(sc, "--tls-client-ca present iff tls.clientAuth")
    hist = merged["history"]["prometheus"]
    if bool(hist) != any(a == f"--history-prometheus={hist}" for a in args):
        problem(sc, "--history-prometheus present iff history.prometheus, with its value")
    if hist and f"--history-lookback={merged['history']['lookback']}" not in args:
        problem(sc, "--history-lookback missing")
    em_on = merged["externalMetrics"]["enabled"]
    if em_on != any(a.startswith("--external-metrics-addr=") for a in args):
        problem(sc, "--external-metrics-addr present iff externalMetrics.enabled")
    # Every file a flag names is mounted.
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pspec.get("volumes", [])}
    for m in mounts:
        if m not in volumes:
            problem(sc, f"volumeMount {m} has no volume")
    for a in args:
        if "=" in a and a.split("=", 1)[1].startswith("/etc/prescale/"):
            f = a.split("=", 1)[1]
            if not any(f.startswith(p.rstrip("/") + "/") for p in mounts.values()):
                problem(sc, f"{a}: file not under any mount")
    # Ports named by Services exist in the container.
    cports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    for s in services.values():
        if not labels_match(s["spec"]["selector"], pod_labels):
            problem(sc, f"Service {s['metadata']['name']} selector does not match the pods")
        for p in s["spec"]["ports"]:
            if isinstance(p["targetPort"], str) and p["targetPort"] not in cports:
                problem(sc, f"Service {s['metadata']['name']} targetPort {p['targetPort']} not a container port")
    main = services.get(dep["metadata"]["name"])
    if not main:
        problem(sc, "main Service missing")
    else:
        if {p["name"] for p in main["spec"]["ports"]} != {"grpc", "http"}:
            problem(sc, "main Service must expose grpc and http")
        if merged["service"]["headless"] != (main["spec"].get("clusterIP") == "None"):
            problem(sc, "service.headless not honoured")
    # Secrets referenced.
    secrets = {v["secret"]["secretName"] for v in volumes.values() if "secret" in v}
    certs = by_kind.get("Certificate", [])
    em_secret = merged["externalMetrics"]["tlsSecretName"]
    cm_serves = merged["tls"]["certManager"]["enabled"] and (tls_on or (em_on and not em_secret))
    if em_on:
        want = em_secret or (f"{dep['metadata']['name']}-tls" if merged["tls"]["certManager"]["enabled"] else merged["tls"]["secretName"])
        if not want or want not in secrets:
            problem(sc, "external metrics serving Secret is not mounted")
        if not any(a.startswith("--external-metrics-cert=") for a in args) or not any(a.startswith("--external-metrics-key=") for a in args):
            problem(sc, "--external-metrics-cert/--external-metrics-key missing")
    if cm_serves:
        if True:
            serving = [x for x in certs if not x["spec"].get("isCA")]
            if len(serving) != 1 or serving[0]["spec"]["secretName"] not in secrets:
                problem(sc, "cert-manager serving Certificate's Secret is not mounted")
            else:
                dns = serving[0]["spec"]["dnsNames"]
                host = f"{dep['metadata']['name']}.{NAMESPACE}.svc"
                if host not in dns:
                    problem(sc, f"certificate SANs lack the scalerAddress host {host}")
                if em_on and f"{dep['metadata']['name']}-external-metrics.{NAMESPACE}.svc" not in dns:
                    problem(sc, "certificate SANs lack the external metrics Service")
            issuers = {i["metadata"]["name"] for i in by_kind.get("Issuer", [])}
            for x in certs:
                ref = x["spec"]["issuerRef"]
                if ref.get("kind", "Issuer") == "Issuer" and ref["name"] not in issuers and not merged["tls"]["certManager"]["issuerRef"]["name"]:
                    problem(sc, f"Certificate {x['metadata']['name']} references missing Issuer {ref['name']}")
    if tls_on and not merged["tls"]["certManager"]["enabled"] and merged["tls"]["secretName"] not in secrets:
        problem(sc, "tls.secretName not mounted")
    if certs and not cm_serves:
        problem(sc, "Certificate rendered without tls.enabled")
    # PDB.
    pdbs = by_kind.get("PodDisruptionBudget", [])
    if merged["replicaCount"] > 1 and merged["podDisruptionBudget"]["enabled"]:
        if len(pdbs) != 1 or pdbs[0]["spec"].get("minAvailable") != 1 or not labels_match(pdbs[0]["spec"]["selector"]["matchLabels"], pod_labels):
            problem(sc, "PDB with minAvailable 1 selecting the pods expected")
    elif pdbs:
        problem(sc, "PDB rendered with a single replica (it would block node drains)")
    # PriorityClass.
    for pc in by_kind.get("PriorityClass", []):
        if not (pc["value"] < 0 and pc.get("preemptionPolicy") == "Never" and pc.get("globalDefault") is False):
            problem(sc, "headroom PriorityClass must be negative, preemptionPolicy Never, globalDefault false")
    if merged["headroom"]["enabled"]:
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        pcs = [pc["metadata"]["name"] for pc in by_kind.get("PriorityClass", [])]
        if env.get("PRESCALE_HEADROOM_PRIORITY_CLASS") not in pcs:
            problem(sc, "PRESCALE_HEADROOM_PRIORITY_CLASS does not name the rendered PriorityClass")
    # APIService.
    apis = by_kind.get("APIService", [])
    if em_on and merged["externalMetrics"]["apiService"]["create"]:
        if len(apis) != 1:
            problem(sc, "APIService expected")
        else:
            a = apis[0]
            if a["metadata"]["name"] != "v1beta1.external.metrics.k8s.io":
                problem(sc, "APIService must be v1beta1.external.metrics.k8s.io")
            svc = services.get(a["spec"]["service"]["name"])
            if not svc or svc["spec"].get("clusterIP") == "None":
                problem(sc, "APIService must point at a rendered non-headless Service")
            elif a["spec"]["service"].get("port", 443) not in [p["port"] for p in svc["spec"]["ports"]]:
                problem(sc, "APIService port not on its Service")
            if not (a["spec"].get("caBundle") or a["spec"].get("insecureSkipTLSVerify")
                    or "cert-manager.io/inject-ca-from" in (a["metadata"].get("annotations") or {})):
                problem(sc, "APIService has no way to trust the serving certificate")
        if "ONLY ONE external metrics server" not in notes.replace("Only ONE", "ONLY ONE"):
            problem(sc, "NOTES.txt must warn that only one external metrics server may exist")
        cms = [m for m in by_kind.get("ConfigMap", []) if "metrics.yaml" in m.get("data", {})]
        if len(cms) != 1:
            problem(sc, "metrics.yaml ConfigMap expected")
        else:
            check_metrics_config(sc, yaml.safe_load(cms[0]["data"]["metrics.yaml"]))
    elif apis:
        problem(sc, "APIService rendered while external metrics are off")
    # ServiceMonitor selects the main Service's http port.
    for sm in by_kind.get("ServiceMonitor", []):
        sel = sm["spec"]["selector"]["matchLabels"]
        hits = [s for s in services.values() if labels_match(sel, s["metadata"].get("labels") or {})]
        if len(hits) != 1 or "http" not in [p["name"] for p in hits[0]["spec"]["ports"]]:
            problem(sc, "ServiceMonitor must select exactly the main Service (port http)")
    check_rbac(sc, merged, by_kind)


def check_rbac(sc, merged, by_kind):
    rbac_kinds = ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")
    if not merged["rbac"]["create"]:
        if any(by_kind.get(k) for k in rbac_kinds):
            problem(sc, "RBAC rendered with rbac.create=false")
        return
    for kind, allowed in (("ClusterRole", ALLOWED_CLUSTER), ("Role", ALLOWED_NAMESPACED)):
        for role in by_kind.get(kind, []):
            for rule in role.get("rules", []):
                if rule.get("resourceNames") is None and rule.get("nonResourceURLs"):
                    problem(sc, f"{kind} grants nonResourceURLs")
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        ok = allowed.get((g, r), set())
                        if kind == "ClusterRole" and (g, r) in ALLOWED_NAMED:
                            ok = ALLOWED_NAMED[(g, r)] if rule.get("resourceNames") else set()
                        extra = set(rule["verbs"]) - ok
                        if extra or "*" in rule["verbs"]:
                            problem(sc, f"{kind} {role['metadata']['name']} grants {sorted(extra)} on {g or 'core'}/{r}: not in the allow-list")
                        if (g, r) == ("external.metrics.k8s.io", "*") and not role["metadata"]["name"].endswith("-external-metrics-reader"):
                            problem(sc, "external metrics read granted outside the HPA reader role")
    sa = None
    for sa_obj in by_kind.get("ServiceAccount", []):
        sa = sa_obj["metadata"]["name"]
    roles = {(r["kind"], r["metadata"]["name"]) for k in ("ClusterRole", "Role") for r in by_kind.get(k, [])}
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for b in by_kind.get(kind, []):
            ref = (b["roleRef"]["kind"], b["roleRef"]["name"])
            if ref not in roles and ref[1] not in ALLOWED_BUILTIN_ROLES:
                problem(sc, f"{kind} {b['metadata']['name']} binds unknown role {ref}")
            if b["metadata"].get("namespace") == "kube-system" and ref != ("Role", "extension-apiserver-authentication-reader"):
                problem(sc, "only the extension-apiserver-authentication-reader binding may live in kube-system")
            for s in b["subjects"]:
                if s["name"] == "horizontal-pod-autoscaler":
                    if not ref[1].endswith("-external-metrics-reader"):
                        problem(sc, "HPA bound to something other than the reader role")
                elif merged["serviceAccount"]["create"] and s["name"] != sa:
                    problem(sc, f"{kind} {b['metadata']['name']} binds {s['name']}, not prescale's ServiceAccount")
    em = merged["externalMetrics"]["enabled"]
    delegated = any(b["roleRef"]["name"] == "system:auth-delegator" for b in by_kind.get("ClusterRoleBinding", []))
    reader = any(b["roleRef"]["name"] == "extension-apiserver-authentication-reader" for b in by_kind.get("RoleBinding", []))
    if em != delegated or em != reader:
        problem(sc, "auth-delegator / authentication-reader bindings must exist exactly when externalMetrics.enabled")
    cluster_rules = {(g, r) for role in by_kind.get("ClusterRole", []) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    if (("karpenter.sh", "nodepools/scale") in cluster_rules) != bool(merged["rbac"]["karpenter"]["resizeNodePools"]):
        problem(sc, "nodepools/scale granted iff rbac.karpenter.resizeNodePools")
    if (("karpenter.sh", "nodepools") in cluster_rules) != bool(merged["rbac"]["karpenter"]["enabled"]):
        problem(sc, "Karpenter rules iff rbac.karpenter.enabled")
    pod_ns = sorted(r["metadata"]["namespace"] for r in by_kind.get("Role", [])
                    if any("pods" in rule["resources"] for rule in r["rules"]))
    want_ns = sorted(set(merged["headroom"]["namespaces"] or [NAMESPACE])) if merged["headroom"]["enabled"] else []
    if pod_ns != want_ns:
        problem(sc, f"pod-writing Roles in {pod_ns}, expected {want_ns}")


def check_metrics_config(sc, cfg):
    if not isinstance(cfg, dict) or set(cfg) != {"metrics"} or not isinstance(cfg["metrics"], list):
        problem(sc, "metrics config must be {metrics: [...]}")
        return
    names = set()
    for m in cfg["metrics"]:
        if not {"name", "metadata"} <= set(m) <= {"name", "metadata", "labels"}:
            problem(sc, f"metric entry must have name, metadata and optionally labels: {m}")
            continue
        if not re.match(r"^[-_.a-z0-9]+$", str(m["name"])):
            problem(sc, f"metric name {m['name']!r} must be lowercase")
        if m["name"] in names:
            problem(sc, f"duplicate metric {m['name']}")
        names.add(m["name"])
        if not isinstance(m["metadata"], dict) or not all(isinstance(v, str) for v in m["metadata"].values()):
            problem(sc, f"metric {m['name']}: metadata must be a map of strings")
            continue
        prescale_check(sc, m["name"], m["metadata"])


def prescale_check(sc, name, metadata):
    """Parse a metric's metadata with `prescale check` (the parser `serve` uses), when built."""
    global checked_metadata
    if not os.access(PRESCALE_BIN, os.X_OK):
        return
    out = subprocess.run([PRESCALE_BIN, "check", "-"], input=yaml.safe_dump(metadata), text=True,
                         capture_output=True, timeout=60)
    if out.returncode != 0:
        problem(sc, f"metric {name}: prescale check rejects its metadata:\n{out.stdout}{out.stderr}")
    checked_metadata += 1


def check_values_documented(defaults):
    """Every value in values.yaml (or an enclosing object) has a row in the chart README's Values table."""
    with open(os.path.join(CHART, "README.md")) as f:
        table = f.read().split("## Values", 1)[-1]
    documented = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", table, re.M))

    def walk(d, prefix=""):
        for k, v in d.items():
            path = f"{prefix}.{k}" if prefix else k
            if isinstance(v, dict) and v:
                yield from walk(v, path)
            else:
                yield path

    for path in walk(defaults):
        parts = path.split(".")
        if not any(".".join(parts[:i]) in documented for i in range(1, len(parts) + 1)):
            problem("README", f"value {path} is not documented in {CHART}/README.md")
    known = set(walk(defaults)) | {".".join(p.split(".")[:i]) for p in walk(defaults) for i in range(1, len(p.split(".")))}
    for row in documented - known:
        problem("README", f"README documents {row}, which values.yaml does not have")


# ---------------------------------------------------------------------------- alerts
ALERT_TESTS = "tests/alerts/prescale.test.yaml"


def promtool(scope, args, files):
    """Write `files` ({name: YAML document}) to a temporary directory and run
    `promtool ARGS`, where each file name in ARGS stands for its path; a failure is a problem
    of `scope`. A document may name another file by its name: `rule_files` is rewritten."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = {name: os.path.join(tmp, name) for name in files}
        for name, doc in files.items():
            if "rule_files" in doc:
                doc = dict(doc, rule_files=[path[f] for f in doc["rule_files"]])
            with open(path[name], "w") as f:
                yaml.safe_dump(doc, f, sort_keys=False)
        out = subprocess.run(["promtool", *(path.get(a, a) for a in args)], text=True, capture_output=True)
    if out.returncode != 0:
        problem(scope, f"promtool {' '.join(args[:2])}:\n{out.stdout}{out.stderr}")


def check_alerts(chart):
    """The PrometheusRule's rules pass `promtool check rules` and the unit tests in
    ALERT_TESTS (`promtool test rules`). (That they name only metrics prescale exports is a
    unit test of `scaler/src/metrics.rs`.)"""
    docs, _ = render(chart, {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}})
    rules = [d for _, d in docs if d["kind"] == "PrometheusRule"]
    if len(rules) != 1:
        problem("alerts", f"expected one PrometheusRule, rendered {len(rules)}")
        return
    groups = rules[0]["spec"]["groups"]
    own, _ = render(chart, {"prometheusRule": {"enabled": True, "job": "kubernetes-pods"}})
    for d in (d for _, d in own if d["kind"] == "PrometheusRule"):
        for r in (r for g in d["spec"]["groups"] for r in g["rules"]):
            if 'job="kubernetes-pods"' not in r["expr"]:
                problem("alerts", f"{r['alert']} does not select prometheusRule.job: {r['expr']}")
    described = {r["alert"]: r["annotations"]["description"] for g in groups for r in g["rules"]}
    with open(ALERT_TESTS) as f:
        tests = yaml.safe_load(f)
    for t in tests["tests"]:
        for case in t["alert_rule_test"]:
            if case["alertname"] not in described:
                problem("alerts", f"{ALERT_TESTS} tests {case['alertname']}, which the chart does not define")
                continue
            for a in case.get("exp_alerts") or []:
                a.setdefault("exp_annotations", {})["description"] = described[case["alertname"]]
    tested = {c["alertname"] for t in tests["tests"] for c in t["alert_rule_test"] if c.get("exp_alerts")}
    for name in sorted(set(described) - tested):
        problem("alerts", f"{name} has no test in {ALERT_TESTS} that makes it fire")
    tests["rule_files"] = ["rules.yaml"]
    files = {"rules.yaml": {"groups": groups}, "tests.yaml": tests}
    promtool("alerts", ["check", "rules", "rules.yaml"], files)
    promtool("alerts", ["test", "rules", "tests.yaml"], files)
    print(f"check-chart: alerts: {len(described)} rules, promtool check and test rules "
          f"({sum(len(t['alert_rule_test']) for t in tests['tests'])} cases)")


def check_dashboard(chart):
    """The Grafana dashboard ships unchanged in its ConfigMap, its layout and variables hold
    together, and every query parses as PromQL (`promtool check rules`, with Grafana's
    variables replaced by values)."""
    path = os.path.join(CHART, "dashboards", "prescale.json")
    with open(path) as f:
        dash = json.load(f)
    docs, _ = render(chart, {"grafanaDashboard": {"enabled": True}})
    cms = [d for _, d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    if len(cms) != 1 or json.loads(cms[0]["data"]["prescale.json"]) != dash:
        problem("dashboard", "the rendered ConfigMap does not carry dashboards/prescale.json unchanged")
    if cms and cms[0]["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
        problem("dashboard", "the ConfigMap lacks the sidecar's grafana_dashboard label")
    variables = {v["name"] for v in dash["templating"]["list"]}
    builtins = {"__rate_interval", "__interval", "__range"}
    exprs, ids = [], set()
    for p in dash["panels"]:
        if p["id"] in ids:
            problem("dashboard", f"panel id {p['id']} twice")
        ids.add(p["id"])
        g = p["gridPos"]
        if g["x"] + g["w"] > 24:
            problem("dashboard", f"panel {p['title']} is wider than the grid")
        if p["type"] == "row":
            continue
        if not p.get("targets"):
            problem("dashboard", f"panel {p['title']} has no query")
        for t in p.get("targets", []):
            exprs.append((p["title"], t["expr"]))
    for v in dash["templating"]["list"]:
        q = v.get("query")
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), *(\w+)\)", q["query"])
            if not m:
                problem("dashboard", f"variable {v['name']}: not a label_values query: {q}")
            else:
                exprs.append((f"variable {v['name']}", m.group(1)))
    for title, e in exprs:
        for used in re.findall(r"\$\{?(\w+)", e):
            if used not in variables | builtins:
                problem("dashboard", f"{title}: ${used} is not a variable of the dashboard")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": re.sub(r"\$\{?(\w+)\}?", lambda m: "5m" if m.group(1).startswith("__") else ".*", e)}
        for i, (_, e) in enumerate(exprs)]}]}
    promtool("dashboard", ["check", "rules", "queries.yaml"], {"queries.yaml": rules})
    print(f"check-chart: dashboard: {len(dash['panels'])} panels, {len(exprs)} queries parsed by promtool")


# ---------------------------------------------------------------------------- run
def main():
    check_serve_flags()
    lint_values = {"default": {}, "all-features": ALL_FEATURES}
    for sc, vals in lint_values.items():
        report = helm.lint(CHART, vals, strict=True, namespace=NAMESPACE)
        for m in report.get("messages") or []:
            if m["severity"] >= 2:
                problem(f"lint {sc}", f"{m['path']}: {m['error']}")
        for e in report.get("errors") or []:
            problem(f"lint {sc}", e)

    with helm.Chart.load(CHART) as chart:
        defaults = chart.values
        check_values_documented(defaults)
        if shutil.which("promtool"):
            check_alerts(chart)
            check_dashboard(chart)
        else:
            problem("alerts", "promtool not found (scripts/services.sh installs Debian's prometheus, which has it)")
        for sc, over in SCENARIOS.items():
            merged = deep_merge(defaults, over)
            try:
                docs, notes = render(chart, over)
            except helm.HelmError as e:
                problem(sc, f"render failed: {e}")
                continue
            try:
                check_scenario(sc, merged, docs, notes)
            except (KeyError, TypeError, IndexError, AttributeError) as e:
                problem(sc, f"rendered objects lack an expected field: {type(e).__name__}: {e}")
            print(f"check-chart: {sc}: {len(docs)} objects: " + ", ".join(sorted({d['kind'] for _, d in docs})))
        for sc, (over, needle) in MUST_FAIL.items():
            try:
                render(chart, over)
                problem(sc, "render succeeded but must fail")
            except helm.HelmError as e:
                if needle not in str(e):
                    problem(sc, f"failed for the wrong reason: {e}")

    # Examples: the HPA against the Kubernetes schema; metrics.yaml against externalMetrics' shape.
    for fn in sorted(os.listdir("examples")):
        if not fn.endswith(".yaml"):
            continue
        path = os.path.join("examples", fn)
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        for d in docs:
            if d.get("kind") == "HorizontalPodAutoscaler":
                validate_schema(path, d)
                for m in d["spec"].get("metrics", []):
                    if m["type"] == "External":
                        n = m["external"]["metric"]["name"]
                        if n != n.lower():
                            problem(path, f"external metric name {n} must be lowercase")
            elif fn == "metrics.yaml":
                check_metrics_config(path, d)
        print(f"check-chart: {path}: {len(docs)} document(s) parsed")

    if checked_metadata:
        print(f"check-chart: {checked_metadata} metric metadata map(s) parsed by {PRESCALE_BIN} check")
    else:
        print(f"check-chart: {PRESCALE_BIN} not built: metric metadata not parsed (run after cargo build)")
    if problems:
        print(f"check-chart: {len(problems)} problem(s):", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        sys.exit(1)
    print(f"check-chart: OK ({len(SCENARIOS)} scenarios, {len(MUST_FAIL)} rejections, Kubernetes {', '.join(KUBE_VERSIONS)})")


main()
PY
