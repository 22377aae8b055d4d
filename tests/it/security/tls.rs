//! HTTPS in process (issue 23, item 6): certificates made in the test (rcgen), a CA the client
//! trusts, the gateway serving its leaf; a replaced certificate is served to new connections
//! without a restart, and replicas forward to each other over HTTPS.

use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::arrow::{ids, ipc_stream};
use crate::support::{GatewayOptions, eventually, random_suffix};

/// A CA and the leaves it signs.
struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl TestCa {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "filament test CA");
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Self { issuer: Issuer::new(params, key), pem }
    }

    /// A leaf for 127.0.0.1 named `common_name`: (certificate PEM, key PEM).
    fn leaf(&self, common_name: &str) -> (String, String) {
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, common_name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Certificate files a gateway serves, replaceable in place (written aside, then renamed).
struct CertFiles {
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

impl CertFiles {
    fn new((cert_pem, key_pem): (String, String)) -> Self {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let suffix = random_suffix();
        let files = Self { cert: dir.join(format!("tls-{suffix}.crt")), key: dir.join(format!("tls-{suffix}.key")) };
        files.replace((cert_pem, key_pem));
        files
    }

    fn replace(&self, (cert_pem, key_pem): (String, String)) {
        for (path, text) in [(&self.key, key_pem), (&self.cert, cert_pem)] {
            let aside = path.with_extension("new");
            std::fs::write(&aside, text).unwrap();
            std::fs::rename(&aside, path).unwrap();
        }
    }

    fn env(&self) -> [(&'static str, String); 2] {
        [
            ("FILAMENT_TLS_CERT_FILE", self.cert.display().to_string()),
            ("FILAMENT_TLS_KEY_FILE", self.key.display().to_string()),
        ]
    }
}

/// The common name of the certificate `address` serves to a new connection.
async fn served_common_name(address: &str, ca_pem: &str) -> String {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    let (_, session) = tls.get_ref();
    let leaf = session.peer_certificates().unwrap()[0].clone();
    // The common name's value follows its OID (2.5.4.3) in the DER: enough for a test.
    let der = leaf.as_ref();
    let oid = [0x55, 0x04, 0x03];
    let at = der.windows(3).rposition(|w| w == oid).expect("a common name");
    let length = der[at + 4] as usize;
    String::from_utf8_lossy(&der[at + 5..at + 5 + length]).into_owned()
}

fn client_trusting(ca_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn https_is_served_and_a_replaced_certificate_reaches_new_connections_without_a_restart() {
    let ca = TestCa::new();
    let files = CertFiles::new(ca.leaf("first"));
    let mut options = GatewayOptions::new().trusting_ca(&ca.pem);
    for (name, value) in files.env() {
        options = options.env(name, &value);
    }
    let gw = options.spawn().await;
    let address = gw.base_url.strip_prefix("https://").expect("the gateway announces https").to_string();
    let client = client_trusting(&ca.pem);
    let answer = client.get(gw.url("/v1/runs/nope")).bearer_auth(&gw.token).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::NOT_FOUND, "served over HTTPS");
    assert_eq!(served_common_name(&address, &ca.pem).await, "first");
    files.replace(ca.leaf("second"));
    eventually(Duration::from_secs(15), "new connections to get the replaced certificate", || async {
        (served_common_name(&address, &ca.pem).await == "second").then_some(())
    })
    .await;
    let plain = reqwest::Client::new().get(format!("http://{address}/healthz")).send().await;
    assert!(plain.map(|r| !r.status().is_success()).unwrap_or(true), "no plain HTTP on the TLS port");
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_serving_https_forward_to_each_other_over_https() {
    let ca = TestCa::new();
    let files = CertFiles::new(ca.leaf("replica"));
    let ca_file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ca-{}.pem", random_suffix()));
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let mut options =
        GatewayOptions::new().trusting_ca(&ca.pem).env("FILAMENT_FORWARD_CA_FILE", &ca_file.display().to_string());
    for (name, value) in files.env() {
        options = options.env(name, &value);
    }
    let first = options.clone().spawn().await;
    let second = options.database_url(&first.database_url).env("FILAMENT_API_TOKENS", &first.token).spawn().await;
    let client = client_trusting(&ca.pem);
    let send = |base: &str, method: Method, path: &str, body: Option<serde_json::Value>| {
        let mut request = client.request(method, format!("{base}{path}")).bearer_auth(&first.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        request.send()
    };
    let run = json!({"run_id": "r", "destination": {"project": "filament-demo", "dataset": first.dataset}});
    assert_eq!(send(&first.base_url, Method::POST, "/v1/runs", Some(run)).await.unwrap().status(), StatusCode::CREATED);
    let declared =
        send(&first.base_url, Method::PUT, "/v1/runs/r/resources/t", Some(json!({"write_mode": "full_append"})));
    assert_eq!(declared.await.unwrap().status(), StatusCode::OK);
    let opened = send(&first.base_url, Method::POST, "/v1/runs/r/executions", Some(json!({"execution_id": "e"})));
    assert_eq!(opened.await.unwrap().status(), StatusCode::CREATED);
    // The second replica does not serve the execution: it forwards the batch to the first.
    let batch = client
        .post(second.url("/v1/runs/r/executions/e/resources/t/batches?seq=0"))
        .bearer_auth(&first.token)
        .header("content-type", "application/vnd.apache.arrow.stream")
        .body(ipc_stream(&[ids(0..10)]))
        .send()
        .await
        .unwrap();
    let status = batch.status();
    assert_eq!(status, StatusCode::ACCEPTED, "{}", batch.text().await.unwrap());
    assert_eq!(second.metric("filament_requests_forwarded_total").await, Some(1.0), "forwarded, over HTTPS");
}
