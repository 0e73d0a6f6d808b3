//! TLS options shared by the commands that talk to a frontend (`larder feed`, `put`, `get`,
//! `delete`), named as in vespa-feed-client.

use std::path::PathBuf;

use clap::Args;

#[derive(Args, Clone, Debug, Default)]
pub struct ClientTlsArgs {
    /// For an https:// endpoint: PEM file with the CA certificate(s) to trust instead of the
    /// system's (`larder dev --tls` prints its own: <data-dir>/tls/ca.pem).
    #[arg(long, value_name = "FILE")]
    ca_certificates: Option<PathBuf>,
    /// PEM client certificate chain, for endpoints that ask for one (with --private-key).
    #[arg(long, value_name = "FILE", requires = "private_key")]
    certificate: Option<PathBuf>,
    /// PEM private key of --certificate.
    #[arg(long, value_name = "FILE", requires = "certificate")]
    private_key: Option<PathBuf>,
}

impl ClientTlsArgs {
    pub fn settings(&self) -> larder_tls::ClientTls {
        larder_tls::ClientTls {
            ca: self.ca_certificates.clone(),
            identity: self.certificate.clone().zip(self.private_key.clone()),
        }
    }
}
