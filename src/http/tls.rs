//! HTTPS in process (`FILAMENT_TLS_CERT_FILE`, `FILAMENT_TLS_KEY_FILE`), for deployments
//! without a TLS-terminating load balancer: rustls over aws-lc-rs, HTTP/2 and HTTP/1.1 by ALPN.
//! The certificate is read again when either file changes ([`crate::watched_files`]);
//! new connections get the new one, open ones keep theirs. A replaced pair that does not load
//! is refused with an ERROR and the certificate in force stays.
//!
//! Also the client side of forwarding between replicas when they serve HTTPS
//! ([`forwarding_client_config`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

use crate::watched_files::WatchedFiles;

/// Where the certificate chain and its key are read from.
#[derive(Debug, Clone)]
pub(crate) struct TlsFiles {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

impl TlsFiles {
    /// The certificate chain and key the files hold now.
    fn load(&self) -> Result<CertifiedKey, String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert)
            .and_then(|certs| certs.collect::<Result<_, _>>())
            .map_err(|e| format!("{}: {e}", self.cert.display()))?;
        if chain.is_empty() {
            return Err(format!("{}: no certificate", self.cert.display()));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|e| format!("{}: {e}", self.key.display()))?;
        let signing_key = rustls::crypto::aws_lc_rs::sign::any_supported_type(&key)
            .map_err(|e| format!("{}: {e}", self.key.display()))?;
        let certified = CertifiedKey::new(chain, signing_key);
        certified.keys_match().map_err(|e| format!("the key does not match the certificate: {e}"))?;
        Ok(certified)
    }
}

/// The certificate in force, swapped whole when the files change.
#[derive(Debug)]
pub(crate) struct ReloadingCertificate {
    files: TlsFiles,
    current: ArcSwap<CertifiedKey>,
}

impl ReloadingCertificate {
    /// Loads the files (a start with unusable files fails).
    pub(crate) fn load(files: TlsFiles) -> Result<Arc<Self>, String> {
        let certified = files.load()?;
        Ok(Arc::new(Self { files, current: ArcSwap::from_pointee(certified) }))
    }

    /// The server configuration resolving every handshake to the certificate in force.
    pub(crate) fn server_config(self: &Arc<Self>) -> Arc<rustls::ServerConfig> {
        let resolver: Arc<dyn ResolvesServerCert> = Arc::clone(self) as _;
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("aws-lc-rs supports the default protocol versions")
                .with_no_client_auth()
                .with_cert_resolver(resolver);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// Reloads the certificate when its files change, until `stop`.
    pub(crate) async fn keep_current(self: Arc<Self>, stop: CancellationToken) {
        let mut watched = WatchedFiles::new(vec![self.files.cert.clone(), self.files.key.clone()]);
        loop {
            let changed = tokio::select! {
                () = stop.cancelled() => return,
                changed = watched.next_check() => changed,
            };
            if !changed {
                continue;
            }
            match self.files.load() {
                Ok(certified) => {
                    self.current.store(Arc::new(certified));
                    tracing::info!(cert = %self.files.cert.display(), "tls.certificate_reloaded");
                }
                Err(error) => {
                    crate::telemetry::tls_reload_refused();
                    tracing::error!(%error, "tls.reload_refused: the certificate in force stays");
                }
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The TLS client configuration replicas forward with: the certificates of `ca_file`
/// (`FILAMENT_FORWARD_CA_FILE`) alone when given, else the public web roots.
pub(crate) fn forwarding_client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    // A private CA is trusted alone: a replica's certificate from a public CA, for a name an
    // attacker could get one for, must not pass for one of the fleet's.
    let mut roots = match ca_file {
        Some(_) => rustls::RootCertStore::empty(),
        None => rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() },
    };
    if let Some(path) = ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(format!("{}: no usable CA certificate", path.display()));
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
