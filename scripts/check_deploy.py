#!/usr/bin/env python3
"""What the real tools cannot see in Herald's deployment files (called by scripts/check-deploy.sh, run with the
project's .venv Python, which has PyYAML and jsonschema through kubernetes-validate).

  check_deploy.py kube RENDERED.yaml        a rendered kustomize overlay: probes, grace period, PDBs, config
                                            and secret mounts, KEDA ceilings against the topics Job, the two
                                            custom resources (ScaledObject, ServiceMonitor) against schemas, and
                                            tracing where an overlay turns it on (ratio, resource attributes)
  check_deploy.py compose CONFIG.yaml       `docker-compose config` output: healthchecks, grace, topics, Grafana
  check_deploy.py dashboard FILE.json       Grafana dashboard structure (schema version of Grafana 10+)
  check_deploy.py dockerfile Dockerfile scripts/setup.sh

Each prints one line per problem and exits 1 if there was any.
"""
import json
import re
import subprocess
import sys
from urllib.parse import unquote

import jsonschema
import yaml

STAGES = ["ingest", "resolve", "suppress", "render", "send", "registry"]
# The topics each stage consumes, by pipeline key (Sources/Stages/herald-*/main.swift).
STAGE_INPUTS = {
    "ingest": ["chat_events"], "resolve": ["ingested"], "suppress": ["resolved"], "render": ["deliverable"],
    "send": ["outbound", "retry"], "registry": ["registry", "token_feedback"],
}
problems = []


def problem(message):
    problems.append(message)


# The parts of the two custom resources Herald uses, with their types as KEDA 2.x and the Prometheus Operator
# define them (keda.sh/v1alpha1 ScaledObject, monitoring.coreos.com/v1 ServiceMonitor). Unknown keys are errors,
# so a typo cannot pass as an ignored field.
SCALED_OBJECT = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"}, "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object", "required": ["scaleTargetRef", "triggers"], "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                                   "properties": {"name": {"type": "string"}, "kind": {"type": "string"},
                                                  "apiVersion": {"type": "string"}, "envSourceContainerName": {"type": "string"}}},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "idleReplicaCount": {"type": "integer", "minimum": 0},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "advanced": {"type": "object", "additionalProperties": False, "properties": {
                    "restoreToOriginalReplicaCount": {"type": "boolean"},
                    "horizontalPodAutoscalerConfig": {"type": "object", "additionalProperties": False, "properties": {
                        "name": {"type": "string"},
                        "behavior": {"type": "object", "additionalProperties": False, "properties": {
                            "scaleUp": {"$ref": "#/$defs/rules"}, "scaleDown": {"$ref": "#/$defs/rules"}}}}}}},
                "triggers": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["type", "metadata"], "additionalProperties": False,
                    "properties": {
                        "type": {"type": "string"}, "name": {"type": "string"}, "useCachedMetrics": {"type": "boolean"},
                        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                        "authenticationRef": {"type": "object", "required": ["name"]},
                        # KEDA trigger metadata is a map of strings.
                        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                    }}},
            },
        },
    },
    "$defs": {"rules": {"type": "object", "additionalProperties": False, "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {"type": "array", "items": {
            "type": "object", "required": ["type", "value", "periodSeconds"], "additionalProperties": False,
            "properties": {"type": {"enum": ["Pods", "Percent"]}, "value": {"type": "integer", "minimum": 1},
                           "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800}}}}}}},
}
KAFKA_TRIGGER_KEYS = {"bootstrapServers", "consumerGroup", "topic", "lagThreshold", "activationLagThreshold",
                      "offsetResetPolicy", "allowIdleConsumers", "scaleToZeroOnInvalidOffset", "excludePersistentLag",
                      "limitToPartitionsWithLag", "partitionLimitation", "version", "sasl", "tls", "unsafeSsl"}
SERVICE_MONITOR = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {"type": "object", "required": ["selector", "endpoints"], "additionalProperties": False, "properties": {
            "jobLabel": {"type": "string"},
            "namespaceSelector": {"type": "object"},
            "selector": {"type": "object", "additionalProperties": False, "properties": {
                "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                "matchExpressions": {"type": "array", "items": {
                    "type": "object", "required": ["key", "operator"], "additionalProperties": False,
                    "properties": {"key": {"type": "string"}, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                                   "values": {"type": "array", "items": {"type": "string"}}}}}}},
            "endpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False, "properties": {
                    "port": {"type": "string"}, "targetPort": {}, "path": {"type": "string"},
                    "scheme": {"enum": ["http", "https"]},
                    "interval": {"type": "string", "pattern": "^([0-9]+(ms|s|m|h))+$"},
                    "scrapeTimeout": {"type": "string", "pattern": "^([0-9]+(ms|s|m|h))+$"},
                    "honorLabels": {"type": "boolean"}, "relabelings": {"type": "array"},
                    "metricRelabelings": {"type": "array"}}}}}},
    },
}


def alert_in_flight_bound():
    """The number HeraldSendInFlightAtBound compares herald-send's in-flight gauge with."""
    import os
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy", "prometheus", "alerts.yml")
    for group in yaml.safe_load(open(path))["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "HeraldSendInFlightAtBound":
                m = re.search(r">=\s*([0-9]+)", rule["expr"])
                return m.group(1) if m else None
    return None


def quantity(value, kind):
    """Kubernetes CPU (cores) or memory (bytes) quantity as a number."""
    s = str(value)
    if kind == "cpu":
        return float(s[:-1]) / 1000 if s.endswith("m") else float(s)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}
    for u, f in units.items():
        if s.endswith(u):
            return float(s[: -len(u)]) * f
    return float(s)


def selector_matches(selector, labels):
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def check_kube(path):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    config_maps = by_kind.get("ConfigMap", {})

    def cm_by_prefix(prefix):
        found = [cm for name, cm in config_maps.items() if name == prefix or re.fullmatch(re.escape(prefix) + r"-[a-z0-9]{10}", name)]
        if len(found) != 1:
            problem(f"expected one ConfigMap {prefix}, found {len(found)}")
            return {}
        return found[0]

    env = cm_by_prefix("herald-env").get("data", {})
    pipeline_cm = cm_by_prefix("herald-pipeline")
    pipeline = yaml.safe_load(pipeline_cm.get("data", {}).get("pipeline.yaml", "")) or {}
    topics = pipeline.get("kafka", {}).get("topics", {})
    if env.get("HERALD_SEND_MAX_IN_FLIGHT") != alert_in_flight_bound():
        problem(f"herald-env HERALD_SEND_MAX_IN_FLIGHT {env.get('HERALD_SEND_MAX_IN_FLIGHT')} differs from the bound in "
                f"HeraldSendInFlightAtBound ({alert_in_flight_bound()})")
    deadline_ms = int(env.get("HERALD_SHUTDOWN_DEADLINE_MS", "0"))
    if deadline_ms <= 0:
        problem("herald-env has no HERALD_SHUTDOWN_DEADLINE_MS")

    # The topics Job: heraldctl topics NAME:PARTITIONS ...
    partitions = {}
    job = by_kind.get("Job", {}).get("herald-topics")
    if not job:
        problem("no Job herald-topics")
    else:
        c = job["spec"]["template"]["spec"]["containers"][0]
        if c.get("command") != ["heraldctl", "topics"]:
            problem(f"Job herald-topics runs {c.get('command')}, not heraldctl topics")
        for a in c.get("args", []):
            if not a.startswith("-"):
                name, _, count = a.partition(":")
                partitions[name] = int(count)
        for key, name in topics.items():
            if name not in partitions:
                problem(f"Job herald-topics does not create {name} (kafka.topics.{key})")

    for name, so in by_kind.get("ScaledObject", {}).items():
        for e in jsonschema.Draft202012Validator(SCALED_OBJECT).iter_errors(so):
            problem(f"ScaledObject {name}: {'.'.join(map(str, e.path))}: {e.message}")
    for name, sm in by_kind.get("ServiceMonitor", {}).items():
        for e in jsonschema.Draft202012Validator(SERVICE_MONITOR).iter_errors(sm):
            problem(f"ServiceMonitor {name}: {'.'.join(map(str, e.path))}: {e.message}")

    for stage in STAGES:
        name = f"herald-{stage}"
        dep = by_kind.get("Deployment", {}).get(name)
        if not dep:
            problem(f"no Deployment {name}")
            continue
        pod = dep["spec"]["template"]["spec"]
        pod_labels = dep["spec"]["template"]["metadata"].get("labels", {})
        c = pod["containers"][0]
        if c.get("command") != [name]:
            problem(f"{name}: runs {c.get('command')}")
        for probe, path in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")]:
            got = (c.get(probe) or {}).get("httpGet", {}).get("path")
            if got != path:
                problem(f"{name}: {probe} on {got}, expected {path}")
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace * 1000 <= deadline_ms:
            problem(f"{name}: terminationGracePeriodSeconds {grace} s is not above HERALD_SHUTDOWN_DEADLINE_MS {deadline_ms}")
        res = c.get("resources", {})
        for kind in ["cpu", "memory"]:
            req, lim = res.get("requests", {}).get(kind), res.get("limits", {}).get(kind)
            if req is None or lim is None:
                problem(f"{name}: no {kind} request and limit")
            elif quantity(req, kind) > quantity(lim, kind):
                problem(f"{name}: {kind} request {req} above limit {lim}")
        # Configuration and credentials: ConfigMap / Secret volumes, every mount read-only.
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
        for vname, v in volumes.items():
            if ("secret" in v or "configMap" in v) and not mounts.get(vname, {}).get("readOnly"):
                problem(f"{name}: volume {vname} is not mounted read-only")
        pv = volumes.get("pipeline", {}).get("configMap", {}).get("name")
        if pv != pipeline_cm.get("metadata", {}).get("name"):
            problem(f"{name}: the pipeline volume is ConfigMap {pv}, not the rendered herald-pipeline")
        mount = mounts.get("pipeline", {}).get("mountPath", "")
        if not env.get("HERALD_PIPELINE", "").startswith(mount + "/") or not mount:
            problem(f"{name}: HERALD_PIPELINE {env.get('HERALD_PIPELINE')} is not in the pipeline mount {mount}")
        secrets = {v["secret"]["secretName"] for v in volumes.values() if "secret" in v}
        if "herald-kafka" not in secrets:
            problem(f"{name}: no Kafka credentials volume (Secret herald-kafka)")
        if stage == "send" and not {"herald-apns", "herald-fcm"} <= secrets:
            problem(f"{name}: APNs keys and FCM service accounts must come from Secrets herald-apns and herald-fcm")
        redis = [e for e in c.get("env", []) if e["name"] == "HERALD_REDIS_URL"]
        if not redis or "secretKeyRef" not in redis[0].get("valueFrom", {}):
            problem(f"{name}: HERALD_REDIS_URL does not come from a Secret")
        check_tracing(name, c, env)
        annotations = dep["spec"]["template"]["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") != "true":
            problem(f"{name}: no prometheus.io/scrape annotation")
        # A PodDisruptionBudget over exactly these pods.
        if not any(selector_matches(p["spec"]["selector"], pod_labels) for p in by_kind.get("PodDisruptionBudget", {}).values()):
            problem(f"{name}: no PodDisruptionBudget selects its pods")
        # KEDA: lag of the stage's consumer group on its input topics, ceiling = partitions.
        so = by_kind.get("ScaledObject", {}).get(name)
        if not so:
            problem(f"{name}: no ScaledObject")
            continue
        spec = so["spec"]
        if spec["scaleTargetRef"]["name"] != name:
            problem(f"ScaledObject {name} scales {spec['scaleTargetRef']['name']}")
        group = pipeline.get("stages", {}).get(stage, {}).get("group_id", f"herald-{stage}")
        wanted = {topics.get(k) for k in STAGE_INPUTS[stage]}
        seen = set()
        for t in spec["triggers"]:
            md = t["metadata"]
            if t["type"] != "kafka":
                problem(f"ScaledObject {name}: trigger type {t['type']}, expected kafka")
                continue
            unknown = set(md) - KAFKA_TRIGGER_KEYS
            if unknown:
                problem(f"ScaledObject {name}: unknown kafka trigger keys {sorted(unknown)}")
            if md.get("consumerGroup") != group:
                problem(f"ScaledObject {name}: consumerGroup {md.get('consumerGroup')}, the stage's group is {group}")
            if md.get("bootstrapServers") != env.get("HERALD_KAFKA_BROKERS"):
                problem(f"ScaledObject {name}: bootstrapServers {md.get('bootstrapServers')} differ from HERALD_KAFKA_BROKERS")
            if not str(md.get("lagThreshold", "")).isdigit():
                problem(f"ScaledObject {name}: lagThreshold must be a whole number")
            seen.add(md.get("topic"))
        if seen != wanted:
            problem(f"ScaledObject {name}: triggers on {sorted(map(str, seen))}, the stage consumes {sorted(map(str, wanted))}")
        ceiling = max((partitions.get(t, 0) for t in wanted), default=0)
        if spec.get("maxReplicaCount") != ceiling:
            problem(f"ScaledObject {name}: maxReplicaCount {spec.get('maxReplicaCount')}, the partition count of its "
                    f"input topics is {ceiling}")
        if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 0):
            problem(f"ScaledObject {name}: minReplicaCount above maxReplicaCount")
        # Autoscaling that does not flap (docs/operations.md, "Scaling and upgrades"): both directions stated, a
        # scale-up that waits for lag to last, a scale-down after minutes of quiet, one pod at a time.
        behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior", {})
        up, down = behavior.get("scaleUp"), behavior.get("scaleDown")
        if not up or not down:
            problem(f"ScaledObject {name}: behavior must state both scaleUp and scaleDown")
        else:
            if up.get("stabilizationWindowSeconds", 0) < 15:
                problem(f"ScaledObject {name}: scaleUp.stabilizationWindowSeconds below 15 s scales on a passing spike")
            if down.get("stabilizationWindowSeconds", 0) < 120:
                problem(f"ScaledObject {name}: scaleDown.stabilizationWindowSeconds below 120 s flaps")
            if any(p["type"] != "Pods" or p["value"] > 1 for p in down.get("policies", [])) or not down.get("policies"):
                problem(f"ScaledObject {name}: scaleDown must remove one pod at a time")
        svc = by_kind.get("Service", {}).get(name)
        if not svc or not any(p.get("name") == "metrics" for p in svc["spec"]["ports"]):
            problem(f"{name}: no Service with a port named metrics (the ServiceMonitor scrapes that)")
    # Ingress to the pods: a NetworkPolicy that selects every Herald pod and lets in only the metrics port.
    policies = list(by_kind.get("NetworkPolicy", {}).values())
    if not any("Ingress" in p["spec"].get("policyTypes", []) for p in policies):
        problem("no NetworkPolicy restricts ingress to the pods")
    for p in policies:
        for rule in p["spec"].get("ingress", []):
            ports = {str(port.get("port")) for port in rule.get("ports", [])}
            if any("podSelector" in peer for peer in rule.get("from", [])):
                problem(f"NetworkPolicy {p['metadata']['name']}: a podSelector in 'from' gets kustomize's commonLabels")
            if not ports or not ports <= {"metrics", "9100"}:
                problem(f"NetworkPolicy {p['metadata']['name']}: ingress allowed on {sorted(ports) or 'every port'}, not only metrics")
    sms = list(by_kind.get("ServiceMonitor", {}).values())
    if not sms:
        problem("no ServiceMonitor")
    for sm in sms:
        values = {v for e in sm["spec"]["selector"].get("matchExpressions", []) for v in e.get("values", [])}
        if values and values != set(STAGES):
            problem(f"ServiceMonitor selects components {sorted(values)}, not the six stages")


# The OTEL_* variables that turn tracing on (TracingSettings): set, an endpoint exports spans.
TRACING_ON = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]


def check_tracing(name, container, env):
    """Tracing is opt-in (docs/operations.md, "Tracing" > "Deployment"). An overlay that turns it on (an endpoint in
    herald-env or the container) gives the stage a sampling ratio from 0 to 1 and OTEL_RESOURCE_ATTRIBUTES with the
    pod's name from the downward API, each `$(VAR)` it refers to set before it in the same list (the kubelet expands
    only those)."""
    own = {e["name"]: e for e in container.get("env", [])}
    endpoint = next((env.get(k) or own.get(k, {}).get("value") for k in TRACING_ON if k in env or k in own), None)
    if endpoint is None:
        return
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", endpoint):
        problem(f"{name}: the OTLP endpoint {endpoint!r} is not an http:// or https:// URL")
    ratio = env.get("OTEL_TRACES_SAMPLER_ARG", own.get("OTEL_TRACES_SAMPLER_ARG", {}).get("value"))
    try:
        if ratio is not None and not 0 <= float(ratio) <= 1:
            raise ValueError
    except ValueError:
        problem(f"{name}: OTEL_TRACES_SAMPLER_ARG {ratio!r} is not a number from 0 to 1")
    names = [e["name"] for e in container.get("env", [])]
    attributes = own.get("OTEL_RESOURCE_ATTRIBUTES", {}).get("value")
    if attributes is None:
        problem(f"{name}: tracing is on but OTEL_RESOURCE_ATTRIBUTES is not set in the container")
        return
    pairs = dict(p.split("=", 1) for p in attributes.split(",") if "=" in p)
    pod_var = re.fullmatch(r"\$\((\w+)\)", pairs.get("k8s.pod.name", ""))
    if not pod_var:
        problem(f"{name}: OTEL_RESOURCE_ATTRIBUTES has no k8s.pod.name=$(VAR)")
    elif own.get(pod_var.group(1), {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "metadata.name":
        problem(f"{name}: k8s.pod.name refers to {pod_var.group(1)}, which is not the pod's metadata.name")
    for var in re.findall(r"\$\((\w+)\)", attributes):
        if var not in names or names.index(var) > names.index("OTEL_RESOURCE_ATTRIBUTES"):
            problem(f"{name}: OTEL_RESOURCE_ATTRIBUTES refers to $({var}), which is not set before it in the container")


def check_compose(path):
    c = yaml.safe_load(open(path))
    services = c["services"]
    for s in STAGES + ["mock-apns", "kafka", "redis", "prometheus", "grafana"]:
        if s not in services:
            problem(f"compose: no service {s}")
        elif "healthcheck" not in services[s]:
            problem(f"compose: {s} has no healthcheck")
    for s in STAGES:
        svc = services.get(s, {})
        env = svc.get("environment", {})
        deadline = int(env.get("HERALD_SHUTDOWN_DEADLINE_MS", "25000"))
        grace = svc.get("stop_grace_period", "10s")
        seconds = float(re.sub(r"s$", "", grace)) if re.fullmatch(r"[0-9.]+s", grace) else 60 * float(grace.rstrip("m"))
        if seconds * 1000 <= deadline:
            problem(f"compose: {s} stop_grace_period {grace} is not above HERALD_SHUTDOWN_DEADLINE_MS {deadline}")
        # Tracing is opt-in: the OTEL_* variables come from the shell running compose, and only when set there
        # (a key without a value; check-deploy.sh renders the file with them unset, so each must be null here).
        for key in ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER_ARG", "OTEL_RESOURCE_ATTRIBUTES"]:
            if key not in env:
                problem(f"compose: {s} does not pass {key} on from the shell")
            elif env[key] is not None:
                problem(f"compose: {s} sets {key} to {env[key]!r}: tracing must stay off unless the shell sets it")
        deps = svc.get("depends_on", {})
        if deps.get("topics", {}).get("condition") != "service_completed_successfully":
            problem(f"compose: {s} does not wait for the topics step")
    send_env = services.get("send", {}).get("environment", {})
    for key in ["HERALD_SEND_MAX_IN_FLIGHT", "HERALD_APNS_CONNECTIONS", "HERALD_APNS_TIMEOUT_MS", "HERALD_SEND_MAX_ATTEMPTS",
                "HERALD_SEND_RETRY_INITIAL_MS", "HERALD_SEND_RETRY_MAX_MS"]:
        if key not in send_env:
            problem(f"compose: send does not set {key}")
    if str(send_env.get("HERALD_SEND_MAX_IN_FLIGHT")) != alert_in_flight_bound():
        problem(f"compose: send's HERALD_SEND_MAX_IN_FLIGHT {send_env.get('HERALD_SEND_MAX_IN_FLIGHT')} differs from the bound "
                f"in HeraldSendInFlightAtBound ({alert_in_flight_bound()})")
    cmd = services.get("topics", {}).get("command", [])
    if cmd[:2] != ["heraldctl", "topics"]:
        problem(f"compose: the topics step runs {cmd[:2]}")
    # The same topics and partition counts as the Kubernetes base's topics Job.
    import os
    job = yaml.safe_load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy", "kubernetes", "base",
                                           "topics-job.yaml")))
    base_topics = [a for a in job["spec"]["template"]["spec"]["containers"][0]["args"] if not a.startswith("-")]
    compose_topics, skip = [], False
    for a in cmd[2:]:
        if skip:
            skip = False
        elif a.startswith("-"):
            skip = "=" not in a            # `--brokers kafka:9092`: the next word is the option's value
        else:
            compose_topics.append(a)
    if sorted(base_topics) != sorted(compose_topics):
        problem(f"compose: the topics step creates {compose_topics}, the Kubernetes base {base_topics}")
    vols = " ".join(str(v) for v in services.get("grafana", {}).get("volumes", []))
    if "deploy/grafana/dashboards" not in vols or "deploy/grafana/provisioning" not in vols:
        problem("compose: grafana does not mount the dashboard and its provisioning")


def check_dashboard(path):
    d = json.load(open(path))
    if d.get("schemaVersion", 0) < 36:
        problem(f"dashboard: schemaVersion {d.get('schemaVersion')} predates Grafana 10 (36 and later)")
    for key in ["uid", "title", "panels", "templating", "time"]:
        if key not in d:
            problem(f"dashboard: no {key}")
    ids = [p["id"] for p in d.get("panels", [])]
    if len(ids) != len(set(ids)):
        problem("dashboard: panel ids are not unique")
    variables = {v["name"] for v in d.get("templating", {}).get("list", [])}
    for p in d.get("panels", []):
        g = p.get("gridPos", {})
        if not all(k in g for k in "hwxy") or g["x"] + g["w"] > 24:
            problem(f"dashboard: panel {p.get('title')} has a bad gridPos {g}")
        if p["type"] == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            problem(f"dashboard: panel {p.get('title')} does not use the datasource variable")
        refs = [t.get("refId") for t in p.get("targets", [])]
        if not refs or len(refs) != len(set(refs)) or not all(t.get("expr") for t in p["targets"]):
            problem(f"dashboard: panel {p.get('title')} has missing or duplicate queries")
        for t in p.get("targets", []):
            for var in re.findall(r"\$(\w+)", t["expr"]):
                if not var.startswith("__") and var not in variables:
                    problem(f"dashboard: panel {p.get('title')} uses undefined variable ${var}")
        for link in p.get("fieldConfig", {}).get("defaults", {}).get("links", []):
            for var in re.findall(r"\$\{(\w+)", link.get("url", "") + link.get("title", "")):
                if not var.startswith("__") and var not in variables:
                    problem(f"dashboard: panel {p.get('title')}: a link uses undefined variable ${var}")
    # The per-stage latency panel links each stage to its spans in the trace data source chosen as `tempo`.
    tempo = [v for v in d.get("templating", {}).get("list", []) if v["name"] == "tempo"]
    if not tempo or tempo[0].get("type") != "datasource" or tempo[0].get("query") != "tempo":
        problem("dashboard: no data source variable `tempo` (type tempo) for the trace links")
    for p in d.get("panels", []):
        if "latency" in p.get("title", "").lower():
            urls = [unquote(link.get("url", "")) for link in p.get("fieldConfig", {}).get("defaults", {}).get("links", [])]
            if not any(u.startswith("/explore?") and "${tempo}" in u and 'name=\\"herald-${__field.labels.stage} process\\"' in u
                       and 'resource.service.name=\\"herald-${__field.labels.stage}\\"' in u for u in urls):
                problem(f"dashboard: panel {p.get('title')} has no Explore link to the stage's spans in ${{tempo}}")
    titles = " ".join(p.get("title", "").lower() for p in d.get("panels", []))
    for topic in ["throughput", "suppressions", "provider answers", "latency", "lag", "dead-letter", "in flight", "renewals"]:
        if topic not in titles:
            problem(f"dashboard: no panel about {topic}")


def heading_anchors(path):
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation but hyphens dropped, spaces
    turned into hyphens, a repeated one numbered."""
    anchors, seen = set(), {}
    for line in open(path):
        m = re.match(r"#{1,6}\s+(.*?)\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def check_runbooks(rules):
    """Each alert's runbook annotation names a file of the repository and a heading in it."""
    import os
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    for group in yaml.safe_load(open(rules))["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            link = (rule.get("annotations") or {}).get("runbook")
            if not link:
                problem(f"{rule['alert']}: no runbook annotation")
                continue
            path, _, anchor = link.partition("#")
            full = os.path.join(root, path)
            if not os.path.isfile(full):
                problem(f"{rule['alert']}: runbook {link}: no file {path}")
            elif anchor and anchor not in heading_anchors(full):
                problem(f"{rule['alert']}: runbook {link}: {path} has no heading #{anchor}")


def check_dockerfile(dockerfile, setup):
    stages, current = [], None
    for line in re.sub(r"\\\n\s*", " ", open(dockerfile).read()).splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            current = {"from": line, "run": []}
            stages.append(current)
        elif line.startswith("RUN ") and current is not None:
            current["run"].append(line[4:].strip())
    if len(stages) != 2:
        problem(f"Dockerfile: expected a build and a runtime stage, found {len(stages)}")
        return
    build, runtime = stages
    if build["run"][:1] != ["bash scripts/setup.sh"]:
        problem(f"Dockerfile: the build stage must start with `bash scripts/setup.sh`, found {build['run'][:1]}")
    for r in build["run"]:
        if re.search(r"\b(apt-get|apt|pip3?|dpkg|curl|wget)\b", r):
            problem(f"Dockerfile: the build stage installs on its own ({r}); install through scripts/setup.sh")
    if not any(r.startswith("swift build -c release") for r in build["run"]):
        problem("Dockerfile: the build stage does not run `swift build -c release`")
    # The runtime libraries: each -dev library setup.sh installs must have its runtime package in the image,
    # as dpkg itself names it (the -dev package's dependencies).
    packages = re.search(r"APT_PACKAGES=\(([^)]*)\)", open(setup).read(), re.S).group(1).split()
    runtime_install = " ".join(runtime["run"])
    installed = set(re.findall(r"[a-z0-9][a-z0-9.+-]+", runtime_install.split("install", 1)[-1]))
    for dev in [p for p in packages if p.startswith("lib") and p.endswith("-dev")]:
        # setup.sh installed it, so dpkg knows its dependencies ("libhiredis0.14 (= 0.14.1-3), ...").
        out = subprocess.run(["dpkg-query", "-W", "-f=${Depends}", dev], capture_output=True, text=True).stdout
        deps = {d.strip().split(" ")[0] for alt in out.split(",") for d in alt.split("|") if d.strip()}
        if not deps:
            problem(f"Dockerfile: dpkg knows no dependencies of {dev} (is it installed? bash scripts/setup.sh)")
        elif not deps & installed:
            problem(f"Dockerfile: the runtime stage installs none of {sorted(deps)}, the runtime of {dev}")


if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    {"kube": check_kube, "compose": check_compose, "dashboard": check_dashboard, "dockerfile": check_dockerfile,
     "runbooks": check_runbooks}[what](*args)
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)
