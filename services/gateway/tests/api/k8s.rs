//! The Kubernetes manifests (deploy/k8s) render with kubectl's kustomize,
//! and what they say about the service holds for the real one: the port it
//! listens on, its probe and metrics paths, the metrics the autoscaler
//! reads, the configuration keys it accepts, and (with-postgres) a database
//! URL that reaches the PostgreSQL beside it. Needs kubectl 1.21 or later
//! (kustomize v4+); `make test` sets RAGTIME_TEST_KUBECTL when it finds one.

use crate::helpers::TestApp;
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

/// The directories `kubectl kustomize` renders: the top one is the base.
const BASE: &str = "deploy/k8s/base";
const WITH_POSTGRES: &str = "deploy/k8s/with-postgres";
const TOP: &str = "deploy/k8s";

/// Environment variables the service reads that are not `RAGTIME__…`.
const OTHER_ENV: [&str; 3] = [
    "RUST_LOG",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// RAGTIME_TEST_KUBECTL (set by `make test`), else `kubectl` on the PATH.
fn kubectl() -> String {
    std::env::var("RAGTIME_TEST_KUBECTL")
        .ok()
        .filter(|k| !k.trim().is_empty())
        .unwrap_or_else(|| "kubectl".to_owned())
}

/// `kubectl kustomize DIR`: every object of the rendered stream, as JSON.
/// Rendering must succeed without a warning.
fn render(dir: &str) -> Vec<Value> {
    let kubectl = kubectl();
    let out = Command::new(&kubectl)
        .arg("kustomize")
        .arg(root().join(dir))
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "this test needs kubectl 1.21 or later (its kustomize renders {dir}): \
                 cannot run {kubectl:?}: {e}; set RAGTIME_TEST_KUBECTL or put kubectl on the PATH"
            )
        });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{kubectl} kustomize {dir} failed: {stderr}"
    );
    assert!(
        stderr.trim().is_empty(),
        "{kubectl} kustomize {dir} warns: {stderr}"
    );
    let text = String::from_utf8(out.stdout).expect("kustomize prints UTF-8");
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = serde_yaml::Value::deserialize(doc).unwrap_or_else(|e| panic!("{dir}: {e}"));
        if v.is_null() {
            continue;
        }
        docs.push(serde_json::to_value(&v).unwrap_or_else(|e| panic!("{dir}: {e}")));
    }
    docs
}

/// `Kind/name` of every object.
fn names(docs: &[Value]) -> BTreeSet<String> {
    docs.iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or("?"),
                d["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} in {:?}", names(docs)))
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn string_map(v: &Value, what: &str) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let s = v
                        .as_str()
                        .unwrap_or_else(|| panic!("{what}.{k} is not a string: {v}"));
                    (k.clone(), s.to_owned())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A Secret's values, from `stringData` or (base64) `data`.
fn secret_values(secret: &Value) -> BTreeMap<String, String> {
    use base64::Engine as _;
    let mut out: BTreeMap<String, String> = string_map(&secret["data"], "data")
        .into_iter()
        .map(|(k, v)| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v.as_bytes())
                .unwrap_or_else(|e| panic!("secret data {k}: {e}"));
            (k, String::from_utf8(bytes).expect("secret data is UTF-8"))
        })
        .collect();
    out.extend(string_map(&secret["stringData"], "stringData"));
    out
}

/// A label selector's `matchLabels` (or a Service's `selector`) picks the
/// pods with `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let want = selector.as_object().filter(|m| !m.is_empty());
    want.is_some_and(|m| m.iter().all(|(k, v)| labels[k.as_str()] == *v))
}

/// The environment a container starts with: `envFrom` ConfigMaps and
/// Secrets in order, then `env` (values and secret/config-map references).
fn container_env(docs: &[Value], container: &Value) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for from in container["envFrom"].as_array().into_iter().flatten() {
        if let Some(name) = from["configMapRef"]["name"].as_str() {
            let cm = find(docs, "ConfigMap", name);
            env.extend(string_map(&cm["data"], name));
        }
        if let Some(name) = from["secretRef"]["name"].as_str() {
            env.extend(secret_values(find(docs, "Secret", name)));
        }
    }
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().expect("env name").to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else if let Some(r) = e["valueFrom"]["secretKeyRef"].as_object() {
            let s = find(docs, "Secret", r["name"].as_str().expect("secret name"));
            let key = r["key"].as_str().expect("secret key");
            secret_values(s)
                .remove(key)
                .unwrap_or_else(|| panic!("{name}: no key {key} in its Secret"))
        } else if let Some(r) = e["valueFrom"]["configMapKeyRef"].as_object() {
            let cm = find(docs, "ConfigMap", r["name"].as_str().expect("config map"));
            let key = r["key"].as_str().expect("config map key");
            cm["data"][key]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: no key {key} in its ConfigMap"))
                .to_owned()
        } else {
            continue;
        };
        env.insert(name, value);
    }
    env
}

/// Bytes in a Kubernetes memory quantity (`2Gi`, `512Mi`, `1G`, `1000`).
fn bytes(q: &Value) -> f64 {
    let s = q.as_str().map_or_else(|| q.to_string(), str::to_owned);
    let units: [(&str, f64); 8] = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    let (n, m) = units
        .iter()
        .find_map(|(u, m)| s.strip_suffix(u).map(|n| (n, *m)))
        .unwrap_or((s.as_str(), 1.0));
    n.parse::<f64>()
        .unwrap_or_else(|e| panic!("memory quantity {s:?}: {e}"))
        * m
}

/// `ragtime config` (the real configuration loader: defaults, then the
/// environment, validated) with exactly `env` set: the effective
/// configuration as JSON, or the error it printed.
fn ragtime_config(env: &BTreeMap<String, String>) -> Result<Value, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Command::new(env!("CARGO_BIN_EXE_ragtime"));
    c.current_dir(dir.path()).arg("config");
    for (k, _) in std::env::vars() {
        if k.starts_with("RAGTIME__") || k.starts_with("OTEL_") {
            c.env_remove(k);
        }
    }
    c.envs(env);
    let out = c.output().expect("run ragtime config");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("config json"))
}

/// What a rendered deployment says about the ragtime pods.
struct Ragtime {
    deployment: Value,
    container: Value,
    /// The pod's environment, ConfigMap and Secret resolved.
    env: BTreeMap<String, String>,
    /// The `http` container port.
    port: u16,
    /// The effective configuration `ragtime config` prints for `env`.
    effective: Value,
}

/// Checks every part of a rendered ragtime deployment that does not need a
/// server, and returns what the running one is checked against.
fn check_ragtime(dir: &str, docs: &[Value]) -> Ragtime {
    let kinds: BTreeSet<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    for k in [
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ConfigMap",
        "Secret",
    ] {
        assert!(kinds.contains(k), "{dir}: no {k} in {:?}", names(docs));
    }
    // Namespace-agnostic: applied with -n, or a kustomization's namespace.
    assert!(!kinds.contains("Namespace"), "{dir} makes a Namespace");
    for d in docs {
        assert!(
            d["metadata"]["namespace"].is_null(),
            "{dir}: {} names a namespace",
            d["metadata"]["name"]
        );
    }

    let deployment = find(docs, "Deployment", "ragtime").clone();
    assert_eq!(deployment["spec"]["replicas"], 2, "{dir}: replicas");
    let pod = &deployment["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    assert!(
        selects(&deployment["spec"]["selector"]["matchLabels"], labels),
        "{dir}: the Deployment's selector picks its own pods"
    );
    let containers = pod["spec"]["containers"].as_array().expect("containers");
    let container = containers
        .iter()
        .find(|c| c["name"] == "ragtime")
        .unwrap_or_else(|| panic!("{dir}: no container named ragtime"))
        .clone();
    let http = container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "http")
        .unwrap_or_else(|| panic!("{dir}: no container port named http"));
    let port = http["containerPort"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .expect("containerPort");
    let port_ok = |p: &Value| *p == "http" || p.as_u64() == Some(u64::from(port));

    // Probes: readiness on /readyz, liveness on /healthz, a startup probe
    // patient enough for the index load.
    for (probe, path) in [
        ("readinessProbe", Some("/readyz")),
        ("livenessProbe", Some("/healthz")),
        ("startupProbe", None),
    ] {
        let get = &container[probe]["httpGet"];
        let got = get["path"].as_str().unwrap_or_default();
        match path {
            Some(want) => assert_eq!(got, want, "{dir}: {probe} path"),
            None => assert!(
                ["/readyz", "/healthz"].contains(&got),
                "{dir}: {probe} path {got:?}"
            ),
        }
        assert!(port_ok(&get["port"]), "{dir}: {probe} port {}", get["port"]);
    }
    let startup = &container["startupProbe"];
    let patience = startup["failureThreshold"].as_u64().unwrap_or(3)
        * startup["periodSeconds"].as_u64().unwrap_or(10);
    assert!(
        patience >= 300,
        "{dir}: the startup probe gives up after {patience} s; loading the indexes may take minutes"
    );

    // Metrics: scraped where the service serves them.
    let ann = &pod["metadata"]["annotations"];
    assert_eq!(ann["prometheus.io/scrape"], "true", "{dir}");
    assert_eq!(
        ann["prometheus.io/port"].as_str(),
        Some(port.to_string().as_str()),
        "{dir}: the scrape port is the container port"
    );
    assert!(
        ann["prometheus.io/path"]
            .as_str()
            .is_some_and(|p| p.starts_with('/')),
        "{dir}: prometheus.io/path"
    );

    // Memory sized from docs/scaling.md: set, and the limit above the request.
    let res = &container["resources"];
    let (req, lim) = (
        bytes(&res["requests"]["memory"]),
        bytes(&res["limits"]["memory"]),
    );
    assert!(
        req >= 1024.0 * 1024.0 * 1024.0,
        "{dir}: a memory request under 1 GiB cannot hold the models and a corpus"
    );
    assert!(lim >= req, "{dir}: memory limit under the request");
    assert!(
        !res["requests"]["cpu"].is_null(),
        "{dir}: cpu request (the HPA's CPU metric needs it)"
    );

    // Replicas on different nodes where possible.
    let spread = pod["spec"]["affinity"]["podAntiAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| {
            t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
                && selects(&t["podAffinityTerm"]["labelSelector"]["matchLabels"], labels)
        });
    assert!(spread, "{dir}: preferred pod anti-affinity across nodes");

    // The configuration: every key one the service reads, and accepted.
    let env = container_env(docs, &container);
    for k in env.keys() {
        assert!(
            k.starts_with("RAGTIME__") || OTHER_ENV.contains(&k.as_str()),
            "{dir}: {k} is not a variable ragtime reads"
        );
    }
    for want in ["RAGTIME__ADMIN_KEY", "RAGTIME__DATABASE_URL"] {
        assert!(env.contains_key(want), "{dir}: {want} is not set");
    }
    let url = &env["RAGTIME__DATABASE_URL"];
    assert!(
        url.starts_with("postgres://") || url.starts_with("postgresql://"),
        "{dir}: replicas share a PostgreSQL store, not {url:?}"
    );
    let effective =
        ragtime_config(&env).unwrap_or_else(|e| panic!("{dir}: ragtime refuses its config: {e}"));
    // Each ConfigMap key lands where it is meant to (secrets print as ***).
    for from in container["envFrom"].as_array().into_iter().flatten() {
        let Some(name) = from["configMapRef"]["name"].as_str() else {
            continue;
        };
        let data = string_map(&find(docs, "ConfigMap", name)["data"], name);
        for (k, v) in &data {
            let Some(path) = k.strip_prefix("RAGTIME__") else {
                continue;
            };
            let mut at = &effective;
            for part in path.split("__") {
                at = &at[part.to_lowercase().as_str()];
            }
            let shown = match at {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            assert_eq!(&shown, v, "{dir}: {k} in effect");
        }
    }
    // The check has teeth: a key the service does not know stops it.
    let mut wrong = env.clone();
    wrong.insert("RAGTIME__SERVER__NO_SUCH_KEY".into(), "1".into());
    let err = ragtime_config(&wrong).expect_err("an unknown key is refused");
    assert!(err.contains("no_such_key"), "{err}");

    // It listens on every interface, on the container port.
    let addr: SocketAddr = effective["server"]["addr"]
        .as_str()
        .expect("server.addr")
        .parse()
        .expect("server.addr is an address");
    assert_eq!(addr.port(), port, "{dir}: containerPort is the listen port");
    assert!(
        addr.ip().is_unspecified(),
        "{dir}: a pod must listen beyond loopback, not on {addr}"
    );
    // The data folder, created at start, is writable: a volume is mounted there.
    let data_dir = effective["data_dir"].as_str().expect("data_dir");
    assert!(
        container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["mountPath"] == data_dir),
        "{dir}: no volume at data_dir {data_dir}"
    );

    // On SIGTERM ragtime closes its listener at once and drains for
    // server.shutdown_grace_s: a preStop sleep first, and a grace period
    // that covers both.
    let sleep = container["lifecycle"]["preStop"]["exec"]["command"]
        .as_array()
        .filter(|c| c.first().is_some_and(|s| s == "sleep"))
        .and_then(|c| c.get(1))
        .and_then(|s| s.as_str())
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{dir}: no preStop sleep"));
    let drain = effective["server"]["shutdown_grace_s"]
        .as_u64()
        .expect("shutdown_grace_s");
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or(30);
    assert!(
        grace > sleep + drain,
        "{dir}: terminationGracePeriodSeconds {grace} <= preStop {sleep} + drain {drain}"
    );

    // The Service and the PodDisruptionBudget pick these pods.
    let svc = find(docs, "Service", "ragtime");
    assert_eq!(
        svc["spec"]["type"].as_str().unwrap_or("ClusterIP"),
        "ClusterIP"
    );
    assert!(
        selects(&svc["spec"]["selector"], labels),
        "{dir}: Service selector"
    );
    let sp = svc["spec"]["ports"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["port"] == 80))
        .unwrap_or_else(|| panic!("{dir}: the Service has no port 80"));
    assert!(port_ok(&sp["targetPort"]), "{dir}: Service targetPort");
    let pdb = find(docs, "PodDisruptionBudget", "ragtime");
    assert_eq!(pdb["spec"]["minAvailable"], 1, "{dir}");
    assert!(
        selects(&pdb["spec"]["selector"]["matchLabels"], labels),
        "{dir}: PDB selector"
    );

    // The autoscaler: on a metric ragtime exports (checked against a
    // running server below), and on CPU.
    let hpa = find(docs, "HorizontalPodAutoscaler", "ragtime");
    assert_eq!(hpa["apiVersion"], "autoscaling/v2", "{dir}");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "ragtime");
    assert!(
        hpa["spec"]["minReplicas"].as_u64().unwrap_or(1) >= 2,
        "{dir}"
    );
    assert!(!hpa_pod_metrics(docs).is_empty(), "{dir}: no Pods metric");
    let metrics = hpa["spec"]["metrics"].as_array().expect("metrics");
    assert!(
        metrics
            .iter()
            .any(|m| m["type"] == "Resource" && m["resource"]["name"] == "cpu"),
        "{dir}: no CPU metric"
    );

    Ragtime {
        deployment,
        container,
        env,
        port,
        effective,
    }
}

/// The Pods metrics the autoscaler names.
fn hpa_pod_metrics(docs: &[Value]) -> Vec<String> {
    find(docs, "HorizontalPodAutoscaler", "ragtime")["spec"]["metrics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["type"] == "Pods")
        .map(|m| {
            m["pods"]["metric"]["name"]
                .as_str()
                .expect("Pods metric name")
                .to_owned()
        })
        .collect()
}

/// `postgres://user:password@host:port/db` in parts.
fn url_parts(url: &str) -> (String, String, String, u16, String) {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
        .unwrap_or_else(|| panic!("{url:?} is not a postgres:// URL"));
    let (creds, rest) = rest.split_once('@').expect("user:password@ in the URL");
    let (user, password) = creds.split_once(':').expect("user:password in the URL");
    let (host_port, db) = rest.split_once('/').expect("/database in the URL");
    let db = db.split('?').next().unwrap_or_default();
    let (host, port) = host_port.split_once(':').unwrap_or((host_port, "5432"));
    let port = port.parse().expect("a port number in the URL");
    (
        user.to_owned(),
        password.to_owned(),
        host.to_owned(),
        port,
        db.to_owned(),
    )
}

#[test]
#[ignore = "needs kubectl 1.21 or later (RAGTIME_TEST_KUBECTL)"]
fn needs_kubectl_the_manifests_render_and_agree_with_the_service() {
    let base = render(BASE);
    let r = check_ragtime(BASE, &base);
    assert!(
        of_kind(&base, "StatefulSet").is_empty(),
        "the base runs on an external PostgreSQL"
    );
    // The Dockerfile's image listens where the manifests say.
    let dockerfile =
        std::fs::read_to_string(root().join("deploy/Dockerfile")).expect("deploy/Dockerfile");
    assert!(
        dockerfile
            .lines()
            .any(|l| l.trim() == format!("EXPOSE {}", r.port)),
        "deploy/Dockerfile does not EXPOSE {}",
        r.port
    );
    assert!(
        r.deployment["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .is_some_and(|i| !i.is_empty()),
        "an image"
    );

    // deploy/k8s itself renders the base.
    assert_eq!(render(TOP), base, "deploy/k8s renders deploy/k8s/base");

    // with-postgres: the base, plus one PostgreSQL (with pgvector) that ragtime's URL reaches.
    let pg = render(WITH_POSTGRES);
    let with = check_ragtime(WITH_POSTGRES, &pg);
    let sts = find(&pg, "StatefulSet", "postgres");
    assert_eq!(sts["spec"]["replicas"].as_u64().unwrap_or(1), 1);
    let claims = sts["spec"]["volumeClaimTemplates"]
        .as_array()
        .expect("a volume claim template");
    let claim = claims[0]["metadata"]["name"].as_str().expect("claim name");
    let db = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(db["image"], "pgvector/pgvector:0.8.0-pg17");
    assert!(
        db["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["name"] == claim),
        "postgres keeps its data on the claim"
    );
    let db_env = container_env(&pg, db);
    assert!(
        db["env"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["name"] == "POSTGRES_PASSWORD" && e["valueFrom"]["secretKeyRef"].is_object()),
        "postgres's password comes from a Secret"
    );
    let svc_name = sts["spec"]["serviceName"].as_str().expect("serviceName");
    let svc = find(&pg, "Service", svc_name);
    assert!(
        selects(
            &svc["spec"]["selector"],
            &sts["spec"]["template"]["metadata"]["labels"]
        ),
        "Service {svc_name} picks the postgres pod"
    );
    let (user, password, host, port, name) = url_parts(&with.env["RAGTIME__DATABASE_URL"]);
    assert_eq!(host, svc_name, "the URL names the in-cluster Service");
    assert!(
        svc["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["port"].as_u64() == Some(u64::from(port))),
        "the URL's port {port} is the Service's"
    );
    assert_eq!(Some(&user), db_env.get("POSTGRES_USER"), "user");
    assert_eq!(Some(&password), db_env.get("POSTGRES_PASSWORD"), "password");
    assert_eq!(Some(&name), db_env.get("POSTGRES_DB"), "database");
    // The overlay changes the Secret only, not how ragtime runs.
    assert_eq!(with.container, r.container, "the same ragtime container");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl 1.21 or later (RAGTIME_TEST_KUBECTL)"]
async fn needs_kubectl_the_service_answers_the_probes_and_exports_the_hpa_metrics() {
    let docs = render(BASE);
    let r = check_ragtime(BASE, &docs);
    // Run with the configuration the manifests give, less what a test
    // cannot have: its own port, data folder and fake LLM, and no secrets
    // (`ragtime config` prints them as ***; the store is the test's SQLite).
    let mut effective = r.effective.clone();
    effective["admin_key"] = Value::Null;
    effective["database_url"] = Value::Null;
    effective["llm"]["api_key"] = Value::Null;
    let manifest: ragtime_gateway::Config =
        serde_json::from_value(effective).expect("the effective configuration reads back");
    let app = TestApp::builder()
        .config(move |c| {
            let (addr, grace) = (c.server.addr, c.server.shutdown_grace_s);
            let (data_dir, llm) = (c.data_dir.clone(), c.llm.clone());
            *c = manifest;
            c.server.addr = addr;
            c.server.shutdown_grace_s = grace;
            c.data_dir = data_dir;
            c.llm = llm;
        })
        .spawn()
        .await;

    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let path = r.container[probe]["httpGet"]["path"]
            .as_str()
            .unwrap_or_else(|| panic!("{probe} path"));
        let resp = app.get(path).await;
        assert_eq!(resp.status(), 200, "{probe} {path}");
    }

    // Some traffic first, then the metrics where Prometheus scrapes them.
    let models = app.get("/v1/models").await;
    assert_eq!(models.status(), 200);
    let path = r.deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]
        .as_str()
        .expect("prometheus.io/path");
    let resp = app.get(path).await;
    assert_eq!(resp.status(), 200, "{path}");
    let body = resp.text().await.expect("metrics text");
    let wanted = hpa_pod_metrics(&docs);
    for name in &wanted {
        let exported = body.lines().any(|l| {
            l.strip_prefix(name.as_str())
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        });
        assert!(
            exported,
            "the HPA scales on {name}, which {path} does not export:\n{body}"
        );
    }
    app.shutdown().await.expect("clean shutdown");
}
