//! `larder dev --tls`: a throwaway CA and the certificates a local cluster needs, made with rcgen.
//! Nothing here is for production: the CA key is not even kept.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Where the generated files are, relative to the data directory.
#[derive(Clone)]
pub struct DevCerts {
    pub ca: PathBuf,
    /// The public HTTPS port's certificate (localhost, 127.0.0.1, ::1).
    pub frontend: (PathBuf, PathBuf),
    /// What the frontend presents to storage nodes.
    pub frontend_client: (PathBuf, PathBuf),
    /// What storage nodes present (their IP addresses), as servers and, replicating from their
    /// peers, as clients.
    pub storage: (PathBuf, PathBuf),
}

impl DevCerts {
    fn in_dir(dir: &str) -> DevCerts {
        let pair = |name: &str| {
            (
                PathBuf::from(format!("{dir}/{name}.pem")),
                PathBuf::from(format!("{dir}/{name}-key.pem")),
            )
        };
        DevCerts {
            ca: PathBuf::from(format!("{dir}/ca.pem")),
            frontend: pair("frontend"),
            frontend_client: pair("frontend-client"),
            storage: pair("storage"),
        }
    }
}

/// Generates the certificates under `data_dir/tls/` unless they are all there already (so a
/// client that trusted the CA once keeps trusting it across restarts).
pub fn ensure(data_dir: &Path, storage_ips: &[IpAddr]) -> anyhow::Result<DevCerts> {
    let certs = DevCerts::in_dir("tls");
    let all = [
        &certs.ca,
        &certs.frontend.0,
        &certs.frontend.1,
        &certs.frontend_client.0,
        &certs.frontend_client.1,
        &certs.storage.0,
        &certs.storage.1,
    ];
    if all.iter().all(|p| data_dir.join(p).exists()) {
        return Ok(certs);
    }
    std::fs::create_dir_all(data_dir.join("tls"))?;
    let (ca_pem, issuer) = ca()?;
    std::fs::write(data_dir.join(&certs.ca), ca_pem)?;
    let local = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
    let server = [ExtendedKeyUsagePurpose::ServerAuth];
    let client = [ExtendedKeyUsagePurpose::ClientAuth];
    let mut storage_names: Vec<String> = storage_ips.iter().map(IpAddr::to_string).collect();
    storage_names.sort();
    storage_names.dedup();
    write_leaf(data_dir, &certs.frontend, &issuer, local, &server)?;
    write_leaf(
        data_dir,
        &certs.frontend_client,
        &issuer,
        vec!["larder-frontend".into()],
        &client,
    )?;
    let both = [
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    write_leaf(data_dir, &certs.storage, &issuer, storage_names, &both)?;
    Ok(certs)
}

fn ca() -> anyhow::Result<(String, Issuer<'static, KeyPair>)> {
    let key = KeyPair::generate().context("generating the dev CA key")?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
        .distinguished_name
        .push(DnType::CommonName, "Larder dev CA (throwaway)");
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), Issuer::new(params, key)))
}

fn write_leaf(
    data_dir: &Path,
    (cert_path, key_path): &(PathBuf, PathBuf),
    issuer: &Issuer<'static, KeyPair>,
    names: Vec<String>,
    usages: &[ExtendedKeyUsagePurpose],
) -> anyhow::Result<()> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.clone())?;
    params
        .distinguished_name
        .push(DnType::CommonName, names[0].clone());
    params.extended_key_usages = usages.to_vec();
    let cert = params.signed_by(&key, issuer)?;
    std::fs::write(data_dir.join(cert_path), cert.pem())?;
    write_private(&data_dir.join(key_path), &key.serialize_pem())
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    Ok(())
}
