//! Kubernetes protobuf request bodies end to end: the venv kubectl's typed `create` commands
//! (which send `application/vnd.kubernetes.protobuf`) against the in-process server, read back
//! with `kubectl get -o json`; and raw protobuf POSTs for the kinds kubectl cannot create this way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use apiserver::protobuf::{CONTENT_TYPE, encode, lease};
use apiserver::{ApiServer, Config};
use base64::Engine as _;
use prost::Message as _;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(60);

fn kubectl_path() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/kubectl");
    assert!(path.is_file(), "kubectl not found at {}: run scripts/install-test-deps", path.display());
    path
}

struct Cluster {
    server: ApiServer,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let server = ApiServer::start(Config::new(dir.path().join("data"))).await?;
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig)?;
        Ok(Self { server, kubeconfig, dir })
    }

    /// Run kubectl; its stdout, or an error with its stderr.
    async fn kubectl(&self, args: &[&str]) -> Result<String> {
        Ok(self.kubectl_logged(args).await?.0)
    }

    /// Run kubectl; its stdout and stderr (where `-v` logs go), or an error with both.
    async fn kubectl_logged(&self, args: &[&str]) -> Result<(String, String)> {
        let mut cmd = tokio::process::Command::new(kubectl_path());
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        // Keep kubectl's discovery cache out of the real home.
        cmd.env("HOME", self.dir.path()).kill_on_drop(true);
        let out = tokio::time::timeout(DEADLINE, cmd.output())
            .await
            .with_context(|| format!("kubectl {args:?} timed out"))??;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            bail!("kubectl {args:?} failed ({}): {stderr}{stdout}", out.status);
        }
        Ok((stdout, stderr))
    }

    async fn get(&self, args: &[&str]) -> Result<Value> {
        let mut all = vec!["get", "-o", "json"];
        all.extend_from_slice(args);
        let out = self.kubectl(&all).await?;
        serde_json::from_str(&out).with_context(|| format!("kubectl get {args:?} printed no JSON: {out}"))
    }
}

fn b64(v: &Value) -> Result<Vec<u8>> {
    let s = v.as_str().with_context(|| format!("not a base64 string: {v}"))?;
    Ok(base64::engine::general_purpose::STANDARD.decode(s)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_typed_creates_send_protobuf_and_round_trip() -> Result<()> {
    let c = Cluster::start().await?;

    // create namespace, with --save-config for an annotation in ObjectMeta. -v=8 logs the request
    // headers: this must really be a protobuf body, or the test proves nothing.
    let (out, log) = c.kubectl_logged(&["create", "namespace", "pb", "--save-config", "-v=8"]).await?;
    ensure!(out.contains("namespace/pb created"), "{out}");
    ensure!(log.contains("Content-Type: application/vnd.kubernetes.protobuf"), "kubectl did not send protobuf: {log}");
    let ns = c.get(&["namespace", "pb"]).await?;
    ensure!(ns["status"]["phase"] == "Active", "{ns}");
    let applied = ns["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"].as_str();
    ensure!(applied.is_some_and(|a| a.contains("\"name\":\"pb\"")), "{ns}");
    ensure!(ns["metadata"]["uid"].as_str().is_some_and(|u| !u.is_empty()), "{ns}");

    // create secret generic --from-literal: bytes travel raw, come back base64.
    let out = c
        .kubectl(&[
            "create",
            "secret",
            "generic",
            "creds",
            "-n",
            "pb",
            "--from-literal=user=admin",
            "--from-literal=pass=p@ss w0rd:é",
        ])
        .await?;
    ensure!(out.contains("secret/creds created"), "{out}");
    let secret = c.get(&["secret", "creds", "-n", "pb"]).await?;
    ensure!(b64(&secret["data"]["user"])? == b"admin", "{secret}");
    ensure!(b64(&secret["data"]["pass"])? == "p@ss w0rd:é".as_bytes(), "{secret}");
    ensure!(secret["metadata"]["namespace"] == "pb", "{secret}");

    // create configmap with a literal and a binary file.
    let bin_path = c.dir.path().join("blob.bin");
    let blob = [0u8, 1, 0xff, 0xfe, b'x'];
    std::fs::write(&bin_path, blob)?;
    let from_file = format!("--from-file=blob={}", bin_path.display());
    let out = c.kubectl(&["create", "configmap", "settings", "-n", "pb", "--from-literal=a=b", &from_file]).await?;
    ensure!(out.contains("configmap/settings created"), "{out}");
    let cm = c.get(&["configmap", "settings", "-n", "pb"]).await?;
    ensure!(cm["data"]["a"] == "b", "{cm}");
    ensure!(b64(&cm["binaryData"]["blob"])? == blob, "{cm}");

    // create secret tls from PEM files.
    let key = rcgen::generate_simple_self_signed(vec!["example.com".to_string()])?;
    let (cert_pem, key_pem) = (key.cert.pem(), key.signing_key.serialize_pem());
    let (cert_path, key_path) = (c.dir.path().join("tls.crt"), c.dir.path().join("tls.key"));
    std::fs::write(&cert_path, &cert_pem)?;
    std::fs::write(&key_path, &key_pem)?;
    let (cert_arg, key_arg) = (format!("--cert={}", cert_path.display()), format!("--key={}", key_path.display()));
    let out = c.kubectl(&["create", "secret", "tls", "web-tls", "-n", "pb", &cert_arg, &key_arg]).await?;
    ensure!(out.contains("secret/web-tls created"), "{out}");
    let tls = c.get(&["secret", "web-tls", "-n", "pb"]).await?;
    ensure!(tls["type"] == "kubernetes.io/tls", "{tls}");
    ensure!(b64(&tls["data"]["tls.crt"])? == cert_pem.as_bytes(), "{tls}");
    ensure!(b64(&tls["data"]["tls.key"])? == key_pem.as_bytes(), "{tls}");

    // create service clusterip: ports, IntOrString targetPort, selector and labels.
    let out = c.kubectl(&["create", "service", "clusterip", "web", "-n", "pb", "--tcp=80:8080"]).await?;
    ensure!(out.contains("service/web created"), "{out}");
    let svc = c.get(&["service", "web", "-n", "pb"]).await?;
    ensure!(svc["spec"]["ports"][0]["port"] == 80 && svc["spec"]["ports"][0]["targetPort"] == 8080, "{svc}");
    ensure!(svc["spec"]["type"] == "ClusterIP" && svc["spec"]["selector"]["app"] == "web", "{svc}");
    ensure!(svc["metadata"]["labels"]["app"] == "web", "{svc}");

    // label and annotate go as JSON merge patches.
    let out = c.kubectl(&["label", "namespace", "pb", "team=core"]).await?;
    ensure!(out.contains("namespace/pb labeled"), "{out}");
    let out = c.kubectl(&["annotate", "secret", "creds", "-n", "pb", "note=rotated"]).await?;
    ensure!(out.contains("secret/creds annotated"), "{out}");
    ensure!(c.get(&["namespace", "pb"]).await?["metadata"]["labels"]["team"] == "core");
    let secret = c.get(&["secret", "creds", "-n", "pb"]).await?;
    ensure!(secret["metadata"]["annotations"]["note"] == "rotated", "{secret}");
    ensure!(b64(&secret["data"]["user"])? == b"admin", "the annotate kept the data: {secret}");

    // A second create of the same name is a 409 from the protobuf path as from JSON.
    let dup = c.kubectl(&["create", "namespace", "pb"]).await;
    ensure!(dup.as_ref().is_err_and(|e| e.to_string().contains("AlreadyExists")), "{dup:?}");

    c.server.shutdown().await;
    Ok(())
}

async fn post(client: &kube::Client, path: &str, body: Vec<u8>) -> Result<Value, kube::Error> {
    let req = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, CONTENT_TYPE)
        .header(http::header::ACCEPT, "application/json")
        .body(body)
        .map_err(|e| kube::Error::Service(e.into()))?;
    let text = client.request_text(req).await?;
    Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn status_of(r: Result<Value, kube::Error>) -> Result<(u16, String)> {
    match r {
        Err(kube::Error::Api(s)) => Ok((s.code, s.message)),
        other => bail!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_protobuf_posts_lease_and_errors() -> Result<()> {
    let c = Cluster::start().await?;
    let client = c.server.client().await?;

    // A Lease (coordination.k8s.io/v1) with MicroTimes, as client-go's leader election sends it.
    let body = lease::Lease {
        metadata: Some(apiserver::protobuf::meta::ObjectMeta { name: Some("leader".into()), ..Default::default() }),
        spec: Some(lease::LeaseSpec {
            holder_identity: Some("agent-0".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(apiserver::protobuf::meta::Time { seconds: Some(1_700_000_000), nanos: Some(250_000) }),
            ..Default::default()
        }),
    };
    let path = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let created = post(&client, path, encode("coordination.k8s.io/v1", "Lease", &body.encode_to_vec())).await?;
    ensure!(created["spec"]["holderIdentity"] == "agent-0", "{created}");
    ensure!(created["spec"]["renewTime"] == "2023-11-14T22:13:20.000250Z", "{created}");
    let got = c.get(&["lease", "leader", "-n", "default"]).await?;
    ensure!(got["spec"]["leaseDurationSeconds"] == 15, "{got}");

    // Not protobuf at all: 400 naming the magic.
    let (code, msg) = status_of(post(&client, path, b"{\"kind\":\"Lease\"}".to_vec()).await)?;
    ensure!(code == 400 && msg.contains("k8s\\0"), "{code} {msg}");

    // Truncated object message: 400 naming the kind.
    let (code, msg) = status_of(post(&client, path, encode("coordination.k8s.io/v1", "Lease", &[0x0a, 0x09])).await)?;
    ensure!(code == 400 && msg.contains("Lease"), "{code} {msg}");

    // A kind not decoded from protobuf: 415 asking for JSON.
    let pods = "/api/v1/namespaces/default/pods";
    let (code, msg) = status_of(post(&client, pods, encode("v1", "Pod", &[])).await)?;
    ensure!(code == 415 && msg.contains("application/json"), "{code} {msg}");

    // The envelope's kind must still match the URL, as for JSON.
    let (code, msg) = status_of(post(&client, path, encode("v1", "Secret", &[0x0a, 0x03, 0x0a, 0x01, b's'])).await)?;
    ensure!(code == 400, "{code} {msg}");

    c.server.shutdown().await;
    Ok(())
}

mod properties {
    use std::collections::BTreeMap;

    use apiserver::protobuf::config::Secret;
    use apiserver::protobuf::meta::ObjectMeta;
    use apiserver::protobuf::{MAGIC, SUPPORTED, decode, encode};
    use base64::Engine as _;
    use proptest::prelude::*;
    use prost::Message as _;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary bytes as the body, as the envelope and as each kind's object message:
        /// an object with object metadata, or a 400/415, never a panic.
        #[test]
        fn arbitrary_bytes_decode_or_fail_cleanly(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut bodies = vec![raw.clone(), [MAGIC.as_slice(), &raw].concat()];
            bodies.extend(SUPPORTED.iter().map(|(a, k)| encode(a, k, &raw)));
            for body in bodies {
                match decode(&body) {
                    Ok(v) => prop_assert!(v["metadata"].is_object(), "{}", v),
                    Err(e) => prop_assert!(e.code == 400 || e.code == 415, "{}", e),
                }
            }
        }

        /// Secret data survives as base64 of the exact bytes; labels and names as sent.
        #[test]
        fn secret_round_trip(
            name in "[a-z][a-z0-9-]{0,20}",
            labels in proptest::collection::btree_map("[a-z]{1,8}", "[a-z0-9]{0,8}", 0..4),
            data in proptest::collection::btree_map("[A-Za-z0-9._-]{1,12}", proptest::collection::vec(any::<u8>(), 0..64), 0..4),
        ) {
            let secret = Secret {
                metadata: Some(ObjectMeta { name: Some(name.clone()), labels: labels.clone(), ..Default::default() }),
                data: data.clone(),
                ..Default::default()
            };
            let v = decode(&encode("v1", "Secret", &secret.encode_to_vec())).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(v["metadata"]["name"].as_str(), Some(name.as_str()));
            let got_labels: BTreeMap<String, String> =
                serde_json::from_value(v["metadata"].get("labels").cloned().unwrap_or_default()).unwrap_or_default();
            prop_assert_eq!(got_labels, labels);
            let b64 = base64::engine::general_purpose::STANDARD;
            for (k, bytes) in &data {
                let s = v["data"][k].as_str().unwrap_or_default();
                prop_assert_eq!(&b64.decode(s).map_err(|e| TestCaseError::fail(e.to_string()))?, bytes);
            }
        }
    }
}
