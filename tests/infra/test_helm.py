"""The Helm chart in infra/helm/sandbase, checked offline (no cluster runs here): `helm lint
--strict` and `helm template` over the values files in its ci/ folder, every rendered object
validated strictly against the schemas of Kubernetes 1.29 to 1.35 (kubernetes-validate
bundles them), assertions on what the objects must hold, the gateway's rendered
configuration read by `sandbase check-config`, and values the chart must refuse, each refused
with a message naming the key at fault."""

import base64
import os
import socket
import ssl
import subprocess
import threading

import kubernetes_validate
import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CHART = os.path.normpath(os.path.join(HERE, "..", "..", "infra", "helm", "sandbase"))
HELM = os.path.normpath(os.path.join(HERE, "..", "..", "infra", "helm", "tools", "bin", "helm"))
BINARY = os.path.abspath(os.environ.get("SANDBASE_BINARY", "target/debug/sandbase"))
VALUES = sorted(name for name in os.listdir(os.path.join(CHART, "ci")) if name.endswith(".yaml"))
KUBERNETES = [f"1.{minor}.0" for minor in range(29, 36)]
SECRET_VALUES = ["sandbase:pw@", "0123456789abcdef0123456789abcdef",
                 "fedcba9876543210fedcba9876543210", "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
                 "sk_live_example", "whsec_example", "an-operator-token-of-some-length"]


def helm(*args):
    return subprocess.run([HELM, *args], capture_output=True, text=True)


def render(values=None, *extra):
    args = ["template", "sb", CHART, "--namespace", "sandbase"]
    if values:
        args += ["-f", os.path.join(CHART, "ci", values)]
    done = helm(*args, *extra)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def of_kind(objects, kind):
    return [obj for obj in objects if obj["kind"] == kind]


def named(objects, kind, suffix):
    found = [obj for obj in of_kind(objects, kind) if obj["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, (kind, suffix, [obj["metadata"]["name"] for obj in objects])
    return found[0]


def pod_specs(objects):
    for obj in objects:
        if obj["kind"] in ("Deployment", "DaemonSet", "Job"):
            yield obj, obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Pod":
            yield obj, obj["spec"]


def containers(spec):
    return spec.get("initContainers", []) + spec["containers"]


@pytest.mark.parametrize("values", VALUES)
def test_lint_strict(values):
    linted = helm("lint", "--strict", CHART, "-f", os.path.join(CHART, "ci", values))
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "0 chart(s) failed" in linted.stdout


@pytest.mark.parametrize("values", VALUES)
def test_every_object_is_valid_for_kubernetes_1_29_to_1_35(values):
    objects = render(values)
    assert objects
    for version in KUBERNETES:
        for obj in objects:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                raise AssertionError(f"{version} {obj['kind']} {obj['metadata']['name']}: {error}")


@pytest.mark.parametrize("values", VALUES)
def test_only_the_worker_is_privileged_and_the_rest_holds_nothing(values):
    for obj, spec in pod_specs(render(values)):
        assert spec.get("automountServiceAccountToken") is False, obj["metadata"]["name"]
        for container in containers(spec):
            context = container.get("securityContext", {})
            where = f"{obj['metadata']['name']}/{container['name']}"
            privileged_ones = ("worker", "containerd")
            if obj["kind"] == "DaemonSet" and container["name"] in privileged_ones:
                assert context.get("privileged") is True, where
                continue
            assert not context.get("privileged"), where
            assert context["runAsNonRoot"] is True and context["runAsUser"] != 0, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert context["seccompProfile"]["type"] == "RuntimeDefault", where
            assert "add" not in context["capabilities"], where
            assert container["resources"]["limits"]["memory"], where


@pytest.mark.parametrize("values", VALUES)
def test_probes_resources_and_the_gateways_disk(values):
    objects = render(values)
    gateway = named(objects, "Deployment", "-gateway")
    spec = gateway["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    writable = {mount["mountPath"] for mount in container["volumeMounts"]
                if not mount.get("readOnly")}
    assert writable == {"/var/lib/sandbase", "/tmp"}
    strategy = gateway["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0
    for obj, pod in pod_specs(objects):
        for each in containers(pod):
            assert each.get("resources", {}).get("requests"), f"{obj['metadata']['name']}/{each['name']}"
    for worker in of_kind(objects, "DaemonSet"):
        pod = worker["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["livenessProbe"]["tcpSocket"]["port"] == 8090
        assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 300


def test_the_worker_daemonset(tmp_path):
    objects = render("minimal-values.yaml")
    worker = named(objects, "DaemonSet", "-worker")
    assert worker["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1
    pod = worker["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["nodeSelector"] == {"sandbase.dev/sandboxes": "true"}
    assert pod["tolerations"][0]["key"] == "sandbase.dev/sandboxes"
    assert pod["terminationGracePeriodSeconds"] >= 120
    credential, containerd = pod["initContainers"]
    # The node token reaches the credential's init container only.
    assert any(env["name"] == "SANDBASE_WORKERS__NODE_TOKEN" for env in credential["env"])
    (container,) = pod["containers"]
    assert all(env["name"] != "SANDBASE_WORKERS__NODE_TOKEN" for env in container["env"])
    assert "--credential-file=/run/sandbase-credential/credential" in container["args"]
    # containerd as a native sidecar: started first, stopped last.
    assert containerd["name"] == "containerd" and containerd["restartPolicy"] == "Always"
    for each in (containerd, container):
        propagation = {mount["mountPath"]: mount.get("mountPropagation")
                       for mount in each["volumeMounts"]}
        assert propagation["/var/lib/sandbase"] == "Bidirectional"
        assert propagation["/run/sandbase"] == "Bidirectional"
    assert "--gateway=https://sb-sandbase-internal.sandbase.svc:8081" in container["args"]
    # The node's own containerd instead of the sidecar.
    node = named(render("existing-secret-values.yaml"), "DaemonSet", "-worker")
    pod = node["spec"]["template"]["spec"]
    assert [each["name"] for each in pod["initContainers"]] == ["credential"]
    assert "--containerd-socket=/run/containerd/containerd.sock" in pod["containers"][0]["args"]


def referenced_secrets(spec):
    """Every Secret a pod spec names: volumes, env and envFrom of every container."""
    names = {volume["secret"]["secretName"] for volume in spec.get("volumes", [])
             if "secret" in volume}
    for container in containers(spec):
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                names.add(source["secretRef"]["name"])
    return names


@pytest.mark.parametrize("values", VALUES)
def test_a_sandbox_node_can_read_the_node_token_and_nothing_else(values):
    """The Node authorizer lets a node read the Secrets its pods reference: the worker's pods
    reference one holding the node token alone (and the internal TLS Secret), never the
    platform Secret with the database URL, session secret, vault keys and Stripe keys."""
    objects = render(values)
    workers = [obj for obj in of_kind(objects, "DaemonSet") if obj["metadata"]["name"].endswith("-worker")]
    if not workers:
        return
    spec = workers[0]["spec"]["template"]["spec"]
    platform = {"sb-sandbase-secrets", "sandbase-managed"}
    names = referenced_secrets(spec)
    assert not names & platform, names
    node_secrets = [obj for obj in of_kind(objects, "Secret") if obj["metadata"]["name"] in names]
    for secret in node_secrets:
        assert set(secret.get("stringData", {})) <= {"SANDBASE_WORKERS__NODE_TOKEN"}, secret
        # The channel's: the workers' own certificate and key, and the CA's certificate.
        assert set(secret.get("data", {})) <= {"ca.crt", "tls.crt", "tls.key"}, secret
    gateway_tls = [obj for obj in of_kind(objects, "Secret")
                   if obj["metadata"]["name"].endswith("-internal-tls")]
    for secret in gateway_tls:
        assert secret["metadata"]["name"] not in names


def test_hooks_order_the_secret_before_the_migration_and_the_gateways_do_not_migrate():
    objects = render("minimal-values.yaml")
    secret = named(objects, "Secret", "-secrets")
    job = named(objects, "Job", "-migrate")
    hooks = secret["metadata"]["annotations"], job["metadata"]["annotations"]
    for annotations in hooks:
        assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(hooks[0]["helm.sh/hook-weight"]) < int(hooks[1]["helm.sh/hook-weight"])
    assert "before-hook-creation" in hooks[1]["helm.sh/hook-delete-policy"]
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
    toml = named(objects, "ConfigMap", "-config")["data"]["sandbase.toml"]
    assert "migrate_on_start = false" in toml
    test_pod = named(objects, "Pod", "-test")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"


@pytest.mark.parametrize("values", VALUES)
def test_no_secret_value_is_in_a_configmap_or_an_environment_literal(values):
    for obj in render(values):
        if obj["kind"] == "Secret":
            continue
        text = yaml.safe_dump(obj)
        for secret in SECRET_VALUES:
            assert secret not in text, (obj["kind"], obj["metadata"]["name"], secret)
    for obj, spec in pod_specs(render(values)):
        for container in containers(spec):
            for env in container.get("env", []):
                if "SECRET" in env["name"] or "TOKEN" in env["name"] or env["name"].endswith("_URL"):
                    assert "valueFrom" in env and "value" not in env, env


def test_the_internal_listener_admits_only_the_sandbox_nodes_and_scrapers():
    objects = render("full-values.yaml")
    policy = named(objects, "NetworkPolicy", "-gateway")
    public, internal = policy["spec"]["ingress"]
    assert public["ports"] == [{"port": "http", "protocol": "TCP"}] and "from" not in public
    assert internal["ports"] == [{"port": "internal", "protocol": "TCP"}]
    sources = internal["from"]
    assert [source["ipBlock"]["cidr"] for source in sources if "ipBlock" in source] == [
        "10.0.0.0/16", "fd00::/64"]
    assert any("namespaceSelector" in source for source in sources)
    assert not any("podSelector" in source for source in sources)
    internal_service = named(objects, "Service", "-internal")
    assert internal_service["spec"]["type"] == "ClusterIP"


def test_scaling_ingress_and_tls_when_asked():
    objects = render("full-values.yaml")
    gateway = named(objects, "Deployment", "-gateway")
    assert "replicas" not in gateway["spec"]
    hpa = named(objects, "HorizontalPodAutoscaler", "-gateway")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    assert named(objects, "PodDisruptionBudget", "-gateway")["spec"]["minAvailable"] == 1
    ingress = named(objects, "Ingress", "sb-sandbase")
    hosts = [rule["host"] for rule in ingress["spec"]["rules"]]
    assert hosts == ["sandbase.example.com", "*.preview.sandbase.example.com"]
    worker = named(objects, "DaemonSet", "-worker")["spec"]["template"]["spec"]["containers"][0]
    assert "--tls-ca=/etc/sandbase/tls/ca.crt" in worker["args"]
    assert "--advertise-url=https://$(NODE_NAME):8090" in worker["args"]
    assert "--gateway=https://sb-sandbase-internal.sandbase.svc:8081" in worker["args"]
    image = gateway["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example.com/sandbase/gateway:0.1.0"
    # Behind the ingress, the gateway believes the controller's X-Forwarded-For only.
    toml = named(objects, "ConfigMap", "-config")["data"]["sandbase.toml"]
    assert 'trusted_proxies = ["10.0.0.0/8"]' in toml, toml
    # A LoadBalancer that keeps clients' addresses needs no proxies named.
    kept = render("minimal-values.yaml", "--set", "gateway.service.type=LoadBalancer",
                  "--set", "gateway.service.externalTrafficPolicy=Local")
    assert named(kept, "Service", "sb-sandbase")["spec"]["externalTrafficPolicy"] == "Local"


def channel_files(secret, directory):
    """A rendered kubernetes.io/tls Secret's files, written into `directory`."""
    directory.mkdir(exist_ok=True)
    for key, value in secret["data"].items():
        (directory / key).write_bytes(base64.b64decode(value))
    return directory


@pytest.mark.parametrize("values", VALUES)
def test_the_gateways_rendered_configuration_is_one_the_gateway_accepts(values, tmp_path):
    objects = render(values)
    toml = named(objects, "ConfigMap", "-config")["data"]["sandbase.toml"]
    keys = tmp_path / "vault.keys"
    keys.write_text("1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n")
    toml = toml.replace("/etc/sandbase/secrets/vault.keys", str(keys))
    if "[internal_tls]" in toml:
        # The channel the chart generates (the operator's own Secret stands in for one).
        generated = [obj for obj in of_kind(objects, "Secret")
                     if obj["metadata"]["name"].endswith("-internal-tls")]
        secret = (generated or [named(render("minimal-values.yaml"), "Secret", "-internal-tls")])[0]
        toml = toml.replace("/etc/sandbase/tls", str(channel_files(secret, tmp_path / "tls")))
    config = tmp_path / "sandbase.toml"
    config.write_text(toml)
    env = {"PATH": os.environ.get("PATH", ""), "DATABASE_URL": "postgres://db/sandbase",
           "REDIS_URL": "redis://redis", "SANDBASE_AUTH__JWT_SECRET": "x" * 32}
    checked = subprocess.run([BINARY, "check-config", "--config", str(config)], env=env,
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip().endswith(": valid")


def handshake(directory, name):
    """Serves `directory`'s certificate on loopback and answers whether a client trusting only
    its CA accepts it as `name`."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    client = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        connection, _ = listener.accept()
        try:
            server.wrap_socket(connection, server_side=True).close()
        except (ssl.SSLError, OSError):
            connection.close()

    serving = threading.Thread(target=serve)
    serving.start()
    try:
        with socket.create_connection(listener.getsockname()) as raw:
            with client.wrap_socket(raw, server_hostname=name):
                return True
    except ssl.SSLError:
        return False
    finally:
        serving.join(timeout=10)
        listener.close()


def test_the_internal_channel_is_on_by_default_and_no_node_holds_the_gateways_key(tmp_path):
    """By default the chart makes the channel: one CA, a certificate for the gateways naming
    the internal Service and one for the workers naming internalTLS.workerName (which the
    gateways call every worker as), each Secret referenced by its own pods only."""
    objects = render("minimal-values.yaml")
    gateway_secret = named(objects, "Secret", "-internal-tls")
    worker_secret = named(objects, "Secret", "-internal-tls-worker")
    gateway = named(objects, "Deployment", "-gateway")["spec"]["template"]["spec"]
    worker = named(objects, "DaemonSet", "-worker")["spec"]["template"]["spec"]
    assert gateway_secret["metadata"]["name"] in referenced_secrets(gateway)
    assert worker_secret["metadata"]["name"] in referenced_secrets(worker)
    assert gateway_secret["metadata"]["name"] not in referenced_secrets(worker)
    assert gateway_secret["data"]["ca.crt"] == worker_secret["data"]["ca.crt"]
    assert gateway_secret["data"]["tls.key"] != worker_secret["data"]["tls.key"]
    toml = named(objects, "ConfigMap", "-config")["data"]["sandbase.toml"]
    assert 'peer_name = "worker.sandbase.internal"' in toml, toml
    args = worker["containers"][0]["args"]
    assert "--advertise-url=https://$(NODE_IP):8090" in args
    # Each certificate holds for its own names only, under the CA.
    gateways = channel_files(gateway_secret, tmp_path / "gateway")
    workers = channel_files(worker_secret, tmp_path / "worker")
    internal = "sb-sandbase-internal.sandbase.svc"
    assert handshake(gateways, internal)
    assert not handshake(gateways, "worker.sandbase.internal")
    assert handshake(workers, "worker.sandbase.internal")
    assert not handshake(workers, internal)
    # Off when asked: plain HTTP between the ends, no channel Secret.
    plain = render("minimal-values.yaml", "--set", "internalTLS.enabled=false")
    assert not [obj for obj in of_kind(plain, "Secret") if "-internal-tls" in obj["metadata"]["name"]]
    args = named(plain, "DaemonSet", "-worker")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--gateway=http://sb-sandbase-internal.sandbase.svc:8081" in args


REFUSED = [
    # (extra arguments, what the refusal must name)
    (["--set", "gateway.replicas=3"], "gateway.artifacts.s3.bucket"),
    (["--set", "gateway.autoscaling.enabled=true"], "gateway.artifacts.s3.bucket"),
    (["--set", "secrets.databaseUrl="], "secrets.databaseUrl"),
    (["--set", "secrets.sessionSecret=short"], "secrets.sessionSecret"),
    (["--set", "secrets.vaultKeys="], "secrets.vaultKeys"),
    (["--set", "networkPolicy.workerNodeCIDRs=null"], "networkPolicy.workerNodeCIDRs"),
    (["--set", "internalTLS.secretName=mine"], "internalTLS.workerSecretName"),
    (["--set", "internalTLS.workerName=not a name"], "workerName"),
    (["--set", "secrets.existingSecret=managed"], "secrets.existingNodeSecret"),
    (["--set", "ingress.enabled=true"], "ingress.host"),
    (["--set", "ingress.enabled=true", "--set", "ingress.host=x.example.com"], "trustedProxies"),
    (["--set", "gateway.service.type=LoadBalancer"], "trustedProxies"),
    (["--set", "trustedProxies[0]=the-proxy"], "trustedProxies"),
    (["--set", "gateway.replicaz=2"], "replicaz"),
    (["--set", "gateway.replicas=0"], "replicas"),
    (["--set", "worker.advertise=podIP"], "advertise"),
    (["--set", "worker.containerd.mode=docker"], "mode"),
    (["--set", "secrets.redisUrl=http://not-redis"], "redisUrl"),
    (["--set", "worker.pools[0]=base"], "pools"),
    (["--set", "config.auth.jwt_secret=in-a-configmap"], "config"),
    (["--set", "networkPolicy.workerNodeCIDRs[0]=everywhere"], "workerNodeCIDRs"),
]


@pytest.mark.parametrize("extra, key", REFUSED, ids=[key for _, key in REFUSED])
def test_bad_values_are_refused_naming_the_key(extra, key):
    args = ["template", "sb", CHART, "-f", os.path.join(CHART, "ci", "minimal-values.yaml"), *extra]
    done = helm(*args)
    assert done.returncode != 0, f"accepted: {extra}"
    assert key in done.stderr, done.stderr


def test_defaults_alone_are_refused_with_what_is_missing():
    done = helm("template", "sb", CHART)
    assert done.returncode != 0
    assert "secrets." in done.stderr or "gateway.artifacts.s3.bucket" in done.stderr
